"""The engine user's ``strategy.pipeline``, checked whole and once, before the engine builds
anything (``dist.to_static(model, loader, loss, opt, strategy)``).

Paddle's engine reads the pipeline fields as they are: ``vpp_degree = 2.5`` or ``"2"`` reaches
its passes and fails there (``'float' object cannot be interpreted as an integer``, ``Requires
batch_size[8] to be divisible by k_steps[4.5]``), ``pp_degree = 3`` on 2 processes is a
``ZeroDivisionError`` deep in Paddle and a misspelt ``vpp_seg_method`` is ``The op
builtin.parameter without seg_method in its struct_name should only be reshard``.  Here each
of these is a ``TypeError`` / ``ValueError`` naming the strategy field, in the engine user's
words (strategy fields, processes, layer classes):

* :func:`check_fields` - the field types and ranges (no silent ``int()`` truncation);
* :func:`check_world` - ``pp_degree`` against the processes of the job;
* :func:`check_model` - ``vpp_seg_method`` against the model's layer classes and block count;
* :func:`check_gradient_merge` - a user's gradient merge only as Paddle runs it (the
  pipeline's own, ``k_steps = accumulate_steps``);
* :func:`checked_request` - the request the section makes, its schedule built once for pp /
  vpp / micro-batches (:func:`~.strategy_config.resolve_request`), and its memory budget;
* :func:`check_strategy` - the user's check before ``to_static``: :func:`check_fields`, then
  :func:`checked_request`.

The engine's opening runs them in one order (:func:`~.open_state.check_and_fill_in`, then
:func:`checked_request`); the tests call those two.

Beside them, what the model check counts: the blocks the user placed on each stage mesh
(:func:`blocks_per_stage_mesh`, :func:`block_sizes`).  The checks only read the strategy: they
never set, convert or normalise a field.
"""
from __future__ import annotations

import difflib
import re
from typing import List, Optional

from pipesplit.job_list.request import PipelineConfig
from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.passes.engine.state import Request
from pipesplit.passes.engine.strategy_config import resolve_request
from pipesplit.passes.engine.user_options import check_memory_budget

paddle = require_supported_paddle()

__all__ = ["INT_FIELDS", "block_sizes", "blocks_per_stage_mesh", "check_fields",
           "check_gradient_merge", "check_model", "check_strategy", "check_world",
           "checked_request"]

_PREFIX = "strategy.pipeline."
#: the int fields of ``strategy.pipeline`` pipesplit reads (each >= 1; Paddle's defaults are 1)
INT_FIELDS = ("pp_degree", "vpp_degree", "accumulate_steps", "micro_batch_size")
#: containers that are never called themselves: their children carry the struct names Paddle
#: matches ``vpp_seg_method`` against, so they are neither blocks nor worth suggesting
_CONTAINERS = (paddle.nn.LayerList, paddle.nn.LayerDict, paddle.nn.ParameterList)
#: a longer list of class names would bury the one the user meant
_MAX_CLASSES_SHOWN = 20
_MISSING = object()


def _describe(value) -> str:
    """``float 2.5``, ``str '2'``, ``numpy.int64 2``: the type and the value as written."""
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
    return f"{name} {value!r}"


def _field(pipeline_strategy, name: str):
    """A field of ``strategy.pipeline``; an object without it is not Paddle's pipeline config."""
    value = getattr(pipeline_strategy, name, _MISSING)
    if value is _MISSING:
        raise TypeError(f"{_PREFIX}{name} is missing: pass the pipeline section of a "
                        f"paddle.distributed.Strategy(), got {_describe(pipeline_strategy)}")
    return value


def _check_int_field(pipeline_strategy, name: str) -> None:
    value = _field(pipeline_strategy, name)
    # bool is an int subclass, but True as a degree is a mistake, not 1
    if isinstance(value, bool) or not isinstance(value, int):
        # 2.0 is refused too: Paddle would take it as it is, and int() would hide 2.5 -> 2
        hint = f" (write {int(value)})" if isinstance(value, float) and value.is_integer() else ""
        raise TypeError(f"{_PREFIX}{name} must be an int, got {_describe(value)}{hint}")
    if value < 1:
        raise ValueError(f"{_PREFIX}{name} must be >= 1, got {value}")


