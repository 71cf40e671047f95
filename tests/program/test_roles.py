"""The program-side vocabulary (ir_utils.roles) stays apart from the job IR (job_list.ir):
op roles are Paddle's ints, job kinds are strings (and live only in job_list.ir)."""
from pipesplit.ir_utils import roles
from pipesplit.job_list import ir


def test_roles_do_not_repeat_the_job_kinds():
    kind_names = {"KINDS", "COMPUTE_KINDS", "COMM_KINDS", *map(str.upper, ir.KINDS)}
    assert not kind_names & set(vars(roles))


def test_role_ids_are_paddles_op_roles_and_not_job_kinds():
    from paddle.base import core

    op_role = core.op_proto_and_checker_maker.OpRole
    role_ids = (roles.ROLE_FORWARD, roles.ROLE_BACKWARD, roles.ROLE_OPTIMIZE)
    assert role_ids == (int(op_role.Forward), int(op_role.Backward), int(op_role.Optimize))
    assert not set(role_ids) & set(ir.KINDS)
