"""Run several configurations of ``examples/llama_auto_parallel.py`` in ONE launch (starting
Paddle and the engine's processes costs seconds): ``llama_grid.py CONFIGS.json OUT_DIR
[--no-fleet] [--keep-going] [--compare-chunks]``, where CONFIGS.json is a list of ``[tag,
[example arguments ...]]``; each writes ``OUT_DIR/<tag>.json``.  With ``--keep-going`` a
configuration that raises writes ``OUT_DIR/<tag>.error`` (its last exception line) and the next
one runs (every rank must fail alike, or the ranks fall out of step).  With
``--compare-chunks`` each chunk completion (vpp >= 2) is checked against Paddle's own
(``_paddle_completion``), the ops compared written to ``OUT_DIR/<tag>.r<rank>.chunks``.
"""
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

import paddle

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
import llama_auto_parallel as example  # noqa: E402
from _paddle_completion import compared_with_paddle  # noqa: E402


def main() -> int:
    if "--no-fleet" in sys.argv:  # DistModel calls fleet.init (a dozen more gloo groups, slow
        # and fragile with more than two CPU processes) when it sees the launcher's POD_NAME
        sys.argv.remove("--no-fleet")
        os.environ.pop("POD_NAME", None)
    keep_going = "--keep-going" in sys.argv
    if keep_going:
        sys.argv.remove("--keep-going")
    compare_chunks = "--compare-chunks" in sys.argv
    if compare_chunks:
        sys.argv.remove("--compare-chunks")
    configs = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    running = [None]
    with (compared_with_paddle(out, lambda: running[0], paddle.distributed.get_rank())
          if compare_chunks else contextlib.nullcontext()):
        failed = _run(configs, out, keep_going, running)
    return 1 if failed else 0


def _run(configs, out, keep_going, running) -> int:
    failed = 0
    for tag, argv in configs:
        running[0] = tag
        # fresh names and a fresh scope for each model, as in a new process
        with paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
            try:
                example.main(list(argv) + ["--tag", tag, "--json", str(out / f"{tag}.json")])
            except Exception as e:  # noqa: BLE001
                if not keep_going:
                    raise
                failed += 1
                traceback.print_exc()
                line = f"{type(e).__name__}: {e}".splitlines()[0]
                (out / f"{tag}.error").write_text(line + "\n")
    return failed


if __name__ == "__main__":
    sys.exit(main())