def _check_str_field(pipeline_strategy, name: str, what: str) -> str:
    value = _field(pipeline_strategy, name)
    if not isinstance(value, str):
        raise TypeError(f"{_PREFIX}{name} must be a str ({what}), got {_describe(value)}")
    return value


def _seg_pattern(pipeline_strategy):
    """``vpp_seg_method`` compiled as Paddle compiles it (a regular expression searched,
    ignoring case, in the layers' struct names), so pipesplit finds the blocks Paddle finds."""
    seg = pipeline_strategy.vpp_seg_method
    try:
        return re.compile(seg, re.IGNORECASE)
    except re.error as e:
        raise ValueError(f"{_PREFIX}vpp_seg_method={seg!r} is not a valid regular expression "
                         f"(Paddle searches it in the model's layer class names): {e}") from None


def check_fields(pipeline_strategy) -> None:
    """Every field of ``strategy.pipeline`` pipesplit reads has the type it needs: the int
    fields (:data:`INT_FIELDS`) are ints >= 1, ``split_backward`` a bool, ``schedule_mode`` and
    ``vpp_seg_method`` strs, the latter non-empty when ``vpp_degree`` > 1 (``TypeError`` /
    ``ValueError`` naming the field)."""
    for name in INT_FIELDS:
        _check_int_field(pipeline_strategy, name)
    split = _field(pipeline_strategy, "split_backward")
    if not isinstance(split, bool):
        # 1 / "False" would be read as truthy or falsy by whoever looks next: refuse both
        raise TypeError(f"{_PREFIX}split_backward must be a bool, got {_describe(split)}")
    _check_str_field(pipeline_strategy, "schedule_mode", "a schedule name such as 'ZBV'")
    seg = _check_str_field(pipeline_strategy, "vpp_seg_method",
                           "the class name of the model's repeated blocks, or '' for none")
    vpp = pipeline_strategy.vpp_degree
    if not seg and vpp > 1:
        # the engine splits the blocks it finds by this name over pp x vpp virtual stages
        raise ValueError(f"{_PREFIX}vpp_seg_method is empty, but {_PREFIX}vpp_degree={vpp} "
                         "needs it: name the class of the model's repeated blocks (e.g. "
                         "'DecoderBlock'), which the engine splits over the virtual stages")
    if seg:
        _seg_pattern(pipeline_strategy)


def check_world(pipeline_strategy, world_size: int) -> None:
    """``pp_degree`` divides the job's processes (``paddle.distributed.get_world_size()``),
    hence is <= them: every pipeline stage runs on world_size / pp_degree processes.  Paddle's
    own stage rule (rank // (world_size // pp_degree)) divides by zero otherwise."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (paddle.distributed.get_world_size()), "
                        f"got {_describe(world_size)}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    pp = pipeline_strategy.pp_degree
    if world_size % pp == 0:
        return
    processes = f"{world_size} process{'es' if world_size > 1 else ''}"
    divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
    raise ValueError(f"{_PREFIX}pp_degree={pp} does not divide the {processes} of this job: "
                     "each pipeline stage runs on world size / pp_degree processes, so "
                     "pp_degree must divide the world size and be <= it; set "
                     f"{_PREFIX}pp_degree to one of {divisors}, or launch a multiple of {pp} "
                     "processes")


def _class_name(layer) -> str:
    return type(layer).__name__


def _layer_classes(model) -> List[str]:
    """The model's layer class names, sorted and de-duplicated (containers left out)."""
    return sorted({_class_name(layer) for layer in model.sublayers(include_self=True)
                   if not isinstance(layer, _CONTAINERS)})


def _outermost_blocks(model, pattern) -> list:
    """The layers whose class name ``pattern`` finds, not counting those inside one: Paddle
    cuts a struct name (``/Model/DecoderBlock_1/Linear/``) at its first match, so a matching
    layer inside a block belongs to that block."""
    found, todo = [], [model]
    while todo:
        layer = todo.pop()
        if not isinstance(layer, _CONTAINERS) and pattern.search(_class_name(layer)):
            found.append(layer)
        else:
            todo.extend(reversed(list(layer.children())))  # model order, depth first
    return found


