"""The builders' contract (``passes/split/builder.py``): the three plan builders are
``PlanBuilder`` subclasses that keep the base's order - open the schedule, split, the rank's
communication (the transport's, for a rank of a launch), make the plan - and the plan records
what those steps gave.  Checked on real programs: a whole model (one process, one rank of a
launch) and a program of the engine's shape (its ``send_v2`` / ``recv_v2`` at the stage
boundary), built in this process; and, in the source, that only the base takes the steps."""
import ast

import paddle
import pytest

from _paths import REPO

from pipesplit.ir_utils import build_mlp
from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes.engine.engine_rank import EngineRankBuilder, build_engine_rank_plan
from pipesplit.passes.split import builder
from pipesplit.passes.split.builder import PlanBuilder, RankPlanBuilder
from pipesplit.passes.split.per_rank import WholeModelRankBuilder, build_rank_plan
from pipesplit.passes.split.pipeline import OneProcessBuilder, split_and_schedule
from pipesplit.passes.transport.base import Transport
from pipesplit.passes.transport.devices import transport_for

STEPS = ("open_schedule", "split_sub_programs", "make_plan")
#: the builders' modules: none takes a step of the order itself
BUILDER_MODULES = ("passes/split/pipeline.py", "passes/split/per_rank.py",
                   "passes/engine/engine_rank.py")


@pytest.fixture
def taken(monkeypatch):
    """The steps the builds take, in order, each (name, what it gave); every step runs as it
    would (only recorded)."""
    out = []

    def recorded(name, step):
        def run(*args, **kwargs):
            result = step(*args, **kwargs)
            out.append((name, result))
            return result
        return run

    for name in STEPS:
        monkeypatch.setattr(builder, name, recorded(name, getattr(builder, name)))
    monkeypatch.setattr(Transport, "rank_comm", recorded("rank_comm", Transport.rank_comm))
    return out


@pytest.fixture
def engine_ring():
    """The ring of Paddle's auto-parallel process groups the engine's p2p ops name (processes
    0 and 1), removed again afterwards if this test made it."""
    from paddle.distributed.auto_parallel.static import process_group as groups

    before = set(groups._g_process_group_map)
    yield groups.new_process_group([0, 1]).id
    for made in set(groups._g_process_group_map) - before:
        del groups._g_process_group_map[made]


def _check_the_order(taken, plan, through_transport: bool):
    """The steps in the base's order, once each, and the plan made of what they gave."""
    middle = ["rank_comm"] if through_transport else []
    assert [name for name, _ in taken] == ["open_schedule", "split_sub_programs", *middle,
                                           "make_plan"]
    given = dict(taken)
    opened, (split, report) = given["open_schedule"], given["split_sub_programs"]
    assert plan.schedule is opened.schedule and plan.lowered is opened.lowered
    assert plan.timing is opened.timing
    assert plan.backward_split is report and plan.plan is given["make_plan"]
    assert [(job.type(), job.micro_batch_id()) for job in plan.plan.job_list()] == \
        plan.job_order
    if through_transport:  # the transport's comm order, in the plan's order
        comm = iter(plan.job_order)
        assert all(job in comm for job in given["rank_comm"].job_order)
    else:
        assert plan.split is split


def test_each_builder_is_a_plan_builder_and_keeps_its_order():
    for cls in (OneProcessBuilder, WholeModelRankBuilder, EngineRankBuilder):
        assert issubclass(cls, PlanBuilder)
        assert cls.build is PlanBuilder.build and cls._split is PlanBuilder._split, cls
    for cls in (WholeModelRankBuilder, EngineRankBuilder):
        assert issubclass(cls, RankPlanBuilder) and \
            cls.__mro__.index(RankPlanBuilder) < cls.__mro__.index(PlanBuilder)


@pytest.mark.parametrize("schedule,vpp", [("1F1B", 1), ("ZBV", 2)])
def test_the_one_process_plan_follows_the_order(taken, static_mode, schedule, vpp):
    model = build_mlp(num_stages=2 * vpp, batch_size=8)
    config = PipelineConfig.from_attrs(schedule, dict(num_micro_batches=4, pp_degree=2,
                                                      vpp_degree=vpp))
    _check_the_order(taken, split_and_schedule(model.main, model.startup, config),
                     through_transport=False)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_rank_plan_follows_the_order_through_the_transport(taken, static_mode, device):
    model = build_mlp(num_stages=2, batch_size=8)
    config = PipelineConfig.from_attrs("1F1B", dict(num_micro_batches=4, pp_degree=2,
                                                    pp_stage=1))
    plan = build_rank_plan(model.main, model.startup, config, device=device)
    _check_the_order(taken, plan, through_transport=True)
    assert plan.job_order[-1] == ("optimizer", 0)


def _engine_program(rank: int, ring: int):
    """Pipeline rank ``rank``'s forward program as the engine hands it over: rank 0 computes
    and sends its activation to process 1 on ``ring``, rank 1 receives it and computes the
    loss (the engine's evaluation program has this shape)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        weight = paddle.create_parameter([4, 4], "float32")
        if rank == 0:
            x = paddle.static.data("x", [2, 4], "float32")
            paddle._C_ops.send_v2(paddle.tanh(paddle.matmul(x, weight)), ring, 1, True, False)
        else:
            h = paddle._C_ops.recv_v2([2, 4], paddle.float32, 0, ring, True, False)
            paddle.mean(paddle.matmul(h, weight))
    for op in main.global_block().ops:
        op.op_role = 0  # the forward's role, as the engine sets it
    return main


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("rank", [0, 1])
def test_an_engine_rank_plan_follows_the_order_through_the_transport(taken, static_mode,
                                                                     engine_ring, device,
                                                                     rank):
    main = _engine_program(rank, engine_ring)
    config = PipelineConfig.from_attrs("1F1B", dict(num_micro_batches=2, pp_degree=2,
                                                    pp_stage=rank))
    plan = build_engine_rank_plan(main, config, transport_for(device))
    _check_the_order(taken, plan, through_transport=True)
    comm = "send_forward0" if rank == 0 else "recv_forward0"
    assert (comm, 1) in plan.job_order and "pipesplit_p2p_" + comm + "_0" in str(
        plan.split.programs[comm])


def _calls_in(path):
    """The names a module calls (``f(...)`` and ``x.f(...)``)."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return {node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))}


def test_only_the_base_takes_the_steps_of_the_order():
    assert set(STEPS) | {"rank_comm"} <= _calls_in("passes/split/builder.py")
    for path in BUILDER_MODULES:
        assert not _calls_in(path) & (set(STEPS) | {"rank_comm"}), path


def test_the_engine_builder_imports_neither_other_builder():
    tree = ast.parse((REPO / "passes/engine/engine_rank.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"pipesplit.passes.split.pipeline", "pipesplit.passes.split.per_rank"}
