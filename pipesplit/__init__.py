"""pipesplit: pipeline-parallel schedules and PIR program splitting for PaddlePaddle static graphs.

The sub-packages live in their own folders of the repository: :mod:`pipesplit.job_list`
(schedules, pure Python), :mod:`pipesplit.ir_utils`, :mod:`pipesplit.passes` (Paddle) and
:mod:`pipesplit.tools` (command line, benchmarks).  An installation copies them into the
package (``setup.py``'s ``package_dir``); in a checkout ``pipesplit/`` holds a symbolic link to
each, so both import the same modules.  Importing ``pipesplit`` itself imports none of them.
"""

__version__ = "0.1.0"
