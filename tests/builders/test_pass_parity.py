"""Numerical parity: every registered schedule, run as a Paddle plan with all ranks emulated in
one process, gives the per-micro-batch losses and final parameters of unsplit full-batch
training (fp32, within 1e-6)."""
import os

import pytest

from pipesplit.job_list import schedule_names, serves
from pipesplit.job_list.auto import split_stages_of
from pipesplit.job_list.simulate import Costs

from _parity import assert_matches_unsplit
from _paths import DATA

LAYOUTS = [(1, 1), (1, 2), (2, 2), (4, 1), (4, 2)]  # (emulated pp, vpp)


def served(m_of_pp, slow_from_pp=None):
    """(schedule, pp, vpp, m) for every schedule that serves the layout (others raise a
    ValueError naming the constraint, which the job_list tests check); the layouts with
    ``slow_from_pp`` or more ranks marked slow."""
    cases = []
    for name in schedule_names():
        for pp, vpp in LAYOUTS:
            m = m_of_pp(pp)
            if not serves(name, pp, vpp, m):
                continue
            slow = slow_from_pp is not None and pp >= slow_from_pp
            cases.append(pytest.param(name, pp, vpp, m, id=f"{name}-pp{pp}-v{vpp}-m{m}",
                                      marks=[pytest.mark.slow] if slow else []))
    return cases


@pytest.mark.parametrize("split_backward", [False, True], ids=["B", "IW"])
@pytest.mark.parametrize("name, pp, vpp, m", served(lambda pp: pp + 1, slow_from_pp=4))
def test_gpt_adam_m_not_multiple_of_pp(name, pp, vpp, m, split_backward):
    assert_matches_unsplit("gpt", "adam", name, pp, vpp, m, split_backward)


@pytest.mark.parametrize("split_backward", [False, True], ids=["B", "IW"])
@pytest.mark.parametrize("name, pp, vpp, m", served(lambda pp: pp + 1))
def test_mlp_sgd_m_not_multiple_of_pp(name, pp, vpp, m, split_backward):
    assert_matches_unsplit("mlp", "sgd", name, pp, vpp, m, split_backward)


@pytest.mark.slow
@pytest.mark.parametrize("split_backward", [False, True], ids=["B", "IW"])
@pytest.mark.parametrize("name, pp, vpp, m", served(lambda pp: pp) + served(lambda pp: 2 * pp))
def test_gpt_adam_m_multiple_of_pp(name, pp, vpp, m, split_backward):
    assert_matches_unsplit("gpt", "adam", name, pp, vpp, m, split_backward)


@pytest.mark.parametrize("kind, optimizer", [("gpt", "sgd"), ("mlp", "adam")])
@pytest.mark.parametrize("name, pp, vpp, m", [
    pytest.param("VPP", 4, 2, 5, marks=pytest.mark.slow), ("ZBV", 2, 2, 4),
    pytest.param("1F1B", 4, 1, 8, marks=pytest.mark.slow), ("DualPipeV", 2, 2, 3)])
def test_other_model_optimizer_pairs(kind, optimizer, name, pp, vpp, m):
    assert_matches_unsplit(kind, optimizer, name, pp, vpp, m, split_backward=True)


def _mixed_costs(num_stages):
    """The split costs nothing extra on odd stages only: auto splits those and runs B on the rest."""
    return Costs(1.0, tuple(2.0 for _ in range(num_stages)),
                 tuple(1.0 if s % 2 else 1.7 for s in range(num_stages)),
                 tuple(0.9 if s % 2 else 1.1 for s in range(num_stages)), comm=0.05)


@pytest.mark.parametrize("kind, optimizer", [("gpt", "adam"), ("mlp", "sgd")])
@pytest.mark.parametrize("name, pp, vpp, m", [("auto", 4, 1, 5), ("auto", 2, 2, 3),
                                              ("autoV", 2, 2, 4)])
def test_auto_mixing_b_and_iw_stages(kind, optimizer, name, pp, vpp, m):
    """A schedule with B on some stages and I / W on others: those stages get one backward
    sub-program, the others backward_b / backward_w, and training matches unsplit."""
    costs = _mixed_costs(pp * vpp)
    pipeline = assert_matches_unsplit(kind, optimizer, name, pp, vpp, m, costs=costs)
    split = split_stages_of(pipeline.schedule)
    assert 0 < len(split) < pp * vpp, split  # mixed, as the costs make it pay
    for stage in range(pp * vpp):
        kinds = ("backward_b", "backward_w") if stage in split else ("backward",)
        other = ("backward",) if stage in split else ("backward_b", "backward_w")
        assert all(f"{k}{stage}" in pipeline.split.programs for k in kinds)
        assert not any(f"{k}{stage}" in pipeline.split.programs for k in other)
    assert {t for t, _ in pipeline.job_order} <= set(pipeline.split.programs)


def test_auto_on_profiled_costs_runs_unsplit():
    """Profiled costs where every split schedule is slower: auto's plan has no B / W split."""
    costs = Costs.load(os.path.join(DATA, 
                                    "profiled_mlp_pp4_vpp1.json"))
    pipeline = assert_matches_unsplit("mlp", "sgd", "auto", 4, 1, 5, costs=costs)
    assert split_stages_of(pipeline.schedule) == frozenset()
    assert pipeline.backward_split is None
    assert not any(t.startswith("backward_b") for t in pipeline.split.programs)
