"""pipesplit's best schedule is never slower than PyTorch's / Paddle's best, within their peak.

Uses the committed reference orders in tools/bench/reference_orders/ (no torch needed)."""
import os

import pytest

from pipesplit.tools.bench import bench_frameworks as bf


def test_reference_orders_present():
    for framework in bf.FRAMEWORKS:
        folder = os.path.join(bf.REFERENCE_DIR, framework)
        assert len([f for f in os.listdir(folder) if f.endswith(".csv")]) > 100


def test_reference_orders_load_and_mostly_run():
    costs = bf.COST_MODELS[0][1]
    refs = [bf.measure_reference(path, name, 4, 2, 8, costs)
            for name, path in bf.reference_files("torch", 4, 2, 8, "1-2-1-1").items()]
    assert {r.name for r in refs} >= {"Interleaved1F1B", "InterleavedZeroBubble", "LoopedBFS",
                                      "ZBVZeroBubble", "DualPipeV"}
    assert all(not r.error for r in refs)
    # Paddle's VPP order deadlocks at pp=4, vpp=4, m=5 (a micro-batch group shorter than pp)
    vpp = bf.measure_reference(bf.reference_files("paddle", 4, 4, 5, "1-2-1-1")["VPP"], "VPP",
                               4, 4, 5, costs)
    assert vpp.error.startswith("deadlock")


@pytest.fixture(scope="module")
def summary():
    with open(os.devnull, "w") as sink:
        return bf.run(always_auto=False, out=sink)


@pytest.mark.slow
@pytest.mark.parametrize("framework", bf.FRAMEWORKS)
def test_pipesplit_never_slower_than_framework(summary, framework):
    for (fw, label), stats in summary.items():
        if fw != framework:
            continue
        assert stats["loss"] == 0, [r for r in stats["rows"] if r[-1] == "loss"]
        for pp, vpp, m, ref, ours, verdict in stats["rows"]:
            assert ours.peak <= ref.peak + 1e-9, (pp, vpp, m, ref, ours)
            assert ours.makespan <= ref.makespan + 1e-9, (pp, vpp, m, ref, ours)
        assert stats["win"] + stats["tie"] + stats["none"] == 45
