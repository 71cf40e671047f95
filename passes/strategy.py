"""Route Paddle's auto-parallel pipeline step to pipesplit, so ``strategy.pipeline.schedule_mode``
can be any pipesplit schedule (ZBH1, ZBV, ZBVPP, DualPipeV, auto ...).

Paddle 3.3.1's ``paddle.distributed.auto_parallel.static.pir_pass.pipeline_pass(
dense_main_program, dense_startup_program, pipeline_strategy)`` accepts only FThenB, 1F1B and
VPP.  Its engine (``auto_parallel/static/engine.py``) imports the function by name
(``from .pir_pass import pipeline_pass``) and calls
``pipeline_pass([dense_program], [dense_program], self._strategy.pipeline)``, so
:func:`enable_strategy` replaces the name in both modules; :func:`disable_strategy` restores
Paddle's function.  It also calls :func:`pipesplit.passes.registration.enable` (Paddle's
``pipeline_scheduler_<NAME>`` passes -> pipesplit) and undoes that again.

The strategy fields used: ``schedule_mode`` (any pipesplit name or alias), ``accumulate_steps``
(micro-batches), ``pp_degree``, ``vpp_degree``, ``split_backward``.  With one process the plan
emulates every pipeline rank (``pp_stage=None``); with several, ``pp_stage`` is this process's
pipeline stage (Paddle's ``get_pp_stage_by_pp_degree``).  The program must be pipesplit's
input: every virtual stage, chunk id = global stage (not a program the auto-parallel engine has
already partitioned per rank with its own send_v2 / recv_v2 ops: that raises ``ValueError``).

Gradient accumulators must be zeroed once after the startup program:
``last_pipeline().init_scope(scope, place)``.
"""
from __future__ import annotations

from typing import Optional

from ._paddle import require_supported_paddle
from .config import PipelineConfig
from .pipeline import PipelinePlan, split_and_schedule
from . import registration

require_supported_paddle()

_PIR_PASS = "paddle.distributed.auto_parallel.static.pir_pass"
_ENGINE = "paddle.distributed.auto_parallel.static.engine"
_originals: dict = {}
_last: Optional[PipelinePlan] = None
_registration_was_enabled = False


def _modules():
    import importlib

    return [importlib.import_module(_PIR_PASS), importlib.import_module(_ENGINE)]


def _single(x, what):
    if isinstance(x, (list, tuple)):
        if len(x) != 1:
            raise ValueError(f"{what}: expected one program, got {len(x)}")
        return x[0]
    return x


def _pp_stage(pp_degree: int) -> Optional[int]:
    import paddle.distributed as dist

    if pp_degree <= 1 or dist.get_world_size() <= 1:
        return None  # one process: emulate every rank
    from paddle.distributed.auto_parallel.static.utils import get_pp_stage_by_pp_degree

    return get_pp_stage_by_pp_degree(pp_degree)


def config_from_strategy(pipeline_strategy, pp_stage="auto") -> PipelineConfig:
    """The :class:`PipelineConfig` for Paddle's ``Strategy().pipeline`` section."""
    pp = int(pipeline_strategy.pp_degree)
    attrs = dict(num_micro_batches=int(pipeline_strategy.accumulate_steps),
                 pp_degree=pp, vpp_degree=int(pipeline_strategy.vpp_degree),
                 split_backward=bool(pipeline_strategy.split_backward),
                 pp_stage=_pp_stage(pp) if pp_stage == "auto" else pp_stage)
    return PipelineConfig.from_attrs(str(pipeline_strategy.schedule_mode), attrs)


def pipeline_pass(dense_main_program, dense_startup_program, pipeline_strategy):
    """Drop-in for Paddle's ``pir_pass.pipeline_pass``: returns the ``core.Plan``."""
    global _last
    main = _single(dense_main_program, "dense_main_program")
    startup = _single(dense_startup_program, "dense_startup_program")
    for op in main.global_block().ops:
        if op.name() in ("pd_op.send_v2", "pd_op.recv_v2", "pd_op.p_send", "pd_op.p_recv"):
            raise ValueError(
                "this program was already partitioned per rank by the auto-parallel engine (it "
                f"holds {op.name()}); pipesplit's strategy hook needs the whole model with chunk "
                "id = global virtual stage and inserts the p2p itself")
    config = config_from_strategy(pipeline_strategy)
    _last = split_and_schedule(main, startup, config)
    return _last.plan


def last_pipeline() -> Optional[PipelinePlan]:
    """The :class:`PipelinePlan` of the last call through the hook (for ``init_scope``)."""
    return _last


def enable_strategy() -> None:
    """Route ``pir_pass.pipeline_pass`` (and the engine's imported name) to pipesplit."""
    global _registration_was_enabled
    if _originals:
        return
    _registration_was_enabled = registration.is_enabled()
    registration.enable()
    for mod in _modules():
        _originals[mod.__name__] = mod.pipeline_pass
        mod.pipeline_pass = pipeline_pass


def disable_strategy() -> None:
    """Give Paddle its own ``pipeline_pass`` back (and its pass names, unless they were routed
    to pipesplit before :func:`enable_strategy`)."""
    import importlib

    for name, fn in _originals.items():
        setattr(importlib.import_module(name), "pipeline_pass", fn)
    _originals.clear()
    if not _registration_was_enabled:
        registration.disable()


def is_strategy_enabled() -> bool:
    return bool(_originals)
