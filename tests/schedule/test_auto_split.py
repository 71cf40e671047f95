"""auto / autoV decide whether to split the backward (per stage): never slower in simulation than
any registered schedule of their placement that peaks at no more memory, split or not, for
profiled costs (tests/data, from ``pipesplit profile``: there tI + tW is 1.1-2.2x tB) and for
the benchmark cost models."""
import os
import time
from dataclasses import replace

import pytest

from pipesplit.job_list import build_schedule, schedule_names
from pipesplit.job_list.auto import (AUTO_NAMES, SearchContext, auto_search, default_memory_limit,
                                     split_patterns, split_stages_of)
from pipesplit.job_list.ir import BACKWARD, BACKWARD_B
from pipesplit.job_list.placement import LOOPED, V_SHAPE
from pipesplit.job_list.registry import get_spec, split_backward_jobs
from pipesplit.job_list.simulate import Costs, simulate
from pipesplit.job_list.validate import validate
from pipesplit.tools.bench.bench_frameworks import COST_MODELS
from _paths import DATA as _DATA

DATA = str(_DATA)
#: profiled cost files by number of virtual stages
PROFILED = {2: ["profiled_mlp_pp2_vpp1.json"],
            4: ["profiled_mlp_pp4_vpp1.json", "profiled_gpt_pp4_vpp1.json"],
            8: ["profiled_mlp_pp4_vpp2.json"]}
BENCHMARK = [costs for _, costs, _ in COST_MODELS]
#: split dearer than B on every stage (tI + tW = 1.3-1.9 tB), and on half of the stages only
DEAR_SPLIT = Costs(1.0, 2.0, 1.3, 1.3, comm=0.05)
MIXED = {n: Costs(1.0, tuple(2.0 for _ in range(n)),
                  tuple(1.0 if s % 2 else 1.7 for s in range(n)),
                  tuple(0.9 if s % 2 else 1.1 for s in range(n)), comm=0.05) for n in (2, 4, 8)}
GRID = [(pp, vpp, m) for pp in (2, 4) for vpp in (1, 2) for m in (pp, 2 * pp, 2 * pp + 2)]


def costs_for(num_stages):
    out = [Costs.load(os.path.join(DATA, f)) for f in PROFILED[num_stages]]
    return out + BENCHMARK + [DEAR_SPLIT, MIXED[num_stages]]


def registered_variants(pp, vpp, m, placement):
    """Every registered non-auto schedule of ``placement``: split, and unsplit where it can."""
    for name in schedule_names():
        spec = get_spec(name)
        if name in AUTO_NAMES or spec.placement != placement:
            continue
        for split in ((True,) if spec.splits_backward else (True, False)):
            try:
                yield f"{name}{'' if split else '/B'}", build_schedule(name, pp, vpp, m,
                                                                       split_backward=split)
            except ValueError:
                break


@pytest.mark.slow
@pytest.mark.parametrize("placement", (LOOPED, V_SHAPE))
def test_auto_never_slower_than_a_registered_schedule_at_no_more_memory(placement):
    name = "auto" if placement == LOOPED else "autoV"
    checked, slowest_search = 0, 0.0
    for pp, vpp, m in GRID:
        if placement == V_SHAPE and vpp % 2:
            continue
        for costs in costs_for(pp * vpp):
            began = time.perf_counter()
            schedule = build_schedule(name, pp, vpp, m, costs=costs)
            slowest_search = max(slowest_search, time.perf_counter() - began)
            validate(schedule)
            mine = simulate(schedule, costs)
            for label, other in registered_variants(pp, vpp, m, placement):
                theirs = simulate(other, costs)
                if theirs.max_peak_memory <= mine.max_peak_memory + 1e-9:
                    checked += 1
                    assert mine.makespan <= theirs.makespan + 1e-9, (
                        f"{name} {mine.makespan:.4f} > {label} {theirs.makespan:.4f} "
                        f"(pp={pp} vpp={vpp} m={m} costs={costs})")
    assert checked > 50
    assert slowest_search < 10.0  # bounded search (docs/measurements.md, Benchmarks, reports the times)


def test_profiled_costs_choose_the_unsplit_backward():
    """The issue's case: with these costs every split schedule simulates ~30% slower than 1F1B."""
    costs = Costs.load(os.path.join(DATA, "profiled_mlp_pp4_vpp1.json"))
    result = auto_search(4, 1, 8, costs)
    split_1f1b = simulate(build_schedule("1F1B", 4, 1, 8, split_backward=True), costs).makespan
    unsplit_1f1b = simulate(build_schedule("1F1B", 4, 1, 8), costs).makespan
    assert unsplit_1f1b < split_1f1b
    assert result.makespan <= unsplit_1f1b + 1e-9
    assert not result.schedule.split_backward
    assert split_stages_of(result.schedule) == frozenset()


