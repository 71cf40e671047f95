"""The start-up of a launch and nothing else (tests/helpers/_ledger.py): import Paddle, join
the group as every worker of the suite does, leave."""
import paddle.distributed as dist

dist.init_parallel_env()
