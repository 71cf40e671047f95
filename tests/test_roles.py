"""The program-side vocabulary (ir_utils.roles) agrees with the job IR (job_list.ir): ir_utils
may not import job_list, so the communication kinds are written in both."""
from pipesplit.ir_utils import roles
from pipesplit.job_list import ir


def test_comm_kinds_are_the_job_irs():
    assert roles.COMM_KINDS == ir.COMM_KINDS
    assert (roles.SEND_FORWARD, roles.RECV_FORWARD, roles.SEND_BACKWARD, roles.RECV_BACKWARD) == \
        (ir.SEND_FORWARD, ir.RECV_FORWARD, ir.SEND_BACKWARD, ir.RECV_BACKWARD)


def test_role_ids_are_paddles_op_roles_and_not_job_kinds():
    from paddle.base import core

    op_role = core.op_proto_and_checker_maker.OpRole
    role_ids = (roles.ROLE_FORWARD, roles.ROLE_BACKWARD, roles.ROLE_OPTIMIZE)
    assert role_ids == (int(op_role.Forward), int(op_role.Backward), int(op_role.Optimize))
    assert not set(role_ids) & set(ir.KINDS)
