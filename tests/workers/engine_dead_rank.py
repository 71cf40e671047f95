"""A rank that ends or hangs in the middle of training through ``dist.to_static``:
``engine_dead_rank.py SCHEDULE exit|hang OUT_DIR`` on two processes started WITHOUT the
launcher (which would stop the survivor as soon as the other ends, before it could say
anything).

Rank 1 ends abruptly (``os._exit``), or stops responding, at the start of step 1.  Rank 0
writes the first line of what its step raised to ``OUT_DIR/rank0.txt``: pipesplit's report
(the rank, the step, the comm job and micro-batch it was in, the peer), not Paddle's bare
``std::exception``.  A hanging rank 1 ends once that report is written.
"""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import auto_parallel_pipeline as example  # noqa: E402

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from pipesplit.passes import cpu_support  # noqa: E402
from pipesplit.passes import strategy as pipesplit_strategy  # noqa: E402


def main() -> int:
    schedule, fault, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_parallel_env()
    pipesplit_strategy.enable_strategy()
    cpu_support.enable()
    rank, world = dist.get_rank(), dist.get_world_size()
    args = example.parse_args(["--schedule", schedule, "-m", "4", "--steps", "3"])
    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(world)]
    model = example.build(args, [meshes[i * world // args.layers] for i in range(args.layers)])
    opt = example.make_optimizer(args, model.parameters())
    data = example.TokenData(args.steps * args.batch, args.seq, args.vocab, args.seed)
    loader = paddle.io.DataLoader(data, batch_size=args.batch, shuffle=False)
    dist_model = dist.to_static(model, loader, example.lm_loss, opt, example.make_strategy(args))
    dist_model.train()
    try:
        for step, (x, y) in enumerate(loader()):
            if rank == 1 and step == 1:
                while fault == "hang" and not (out / "rank0.txt").exists():
                    time.sleep(0.5)
                os._exit(1)
            dist_model(x, y)
    except Exception as e:  # noqa: BLE001 (what it says is the result)
        (out / f"rank{rank}.txt").write_text(f"{type(e).__name__}: {str(e).splitlines()[0]}\n")
        return 1
    (out / f"rank{rank}.txt").write_text("trained\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
