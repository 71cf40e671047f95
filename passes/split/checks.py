"""What the pass checks on its inputs before any work (read-only: the input is never modified).

Each check refuses, with a ``TypeError`` / ``ValueError`` naming the parameter, an input the
pass cannot serve correctly; the checks that need the completed program (data flowing against
the pipeline) run on the pass's clone, in :func:`pipesplit.ir_utils.split_program`.
"""
from __future__ import annotations

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.job_list.request import PipelineConfig

paddle = require_supported_paddle()

from pipesplit.ir_utils.checks import check_one_optimizer_step  # noqa: E402


def _type_name(value) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def check_programs(main_program, startup_program) -> None:
    """Both are PIR programs (Paddle's C++ would crash or fail obscurely on anything else)."""
    if not isinstance(main_program, paddle.pir.Program):
        raise TypeError(f"main_program must be a paddle.pir.Program (a static program built "
                        f"with PIR, Paddle's default), got {_type_name(main_program)}")
    if startup_program is not None and not isinstance(startup_program, paddle.pir.Program):
        raise TypeError(f"startup_program must be a paddle.pir.Program or None, got "
                        f"{_type_name(startup_program)}")


def program_chunk_ids(program) -> set:
    """The chunk ids the user set (completion gives the other ops one of these)."""
    return {op.chunk_id for op in program.global_block().ops
            if op.has_attr("chunk_id") and op.chunk_id is not None and op.chunk_id >= 0}


def check_chunk_ids(program, config: PipelineConfig) -> None:
    """The program's chunk ids are exactly the ``pp_degree * vpp_degree`` global stages."""
    if program.global_block().num_ops() == 0:
        raise ValueError("main_program has no ops")
    found = program_chunk_ids(program)
    stages = config.num_stages
    if found == set(range(stages)):
        return
    layout = f"pp_degree x vpp_degree = {config.pp_degree} x {config.vpp_degree} = {stages} " \
             f"stage{'s' if stages > 1 else ''}"
    what = f"the program's chunk ids are {sorted(found)}" if found else \
        "the program has no chunk ids"
    raise ValueError(f"{layout}, but {what}; tag the layers of stage s with "
                     f"pir_chunk_id_guard(s), s = 0 .. {stages - 1} (in model order)")


def check_pass_inputs(main_program, startup_program, config: PipelineConfig) -> None:
    """Everything the pass can check before cloning ``main_program``."""
    check_programs(main_program, startup_program)
    check_chunk_ids(main_program, config)
    check_one_optimizer_step(main_program)
