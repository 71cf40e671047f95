"""Build the CUDA (NCCL) plans of ``examples/llama_auto_parallel.py`` on a CPU build, several
configurations in ONE launch, and describe them (nothing runs).

``llama_gpu_structure.py CONFIGS.json OUT_DIR``: CONFIGS.json lists ``[tag, [example arguments]]``;
every rank goes through ``dist.to_static`` up to the engine's pipeline pass, builds its plan with
the NCCL transport (``transport_for("gpu")``), agrees on the ring ids with the other ranks as
the engine's ``_init_comm`` would (the groups as made are recorded too) and writes
``OUT_DIR/<tag>.rank<r>.json``: its pipeline (processes by pipeline rank), the job order and, per program, every collective / p2p
op (ring, its processes, peer, stream, events) and the event edges of compute ops.
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import llama_auto_parallel as example  # noqa: E402

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
from paddle.distributed.auto_parallel.static import engine as paddle_engine  # noqa: E402

from pipesplit.passes import strategy as pipesplit_strategy  # noqa: E402
from pipesplit.passes.engine.session import session_of  # noqa: E402
from pipesplit.passes.engine.engine_rank import build_engine_rank_plan  # noqa: E402
from pipesplit.passes.transport.devices import transport_for  # noqa: E402
from pipesplit.passes.transport.rings import agree_on_rings, held_groups  # noqa: E402
from _structure import describe  # noqa: E402

class Built(Exception):
    """The plan is written; the configuration ends here (a CPU build cannot run NCCL)."""


def main() -> int:
    configs = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    os.environ.pop("POD_NAME", None)  # no fleet.init: the engine does not need it
    tag = [None]

    def nccl_pass(mains, starts, pipeline_strategy):
        config = pipesplit_strategy.config_from_strategy(pipeline_strategy)
        pipe = pipesplit_strategy.pipe_from_strategy(pipeline_strategy)
        transport = transport_for("gpu")
        built = build_engine_rank_plan(mains[0], config, transport, pipe,
                                       shared=session_of(pipeline_strategy).shared_parameters)
        # what the engine's _init_comm does before it makes the communicators
        made = [[ring, list(ranks)] for ring, ranks, _ in held_groups()]
        agree_on_rings(list(built.split.programs.values()), transport.share)
        record = {"rank": dist.get_rank(), "pp_rank": config.pp_stage,
                  "pipe": list(pipe.processes), "schedule": built.schedule.name,
                  "pp": config.pp_degree, "vpp": config.vpp_degree,
                  "job_order": built.job_order, "rings_as_made": made,
                  "programs": {t: describe(p) for t, p in built.split.programs.items()}}
        (out_dir / f"{tag[0]}.rank{dist.get_rank()}.json").write_text(json.dumps(record))
        raise Built()

    original_enable = pipesplit_strategy.enable_strategy

    def enable():
        original_enable()
        paddle_engine.pipeline_pass = nccl_pass

    pipesplit_strategy.enable_strategy = enable
    rank, world = None, None
    for tag[0], argv in configs:
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            try:
                example.main(list(argv) + ["--tag", tag[0]])
            except Built:
                paddle.disable_static()  # the engine stopped in static mode
        rank, world = dist.get_rank(), dist.get_world_size()
        example.exchange(rank, world, {}, key=f"{tag[0]}/structure")
    store = paddle.base.core.create_or_get_global_tcp_store()
    store.set(f"structure/leaving/{rank}", b"1")
    if rank == 0:  # rank 0 hosts the store: leave last
        for r in range(world):
            store.get(f"structure/leaving/{r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
