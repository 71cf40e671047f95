"""``fleet.init`` the way PaddleFormers' ``TrainingArguments`` calls it under
``enable_auto_parallel=True`` (a global mesh, then dp x pp hybrid groups, order
``sharding_first``), on four CPU processes with ``cpu_support.enable()`` called first, as a
user does before the trainer builds anything.

``fleet_hybrid_groups.py OUT_DIR [ROUNDS]``: each rank sums ``rank + 1`` over every hybrid
group it belongs to (and over a group created afterwards with ``dist.new_group``), ROUNDS times,
and writes ``OUT_DIR/rank<R>.json``: ``{group name: [group ranks, [sum of each round]]}``.
"""
import json
import sys
from pathlib import Path

from pipesplit.passes import cpu_support

cpu_support.enable()  # before the trainer builds anything

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
from paddle.distributed import fleet  # noqa: E402


def fleet_init_as_the_trainer_does(dp: int, pp: int) -> None:
    """``TrainingArguments.__post_init__`` (PaddleFormers 0.4.0, auto parallel,
    ``hybrid_parallel_topo_order="sharding_first"``)."""
    fleet.auto.create_mesh([("dp", dp), ("pp", pp), ("mp", 1)])
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": 1, "pp_degree": pp,
                               "order": ["dp", "sharding", "pp", "sep", "mp"]}
    fleet.init(is_collective=True, strategy=strategy)


def sums(group, rounds: int) -> list:
    out = []
    for _ in range(rounds):
        x = paddle.to_tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(x, group=group)
        out.append(float(x.numpy()[0]))
    return out


def main() -> int:
    out_dir = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    fleet_init_as_the_trainer_does(dp=2, pp=2)
    hcg = fleet.get_hybrid_communicate_group()
    groups = {"dp": hcg.get_data_parallel_group(), "pp": hcg.get_pipe_parallel_group(),
              "check": hcg.get_check_parallel_group()}
    later = dist.new_group([1, 2])  # every rank calls it; ranks 0 and 3 are not members
    if dist.get_rank() in (1, 2):
        groups["later_1_2"] = later
    result = {name: [list(g.ranks), sums(g, rounds)] for name, g in groups.items()}
    result["world"] = [list(range(dist.get_world_size())), sums(None, rounds)]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
