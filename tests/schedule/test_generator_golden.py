"""Every textbook generator still produces, job for job, the lists it produced before the
generators were rewritten as literal phases (issue 12).

``tests/data/generator_golden.json.gz`` holds, per registered schedule (the searched ``auto`` /
``autoV`` aside: they are not textbook figures), every (pp, vpp, m) of the grid pp 1..5,
vpp 1..3, m 1..12, VPP also with ``group_size = pp + 1``: each rank's actions in short form, or
the ValueError text where the generator refuses the configuration.  Rewrite it only on purpose:

    python tests/schedule/test_generator_golden.py --write
"""
import gzip
import json
import os
import sys

from pipesplit.job_list import build_schedule
from pipesplit.job_list.registry import schedule_names

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                      "generator_golden.json.gz")  # (also run as a script: --write)
SEARCHED = ("auto", "autoV")
PP_RANGE = range(1, 6)
VPP_RANGE = range(1, 4)
M_RANGE = range(1, 13)


def configurations():
    """(key, name, pp, vpp, m, options) over the grid, in a fixed order."""
    for name in schedule_names():
        if name in SEARCHED:
            continue
        for pp in PP_RANGE:
            for vpp in VPP_RANGE:
                for m in M_RANGE:
                    yield f"{name} pp={pp} vpp={vpp} m={m}", name, pp, vpp, m, {}
                    if name == "VPP":
                        yield (f"{name} pp={pp} vpp={vpp} m={m} group_size={pp + 1}", name, pp, vpp, m,
                               {"group_size": pp + 1})


def produced_lists() -> dict:
    """What the generators produce now: key -> per-rank action strings, or the refusal text."""
    lists = {}
    for key, name, pp, vpp, m, options in configurations():
        try:
            schedule = build_schedule(name, pp, vpp, m, **options)
        except ValueError as error:
            lists[key] = f"ValueError: {error}"
            continue
        lists[key] = [" ".join(str(action) for action in schedule.actions(rank)) for rank in range(pp)]
    return lists


def test_every_generator_produces_the_golden_lists():
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as f:
        golden = json.load(f)
    produced = produced_lists()
    assert sorted(produced) == sorted(golden)
    differing = [key for key in golden if produced[key] != golden[key]]
    assert differing == [], f"{len(differing)} configurations differ, first: {differing[:5]}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    text = json.dumps(produced_lists(), separators=(",", ":"), sort_keys=True)
    with open(GOLDEN, "wb") as f:  # mtime 0: the same lists give the same bytes
        f.write(gzip.compress(text.encode("utf-8"), mtime=0))
    print(f"wrote {GOLDEN}")
