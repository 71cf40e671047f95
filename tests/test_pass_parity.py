"""Numerical parity: every registered schedule, run as a Paddle plan with all ranks emulated in
one process, gives the per-micro-batch losses and final parameters of unsplit full-batch
training (fp32, within 1e-6)."""
import pytest

from pipesplit.job_list import schedule_names, serves

from _parity import assert_matches_unsplit

LAYOUTS = [(1, 1), (1, 2), (2, 2), (4, 1), (4, 2)]  # (emulated pp, vpp)


def served(m_of_pp):
    """(schedule, pp, vpp, m) for every schedule that serves the layout (others raise a
    ValueError naming the constraint, which the job_list tests check)."""
    cases = []
    for name in schedule_names():
        for pp, vpp in LAYOUTS:
            m = m_of_pp(pp)
            if not serves(name, pp, vpp, m):
                continue
            cases.append(pytest.param(name, pp, vpp, m, id=f"{name}-pp{pp}-v{vpp}-m{m}"))
    return cases


@pytest.mark.parametrize("split_backward", [False, True], ids=["B", "IW"])
@pytest.mark.parametrize("name, pp, vpp, m", served(lambda pp: pp + 1))
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
@pytest.mark.parametrize("name, pp, vpp, m", [("VPP", 4, 2, 5), ("ZBV", 2, 2, 4),
                                              ("1F1B", 4, 1, 8), ("DualPipeV", 2, 2, 3)])
def test_other_model_optimizer_pairs(kind, optimizer, name, pp, vpp, m):
    assert_matches_unsplit(kind, optimizer, name, pp, vpp, m, split_backward=True)
