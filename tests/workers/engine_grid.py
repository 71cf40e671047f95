"""Run several configurations of ``examples/auto_parallel_pipeline.py`` in ONE launch (starting
Paddle and the engine's processes costs seconds): ``engine_grid.py CONFIGS.json OUT_DIR``, where
CONFIGS.json is a list of ``[tag, [example arguments ...]]``; each writes ``OUT_DIR/<tag>.json``.
"""
import json
import os
import sys
from pathlib import Path

import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import auto_parallel_pipeline as example  # noqa: E402


def main() -> int:
    if "--no-fleet" in sys.argv:  # DistModel calls fleet.init (a dozen more gloo groups, slow
        # and fragile with more than two CPU processes) when it sees the launcher's POD_NAME
        sys.argv.remove("--no-fleet")
        os.environ.pop("POD_NAME", None)
    configs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    for tag, argv in configs:
        # fresh names and a fresh scope for each model, as in a new process
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            example.main(list(argv) + ["--tag", tag, "--json", str(out / f"{tag}.json")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
