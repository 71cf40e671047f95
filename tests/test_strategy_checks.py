"""The engine user's ``strategy.pipeline`` checked before the engine builds anything
(:mod:`pipesplit.passes.strategy_checks`): real ``paddle.distributed.Strategy()`` objects and
real ``paddle.nn`` models, one process, no program built."""
from __future__ import annotations

import copy
import re

import paddle
import pytest

from pipesplit.passes.strategy_checks import (check_engine_strategy, check_fields, check_model,
                                              check_world)


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


def pipeline(**fields):
    """``strategy.pipeline`` with Paddle's defaults, pipeline enabled, and ``fields`` set."""
    section = paddle.distributed.Strategy().pipeline
    section.enable = True
    for name, value in fields.items():
        setattr(section, name, value)
    return section


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
    section = pipeline(**{**ZBV, field: value})
    before = copy.deepcopy(vars(section))
    with pytest.raises(error, match=starts(message)):
        check_fields(section)
    with pytest.raises(error, match=starts(message)):  # fields come first
        check_engine_strategy(section, TinyGPT(blocks=3), world_size=3)
    assert vars(section) == before


@pytest.mark.parametrize("pp,world", [(3, 2), (4, 2), (2, 1), (3, 4)])
def test_pp_degree_must_divide_the_processes(pp, world):
    section = pipeline(**{**ZBV, "pp_degree": pp, "vpp_degree": 1})
    processes = f"{world} process{'es' if world > 1 else ''}"
    message = starts(f"strategy.pipeline.pp_degree={pp} does not divide the {processes} of this "
                     "job: each pipeline stage runs on world size / pp_degree processes, so "
                     "pp_degree must divide the world size and be <= it")
    with pytest.raises(ValueError, match=message):
        check_world(section, world)
    with pytest.raises(ValueError, match=message):
        check_engine_strategy(section, TinyGPT(blocks=pp * 2), world)


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
     "strategy.pipeline.vpp_seg_method='DecoderBlock' names 3 DecoderBlock layers, not a "
     "positive multiple of strategy.pipeline.pp_degree x strategy.pipeline.vpp_degree = "
     "2 x 2 = 4"),
    (dict(vpp_seg_method="TinyGPT"), 4,  # the whole model: one block
     "strategy.pipeline.vpp_seg_method='TinyGPT' names 1 TinyGPT layer, not a positive "
     "multiple of strategy.pipeline.pp_degree x strategy.pipeline.vpp_degree = 2 x 2 = 4"),
])
def test_seg_method_must_name_the_blocks(fields, blocks, message):
    section = pipeline(**{**ZBV, **fields})
    before = copy.deepcopy(vars(section))
    with pytest.raises(ValueError, match=starts(message)):
        check_model(section, TinyGPT(blocks=blocks))
    with pytest.raises(ValueError, match=starts(message)):
        check_engine_strategy(section, TinyGPT(blocks=blocks), world_size=2)
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
    section = pipeline(**fields)
    before = copy.deepcopy(vars(section))
    assert check_engine_strategy(section, TinyGPT(blocks=blocks), world) is None
    assert vars(section) == before


def test_without_a_layer_only_the_strategy_is_checked():
    # the engine also takes None or a function as its model: no layers to look at
    for model in (None, lambda ids: TinyGPT(blocks=3)(ids)):
        check_engine_strategy(pipeline(**{**ZBV, "vpp_seg_method": "NoSuchBlock"}), model, 2)
    with pytest.raises(ValueError, match=starts("strategy.pipeline.pp_degree=2 does not divide")):
        check_engine_strategy(pipeline(**ZBV), None, 3)