def _no_block_class(seg: str, classes: List[str]) -> ValueError:
    close = difflib.get_close_matches(seg.lower(), [c.lower() for c in classes], n=1)
    hint = f" Did you mean {classes[[c.lower() for c in classes].index(close[0])]!r}?" \
        if close else ""
    shown = ", ".join(classes[:_MAX_CLASSES_SHOWN])
    more = len(classes) - _MAX_CLASSES_SHOWN
    if more > 0:
        shown += f" (and {more} more)"
    return ValueError(f"{_PREFIX}vpp_seg_method={seg!r} names no layer class of the model "
                      f"(Paddle searches it, ignoring case, in the layers' class names).{hint} "
                      f"The model's layer classes: {shown}")


def _stage_mesh_of(block):
    """The mesh of a block's first distributed parameter (None: it has none)."""
    for param in block.parameters():
        if param.is_dist():
            return param.process_mesh
    return None


def _blocks_per_mesh(blocks: list) -> dict:
    """process ids of a block's mesh (None: not placed) -> how many blocks sit there."""
    per_mesh = {}
    for block in blocks:
        mesh = _stage_mesh_of(block)
        key = None if mesh is None else tuple(mesh.process_ids)
        per_mesh[key] = per_mesh.get(key, 0) + 1
    return per_mesh


def blocks_per_stage_mesh(pipeline_strategy, model) -> Optional[List[int]]:
    """How many ``vpp_seg_method`` blocks the user placed on each stage mesh (stage meshes in
    the order of their first process, as Paddle orders them), or None when the blocks are not
    placed one mesh per stage (or there is no seg method or layer to look at)."""
    if not pipeline_strategy.vpp_seg_method or not isinstance(model, paddle.nn.Layer):
        return None
    per_mesh = _blocks_per_mesh(_outermost_blocks(model, _seg_pattern(pipeline_strategy)))
    if not per_mesh or None in per_mesh or len(per_mesh) != pipeline_strategy.pp_degree:
        return None
    return [per_mesh[key] for key in sorted(per_mesh)]


def block_sizes(pipeline_strategy, model) -> Optional[list]:
    """How many blocks the user placed on each stage mesh, where they differ between stages
    (Paddle's VPP test: 7 layers on pp 2), else None: the schedule is then built and
    simulated with job costs in proportion to each virtual stage's blocks
    (:func:`~pipesplit.job_list.request.sized_costs`), unless :func:`~.user_options.use_costs`
    gave costs."""
    per_rank = blocks_per_stage_mesh(pipeline_strategy, model)
    return per_rank if per_rank is not None and len(set(per_rank)) > 1 else None


def _check_block_count(pipeline_strategy, blocks: list) -> None:
    """Each stage mesh keeps the blocks the user placed on it and deals them to its
    ``vpp_degree`` chunks (Paddle's rule), so each needs at least ``vpp_degree`` blocks; with
    blocks the user did not place, ``pp_degree x vpp_degree`` blocks at least."""
    pp, vpp = pipeline_strategy.pp_degree, pipeline_strategy.vpp_degree
    seg = pipeline_strategy.vpp_seg_method
    kinds = ", ".join(sorted({_class_name(b) for b in blocks}))
    per_mesh = _blocks_per_mesh(blocks)
    if None in per_mesh or len(per_mesh) != pp:
        # not one mesh per stage: the stage-mesh check names the meshes (record_pipe)
        if len(blocks) >= pp * vpp:
            return
        raise ValueError(f"{_PREFIX}vpp_seg_method={seg!r} names {len(blocks)} {kinds} "
                         f"layer(s), fewer than {_PREFIX}pp_degree x {_PREFIX}vpp_degree = "
                         f"{pp} x {vpp} = {pp * vpp}: every virtual stage needs one")
    counts = [per_mesh[key] for key in sorted(per_mesh)]
    short = [(key, n) for key, n in sorted(per_mesh.items()) if n < vpp]
    if short:
        key, n = short[0]
        raise ValueError(
            f"{_PREFIX}vpp_seg_method={seg!r}: stage mesh {list(key)} holds {n} {kinds} "
            f"layer(s), fewer than {_PREFIX}vpp_degree={vpp}: each stage deals its layers to "
            f"its {vpp} chunks and every chunk needs one (layers per stage mesh: {counts})")