def test_mixed_costs_split_only_where_it_pays():
    """Split costs nothing extra on the odd stages only: the searched pattern tries that mix,
    and the result beats both the all-split and the all-B best."""
    costs = MIXED[4]
    assert frozenset({1, 3}) in split_patterns(costs, 4)
    result = auto_search(4, 1, 8, costs)
    validate(result.schedule)
    kinds = {(stage, job.kind) for stage, job in (
        (result.schedule.placement.stage(r, j.chunk), j)
        for r, jobs in enumerate(result.schedule.ranks) for j in jobs)}
    assert any((s, BACKWARD) in kinds for s in range(4))
    assert any((s, BACKWARD_B) in kinds for s in range(4))
    best_registered = min(simulate(s, costs).makespan
                          for _, s in registered_variants(4, 1, 8, LOOPED))
    assert result.makespan < best_registered - 1e-9


def test_unsplit_stage_searched_as_b():
    """An unsplit stage's B is its I (cost tB, frees all) plus a W of cost 0 that disappears."""
    costs = Costs(1.0, 2.0, 1.5, 1.0)
    ctx = SearchContext(2, 1, 2, LOOPED, costs, split_stages=[1])
    one_f_one_b = build_schedule("1F1B", 2, 1, 2)
    split_last = [jobs if r == 0 else split_backward_jobs([jobs])[0]
                  for r, jobs in enumerate(one_f_one_b.ranks)]
    mixed = one_f_one_b.with_ranks(split_last, split_backward=True)
    validate(mixed)
    orders = ctx.from_schedule(mixed)
    span, peak, _ = ctx.simulate(orders)
    reference = simulate(mixed, costs)
    assert span == pytest.approx(reference.makespan)
    assert peak == pytest.approx(tuple(reference.peak_memory))
    assert ctx.to_jobs(orders) == mixed.ranks
    assert (ctx.cost[1][0], ctx.cost[2][0]) == (2.0, 0.0)  # stage 0 unsplit: I = tB, W = 0
    assert (ctx.cost[1][1], ctx.cost[2][1]) == (1.5, 1.0)


@pytest.mark.slow
def test_bench_split_grid_finds_no_loss():
    import io
    from pipesplit.tools.bench.bench_auto import run_split_grid
    out = io.StringIO()
    summary = run_split_grid(DATA, out=out)
    assert summary["rows"] >= 80 and summary["slower"] == 0
    assert summary["patterns"].get("B", 0) > 0 and summary["patterns"].get("mixed", 0) > 0


#: blocking transfers (gloo on CPU): a large comm, the split dearer than B, and profiled costs
def rendezvous_costs_for(num_stages):
    profiled = Costs.load(os.path.join(DATA, PROFILED[num_stages][0]))
    return [replace(costs, comm_mode="rendezvous") for costs in
            (Costs(1.0, 2.0, 1.0, 1.0, comm=0.5), DEAR_SPLIT,
             replace(profiled, comm=2 * max(profiled.of(BACKWARD, 0), 1e-3)))]


@pytest.mark.slow
@pytest.mark.parametrize("placement", (LOOPED, V_SHAPE))
def test_auto_under_rendezvous_costs_is_never_slower_than_a_fitting_registered_schedule(placement):
    # the search runs in the latency model; its finalists are re-ranked with the rendezvous
    # simulation, so auto beats (or ties) every fixed schedule within its memory limit there
    name = "auto" if placement == LOOPED else "autoV"
    checked, rerank_won = 0, 0
    for pp, vpp, m in [(pp, vpp, m) for pp in (2, 4) for vpp in (1, 2) for m in (pp, 2 * pp)]:
        if placement == V_SHAPE and vpp % 2:
            continue
        limit = default_memory_limit(pp, vpp, m)
        for costs in rendezvous_costs_for(pp * vpp):
            result = auto_search(pp, vpp, m, costs, placements=(placement,))
            validate(result.schedule)
            mine = simulate(result.schedule, costs)
            assert mine.makespan == pytest.approx(result.makespan)
            assert result.peak <= limit + 1e-9
            latency_pick = auto_search(pp, vpp, m, costs.as_latency(), placements=(placement,))
            rerank_won += simulate(latency_pick.schedule, costs).makespan > mine.makespan + 1e-9
            for label, other in registered_variants(pp, vpp, m, placement):
                theirs = simulate(other, costs)
                if theirs.max_peak_memory <= limit + 1e-9:
                    checked += 1
                    assert mine.makespan <= theirs.makespan + 1e-9, (
                        f"{name} {mine.makespan:.4f} > {label} {theirs.makespan:.4f} "
                        f"(pp={pp} vpp={vpp} m={m} costs={costs})")
    assert checked > 20
    assert rerank_won > 0  # the re-rank changes the choice somewhere on this grid
