"""pipesplit.job_list — the job IR, placements, schedule generators, validator, simulator,
comm lowering and views.  Pure Python: imports nothing from paddle."""
from .ir import (Action, Job, Schedule, KINDS, COMPUTE_KINDS, COMM_KINDS, FORWARD, BACKWARD,
                 BACKWARD_B, BACKWARD_W, SEND_FORWARD, RECV_FORWARD, SEND_BACKWARD, RECV_BACKWARD,
                 OPTIMIZER)
from .placement import LOOPED, V_SHAPE, Placement
from .registry import build_schedule, get_spec, register_schedule, schedule_names, serves
from .bounds import lower_bound
from .costs import Costs
from .simulate import SimResult, simulate
from .validate import ScheduleError, validate
from . import classic  # registers FThenB/GPipe, 1F1B, Eager1F1B, VPP/Interleaved1F1B, LoopedBFS
from .lower import global_order, lower_comm, peer_of
from . import zero_bubble, dualpipe, auto
