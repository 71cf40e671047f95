"""Program-side names every part of :mod:`pipesplit.ir_utils` (and the passes) agrees on.

* **Op roles**: the ints Paddle keeps in ``op.op_role`` (0 forward, 1 backward, 2 optimize).
  Named ``ROLE_*`` so they cannot be confused with the job kinds of
  :mod:`pipesplit.job_list.ir` (``FORWARD = "forward"`` ...), which are strings.
* **Op attributes and value names** pipesplit writes into a program: the W-op marker, the
  handoff and gradient-accumulation names.

Job kinds and job types (``send_forward3``) are :mod:`pipesplit.job_list.ir`'s
(``COMM_KINDS``, ``job_type``); ir_utils imports them from there.
"""
from __future__ import annotations

#: ``op.op_role`` values (Paddle's OpRole: Forward, Backward, Optimize)
ROLE_FORWARD, ROLE_BACKWARD, ROLE_OPTIMIZE = 0, 1, 2

#: bool attribute on the backward ops that compute weight gradients (the W half of a split
#: backward); set by :mod:`.split_backward`, read by the extraction and accumulation
BACKWARD_W_ATTR = "pipesplit_backward_w"

#: name prefix of the values one sub-program hands to another in the one-process plan
HANDOFF_PREFIX = "pipesplit_handoff_"
#: suffix of a parameter's gradient accumulator; prefix of a chunk's micro-batch counter
ACC_SUFFIX = "@PS_ACC"
COUNT_PREFIX = "pipesplit_acc_count_"
