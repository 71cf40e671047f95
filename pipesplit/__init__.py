"""pipesplit: pipeline-parallel schedules and PIR program splitting for PaddlePaddle static graphs.

The sub-packages live in their own folders of the repository (``setup.py``'s ``package_dir``):
:mod:`pipesplit.job_list` (schedules, pure Python), :mod:`pipesplit.ir_utils`,
:mod:`pipesplit.passes` (Paddle) and :mod:`pipesplit.tools` (command line, benchmarks).
Importing ``pipesplit`` itself imports none of them.
"""

__version__ = "0.1.0"

# In a source checkout this folder is found first when the repository root is on sys.path
# (``python -m pytest`` from the root, a script run there), shadowing the installed package;
# the sub-packages are then the repository's own folders beside it.
import os as _os

_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "setup.py")) and \
        _os.path.isdir(_os.path.join(_checkout, "job_list")):
    __path__.append(_checkout)
del _os, _checkout
