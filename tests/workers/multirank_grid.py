"""Worker of the multi-process grids (``test_multirank``, ``test_multirank_wide``): every
``tools/train.py`` configuration of a JSON list, in one launch; each config's record and
parameters go to ``OUT/cfg<i>.json`` / ``.npz``.  Usage: ``multirank_grid.py SPEC OUT``."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _worker(spec_path, out_dir):
    """Run every config of ``spec_path`` in this process group (one launch for the grid)."""
    import paddle.distributed as dist

    from pipesplit.tools.train import make_parser, run

    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    for i, argv in enumerate(json.loads(open(spec_path).read())):
        args = make_parser().parse_args(argv)
        args.pp = world
        record = run(args, rank, world, tag=f"cfg{i}")
        if record is not None:
            params = record.pop("params")
            np.savez(os.path.join(out_dir, f"cfg{i}.npz"), **params)
            with open(os.path.join(out_dir, f"cfg{i}.json"), "w") as f:
                json.dump(record, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    _worker(sys.argv[1], sys.argv[2])
