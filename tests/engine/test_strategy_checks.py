"""The engine user's ``strategy.pipeline`` checked before the engine builds anything
(:mod:`pipesplit.passes.engine.strategy_checks`): real ``paddle.distributed.Strategy()`` objects and
real ``paddle.nn`` models, one process, no program built."""
from __future__ import annotations

import copy
import re

import paddle
import pytest

from pipesplit.passes.engine.open_state import check_and_fill_in
from pipesplit.passes.engine.strategy_checks import check_fields, check_model, check_world


class DecoderBlock(paddle.nn.Layer):
    def __init__(self, hidden):
        super().__init__()
        self.norm = paddle.nn.LayerNorm(hidden)
        self.up = paddle.nn.Linear(hidden, 2 * hidden)
        self.down = paddle.nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        return x + self.down(paddle.nn.functional.gelu(self.up(self.norm(x))))


class TinyGPT(paddle.nn.Layer):
    def __init__(self, blocks=4, hidden=8, vocab=16):
        super().__init__()
        self.embed = paddle.nn.Embedding(vocab, hidden)
        self.blocks = paddle.nn.LayerList([DecoderBlock(hidden) for _ in range(blocks)])
        self.norm = paddle.nn.LayerNorm(hidden)
        self.head = paddle.nn.Linear(hidden, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def strategy_with(**fields):
    """A ``paddle.distributed.Strategy`` with Paddle's defaults, pipeline enabled, and its
    pipeline ``fields`` set."""
    strategy = paddle.distributed.Strategy()
    strategy.pipeline.enable = True
    for name, value in fields.items():
        setattr(strategy.pipeline, name, value)
    return strategy


def pipeline(**fields):
    """``strategy.pipeline`` of :func:`strategy_with`."""
    return strategy_with(**fields).pipeline


ZBV = dict(schedule_mode="ZBV", pp_degree=2, vpp_degree=2, vpp_seg_method="DecoderBlock",
           accumulate_steps=4, micro_batch_size=2)


def starts(message: str) -> str:
    return "^" + re.escape(message)


@pytest.mark.parametrize("field,value,error,message", [
    ("vpp_degree", 2.5, TypeError, "strategy.pipeline.vpp_degree must be an int, got float 2.5"),
    ("vpp_degree", 2.0, TypeError,
     "strategy.pipeline.vpp_degree must be an int, got float 2.0 (write 2)"),
    ("pp_degree", "2", TypeError, "strategy.pipeline.pp_degree must be an int, got str '2'"),
    ("pp_degree", True, TypeError, "strategy.pipeline.pp_degree must be an int, got bool True"),
    ("accumulate_steps", 4.5, TypeError,
     "strategy.pipeline.accumulate_steps must be an int, got float 4.5"),
    ("micro_batch_size", None, TypeError,
     "strategy.pipeline.micro_batch_size must be an int, got NoneType None"),
    ("accumulate_steps", 0, ValueError, "strategy.pipeline.accumulate_steps must be >= 1, got 0"),
    ("micro_batch_size", -1, ValueError,
     "strategy.pipeline.micro_batch_size must be >= 1, got -1"),
    ("vpp_degree", 0, ValueError, "strategy.pipeline.vpp_degree must be >= 1, got 0"),
    ("split_backward", 1, TypeError, "strategy.pipeline.split_backward must be a bool, got int 1"),
    ("split_backward", "False", TypeError,
     "strategy.pipeline.split_backward must be a bool, got str 'False'"),
    ("schedule_mode", None, TypeError,
     "strategy.pipeline.schedule_mode must be a str (a schedule name such as 'ZBV'), "
     "got NoneType None"),
    ("vpp_seg_method", None, TypeError,
     "strategy.pipeline.vpp_seg_method must be a str (the class name of the model's repeated "
     "blocks, or '' for none), got NoneType None"),
    ("vpp_seg_method", "", ValueError,
     "strategy.pipeline.vpp_seg_method is empty, but strategy.pipeline.vpp_degree=2 needs it"),
    ("vpp_seg_method", "Block(", ValueError,
     "strategy.pipeline.vpp_seg_method='Block(' is not a valid regular expression"),
])
def test_bad_fields_are_named(field, value, error, message):
    strategy = strategy_with(**{**ZBV, field: value})
    section = strategy.pipeline
    before = copy.deepcopy(vars(section))
    with pytest.raises(error, match=starts(message)):
        check_fields(section)
    with pytest.raises(error, match=starts(message)):  # the opening checks the fields first
        check_and_fill_in(strategy, TinyGPT(blocks=3), world_size=3)
    assert vars(section) == before


@pytest.mark.parametrize("pp,world", [(3, 2), (4, 2), (2, 1), (3, 4)])
def test_pp_degree_must_divide_the_processes(pp, world):
    strategy = strategy_with(**{**ZBV, "pp_degree": pp, "vpp_degree": 1})
    section = strategy.pipeline
    processes = f"{world} process{'es' if world > 1 else ''}"
    message = starts(f"strategy.pipeline.pp_degree={pp} does not divide the {processes} of this "
                     "job: each pipeline stage runs on world size / pp_degree processes, so "
                     "pp_degree must divide the world size and be <= it")
    with pytest.raises(ValueError, match=message):
        check_world(section, world)
    with pytest.raises(ValueError, match=message):
        check_and_fill_in(strategy, TinyGPT(blocks=pp * 2), world)


@pytest.mark.parametrize("fields,blocks,message", [
    (dict(vpp_seg_method="NoSuchBlock"), 4,
     "strategy.pipeline.vpp_seg_method='NoSuchBlock' names no layer class of the model (Paddle "
     "searches it, ignoring case, in the layers' class names). The model's layer classes: "
     "DecoderBlock, Embedding, LayerNorm, Linear, TinyGPT"),
    (dict(vpp_seg_method="DecoderBlok", vpp_degree=1), 4,  # misspelt, even where unused yet
     "strategy.pipeline.vpp_seg_method='DecoderBlok' names no layer class of the model (Paddle "
     "searches it, ignoring case, in the layers' class names). Did you mean 'DecoderBlock'? The "
     "model's layer classes: DecoderBlock, Embedding, LayerNorm, Linear, TinyGPT"),
    (dict(), 3,
     "strategy.pipeline.vpp_seg_method='DecoderBlock' names 3 DecoderBlock layer(s), fewer "
     "than strategy.pipeline.pp_degree x strategy.pipeline.vpp_degree = 2 x 2 = 4: every "
     "virtual stage needs one"),
    (dict(vpp_seg_method="TinyGPT"), 4,  # the whole model: one block
     "strategy.pipeline.vpp_seg_method='TinyGPT' names 1 TinyGPT layer(s), fewer than "
     "strategy.pipeline.pp_degree x strategy.pipeline.vpp_degree = 2 x 2 = 4"),
])
def test_seg_method_must_name_the_blocks(fields, blocks, message):
    strategy = strategy_with(**{**ZBV, **fields})
    section = strategy.pipeline
    before = copy.deepcopy(vars(section))
    with pytest.raises(ValueError, match=starts(message)):
        check_model(section, TinyGPT(blocks=blocks))
    with pytest.raises(ValueError, match=starts(message)):
        check_and_fill_in(strategy, TinyGPT(blocks=blocks), world_size=2)
    assert vars(section) == before


@pytest.mark.parametrize("fields,blocks,world", [
    (dict(), 1, 1),  # Paddle's defaults, pipeline enabled: pp 1, vpp 1, no seg method
    (dict(), 1, 8),
    (ZBV, 4, 2),
    (ZBV, 8, 4),  # two processes per stage (dp x pp)
    ({**ZBV, "vpp_seg_method": "decoderblock"}, 4, 2),  # Paddle ignores case
    ({**ZBV, "vpp_seg_method": "Decoder"}, 4, 2),  # and searches (a regular expression)
    # the outermost matches: 3 blocks (their norms inside them) and the final norm
    ({**ZBV, "vpp_seg_method": "Block|Norm"}, 3, 2),
    ({**ZBV, "schedule_mode": "ZBH1", "vpp_degree": 1}, 3, 2),  # vpp 1: the meshes place them
    ({**ZBV, "schedule_mode": "1F1B", "vpp_degree": 1, "vpp_seg_method": ""}, 3, 2),
    ({**ZBV, "split_backward": True, "micro_batch_size": 1}, 4, 2),
])
def test_good_strategies_pass_untouched(fields, blocks, world):
    strategy = strategy_with(**fields)
    section = strategy.pipeline
    before = copy.deepcopy(vars(section))
    assert check_and_fill_in(strategy, TinyGPT(blocks=blocks), world) is None
    assert vars(section) == before


def test_without_a_layer_only_the_strategy_is_checked():
    # the engine also takes None or a function as its model: no layers to look at
    for model in (None, lambda ids: TinyGPT(blocks=3)(ids)):
        check_and_fill_in(strategy_with(**{**ZBV, "vpp_seg_method": "NoSuchBlock"}), model, 2)
    with pytest.raises(ValueError, match=starts("strategy.pipeline.pp_degree=2 does not divide")):
        check_and_fill_in(strategy_with(**ZBV), None, 3)


# -- what Paddle derives itself: gradient merge beside the pipeline, pp_degree from the meshes

def _pipeline_strategy(accumulate_steps=4, merge=None):
    import paddle.distributed as dist

    strategy = dist.Strategy()
    strategy.pipeline.enable = True
    strategy.pipeline.accumulate_steps = accumulate_steps
    if merge is not None:
        strategy.gradient_merge.enable = True
        if merge != "default":
            strategy.gradient_merge.k_steps = merge
    return strategy


@pytest.mark.parametrize("merge", [None, "default", 4])
def test_gradient_merge_as_paddle_runs_it_is_accepted_and_set_as_paddle_sets_it(merge):
    from pipesplit.passes.engine.open_state import fill_in_what_paddle_derives
    from pipesplit.passes.engine.strategy_checks import check_gradient_merge

    strategy = _pipeline_strategy(merge=merge)
    check_gradient_merge(strategy)
    fill_in_what_paddle_derives(strategy, None)
    assert strategy.gradient_merge.k_steps == (1 if merge is None else 4)


def test_another_k_steps_says_what_paddle_would_do():
    from pipesplit.passes.engine.strategy_checks import check_gradient_merge

    strategy = _pipeline_strategy(merge=8)
    before = copy.deepcopy(strategy.gradient_merge.to_dict())
    with pytest.raises(ValueError, match=re.escape(
            "strategy.gradient_merge.k_steps=8 with strategy.pipeline.enable: Paddle's engine "
            "ignores it and accumulates strategy.pipeline.accumulate_steps=4 micro-batches per "
            "update")):
        check_gradient_merge(strategy)
    assert strategy.gradient_merge.to_dict() == before  # a refusal changes nothing


def _on_meshes(model, meshes):
    import paddle.distributed as dist

    layers = [model.embed] + list(model.blocks) + [model.norm, model.head]
    for i, layer in enumerate(layers):
        mesh = meshes[i * len(meshes) // len(layers)]
        for sub in layer.sublayers(include_self=True):
            for name, param in list(sub.named_parameters(include_sublayers=False)):
                setattr(sub, name, dist.shard_tensor(param, mesh, [dist.Replicate()]))
    return model


def test_pp_degree_left_at_1_takes_the_number_of_stage_meshes():
    import paddle.distributed as dist
    from pipesplit.passes.engine.open_state import fill_in_what_paddle_derives, stage_mesh_count

    paddle.disable_static()
    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(2)]
    model = _on_meshes(TinyGPT(), meshes)
    assert stage_mesh_count(model) == 2
    assert stage_mesh_count(TinyGPT()) == 0  # no mesh: nothing to derive
    strategy = _pipeline_strategy()
    fill_in_what_paddle_derives(strategy, model)
    assert strategy.pipeline.pp_degree == 2
    strategy = _pipeline_strategy()
    strategy.pipeline.pp_degree = 4  # an explicit value stays (stage_pipe refuses it later)
    fill_in_what_paddle_derives(strategy, model)
    assert strategy.pipeline.pp_degree == 4


def placed(per_mesh):
    """A TinyGPT whose blocks sit on stage meshes [0] and [1], ``per_mesh`` blocks each."""
    import paddle.distributed as dist

    paddle.disable_static()
    meshes = [dist.ProcessMesh([r], dim_names=["pp"]) for r in range(2)]
    model = TinyGPT(blocks=sum(per_mesh))
    stages = [s for s, n in enumerate(per_mesh) for _ in range(n)]
    for block, stage in zip(model.blocks, stages):
        for sub in block.sublayers(include_self=True):
            for name, param in list(sub.named_parameters(include_sublayers=False)):
                setattr(sub, name, dist.shard_tensor(param, meshes[stage], [dist.Replicate()]))
    return model


def test_uneven_stages_are_simulated_with_their_sizes():
    """7 blocks on pp 2, vpp 2 under the V placement: virtual stages of 2, 2, 1, 2 blocks get
    unit costs scaled by 2 / 1.75 and 1 / 1.75; costs the user gives win; even stages keep
    the unit costs."""
    from pipesplit.job_list.costs import Costs
    from pipesplit.passes.engine.strategy_checks import block_sizes
    from pipesplit.passes.engine.user_options import use_costs
    from pipesplit.passes.strategy import config_from_strategy

    section = pipeline(**ZBV)
    blocks = block_sizes(section, placed([4, 3]))
    assert blocks == [4, 3]
    costs = config_from_strategy(section, pp_stage=None, blocks=blocks).costs
    assert costs.forward == pytest.approx([2 / 1.75, 2 / 1.75, 1 / 1.75, 2 / 1.75])
    assert costs.backward_b == costs.backward_w == costs.forward
    given = Costs(forward=2.0)
    use_costs(section, given)
    assert config_from_strategy(section, pp_stage=None, blocks=blocks).costs == given
    even = pipeline(**ZBV)
    assert block_sizes(even, placed([2, 2])) is None
    assert config_from_strategy(even, pp_stage=None).costs is None


def test_uneven_layers_per_stage_mesh_are_served_as_paddle_serves_them():
    """Paddle's VPP test: 7 layers on pp 2, vpp 2 (each stage keeps its layers); a stage mesh
    with fewer layers than chunks is refused, naming it."""
    for per_mesh in ([4, 3], [2, 5]):
        check_model(pipeline(**ZBV), placed(per_mesh))
    with pytest.raises(ValueError, match=re.escape(
            "strategy.pipeline.vpp_seg_method='DecoderBlock': stage mesh [0] holds 1 "
            "DecoderBlock layer(s), fewer than strategy.pipeline.vpp_degree=2: each stage deals "
            "its layers to its 2 chunks and every chunk needs one (layers per stage mesh: "
            "[1, 6])")):
        check_model(pipeline(**ZBV), placed([1, 6]))
