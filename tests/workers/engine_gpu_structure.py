"""Build the CUDA (NCCL) variant of pipesplit's engine plans on a CPU build and describe them.

Run under ``paddle.distributed.launch --nproc_per_node P``: every rank trains nothing; it builds
``examples/auto_parallel_pipeline.py``'s model through ``dist.to_static`` up to the engine's
pipeline pass, builds its plan with the NCCL transport (``transport_for("gpu")``) and writes
``OUT_DIR/rank<r>.json``: the job order and, per program, its p2p ops (ring, peer, stream,
events) and the compute ops' event edges.  Usage: ``engine_gpu_structure.py OUT_DIR <example
arguments>``.
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import auto_parallel_pipeline as example  # noqa: E402

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
from paddle.distributed.auto_parallel.static import engine as paddle_engine  # noqa: E402

from pipesplit.passes import strategy as pipesplit_strategy  # noqa: E402
from pipesplit.passes.engine.engine_rank import build_engine_rank_plan  # noqa: E402
from pipesplit.passes.transport.devices import transport_for  # noqa: E402
from _structure import describe  # noqa: E402


def main() -> int:
    out_dir = Path(sys.argv[1])
    # DistModel calls fleet.init (a dozen more gloo groups, slow and fragile with four CPU
    # processes) when it sees the launcher's POD_NAME; the engine does not need it
    os.environ.pop("POD_NAME", None)

    def nccl_pass(mains, starts, pipeline_strategy):
        config = pipesplit_strategy.config_from_strategy(pipeline_strategy)
        built = build_engine_rank_plan(mains[0], config, transport_for("gpu"))
        record = {"rank": dist.get_rank(), "schedule": built.schedule.name,
                  "pp": config.pp_degree, "vpp": config.vpp_degree,
                  "job_order": built.job_order,
                  "programs": {t: describe(p) for t, p in built.split.programs.items()}}
        (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
        rank, world = dist.get_rank(), dist.get_world_size()
        example.exchange(rank, world, {}, key="structure/written")
        store = paddle.base.core.create_or_get_global_tcp_store()
        store.set(f"structure/leaving/{rank}", b"1")
        if rank == 0:  # rank 0 hosts the store: leave last
            for r in range(world):
                store.get(f"structure/leaving/{r}")
        os._exit(0)  # a CPU build cannot run NCCL programs: the structure is what is checked

    original_enable = pipesplit_strategy.enable_strategy

    def enable():
        original_enable()
        paddle_engine.pipeline_pass = nccl_pass

    pipesplit_strategy.enable_strategy = enable
    return example.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
