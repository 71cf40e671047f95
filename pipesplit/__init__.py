"""pipesplit: pipeline-parallel schedules and PIR program splitting for PaddlePaddle static graphs.

The sub-packages live in their own folders of the repository (``setup.py``'s ``package_dir``):
:mod:`pipesplit.job_list` (schedules, pure Python), :mod:`pipesplit.ir_utils`,
:mod:`pipesplit.passes` (Paddle) and :mod:`pipesplit.tools` (command line, benchmarks).
Importing ``pipesplit`` itself imports none of them.
"""

__version__ = "0.1.0"