def check_model(pipeline_strategy, model) -> None:
    """``vpp_seg_method`` (when set, or needed: vpp_degree > 1) names a layer class of
    ``model`` (the user's ``paddle.nn.Layer``), and with vpp_degree > 1 the blocks it names
    are at least vpp_degree on each stage mesh (at least pp_degree x vpp_degree where they
    are not placed one mesh per stage) (``ValueError`` naming the model's layer
    classes, or the count).  With vpp_degree 1 the engine does not split the blocks (the
    user's meshes place them), so their number is free.  A model that is not a
    ``paddle.nn.Layer`` (``None``, a function the engine traces) has nothing to check.

    The blocks are counted per layer object, as the model holds them; Paddle counts the calls
    it traces, which is the same for a model that calls each of its blocks once."""
    seg, vpp = pipeline_strategy.vpp_seg_method, pipeline_strategy.vpp_degree
    if not seg and vpp == 1:
        return
    if not seg:  # (check_fields' message: the same input, the same words)
        check_fields(pipeline_strategy)
    if not isinstance(model, paddle.nn.Layer):
        return  # None, or a callable the engine traces: no layers to look at before tracing
    blocks = _outermost_blocks(model, _seg_pattern(pipeline_strategy))
    if not blocks:
        raise _no_block_class(seg, _layer_classes(model))
    if vpp > 1:
        _check_block_count(pipeline_strategy, blocks)


#: ``strategy.gradient_merge.k_steps`` when the user leaves it alone (Paddle's default)
_DEFAULT_K_STEPS = 1


def check_gradient_merge(strategy) -> None:
    """A user's ``strategy.gradient_merge`` beside the pipeline, served as Paddle serves it:
    with a pipeline, Paddle 3.3.1's engine turns the merge on itself with ``k_steps =
    pipeline.accumulate_steps`` (``Engine._parallel_pir``), overwriting the user's settings,
    and never nests two accumulations.  So ``enable = True`` with ``k_steps`` left at its
    default or equal to ``accumulate_steps`` (Paddle's own ``mlp_demo`` pipeline test) is what
    Paddle runs; another ``k_steps`` is a ``ValueError``: Paddle would silently accumulate
    ``accumulate_steps`` micro-batches, not ``k_steps``.  ``strategy``: the whole
    ``paddle.distributed.Strategy``."""
    merge = getattr(strategy, "gradient_merge", None)
    if merge is None or not merge.enable:
        return
    steps, k = strategy.pipeline.accumulate_steps, merge.k_steps
    if k in (_DEFAULT_K_STEPS, steps):
        return
    raise ValueError(
        f"strategy.gradient_merge.k_steps={k} with strategy.pipeline.enable: Paddle's engine "
        f"ignores it and accumulates strategy.pipeline.accumulate_steps={steps} micro-batches "
        f"per update (a pipeline's gradient merge is its micro-batching); set "
        f"strategy.gradient_merge.k_steps={steps} (or leave it at {_DEFAULT_K_STEPS}, or "
        f"gradient_merge.enable = False), and strategy.pipeline.accumulate_steps to the "
        f"micro-batches you want per update")


def check_strategy(pipeline_strategy, blocks: Optional[list] = None) -> PipelineConfig:
    """Refuse a pipeline strategy pipesplit cannot serve, before the engine builds anything:
    the checks of an engine's opening that read the section alone, in its order
    (:func:`check_fields`, then :func:`checked_request`): a field of the wrong type, an
    unknown schedule name, pp / vpp / micro-batches the schedule cannot serve, a memory budget
    it cannot take (``ValueError`` / ``TypeError`` naming the strategy field).  Returns the
    config (no rank).  (An engine's section: :func:`pipesplit.passes.strategy.check_strategy`.)"""
    check_fields(pipeline_strategy)
    return checked_request(pipeline_strategy, blocks).config


def checked_request(pipeline_strategy, blocks: Optional[list] = None) -> Request:
    """The section's :class:`~.state.Request` (no rank; its schedule built, so a schedule that
    cannot serve the strategy is refused naming ``schedule_mode`` and the constraint), and its
    memory budget checked, as the engine's opening resolves them
    (:func:`~.open_state.open_engine_state`, after :func:`~.open_state.check_and_fill_in`)."""
    request = resolve_request(pipeline_strategy, None, blocks)
    check_memory_budget(pipeline_strategy, request)
    return request
