"""What the GPU-structure scripts record of a program: every collective / p2p op (ring, its
processes, peer, stream, events) and the event edges of compute ops."""
from paddle.distributed.auto_parallel.static.process_group import get_process_group

KEYS = ("ring_id", "peer", "pipesplit_peer", "nranks", "event_to_record", "events_to_wait")


def describe(program):
    out = []
    for op in program.global_block().ops:
        attrs = op.attrs()
        entry = {"op": op.name()}
        for key in KEYS:
            if key in attrs and attrs[key] not in ("", [], None):
                entry[key] = list(attrs[key]) if isinstance(attrs[key], list) else attrs[key]
        if "ring_id" in entry:
            group = get_process_group(entry["ring_id"])
            entry["ring_ranks"] = list(group.ranks) if group is not None else None
            shape = op.operand_source(0).shape if op.num_operands() else attrs.get("out_shape")
            entry["shape"] = [int(d) for d in shape]
        if op.name() in ("pd_op.send_v2", "pd_op.recv_v2"):
            entry["stream"] = attrs.get("execution_stream")
        if len(entry) > 1:
            out.append(entry)
    return out
