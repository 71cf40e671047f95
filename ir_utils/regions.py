"""Control-flow ops (``pd_op.if``, ``pd_op.while``, ...) seen from the block that holds them.

An op with regions is kept whole: it is one op of its block, and every edit of pipesplit
(completion, the B / W split, extraction into sub-programs) treats it as one.  Two things make
it differ from an ordinary op, and this module is the one place that knows them:

* its regions read values of the outer blocks directly (PIR has no explicit capture list), so
  its inputs are its operands *and* those captured values (:func:`inputs_of`);
* a value used inside a region has the inner op as its user, so the user seen from the outer
  block is the region op that holds it (:func:`users_in`).

The backward of a control-flow op is another control-flow op that pops what the forward one
pushed onto a stack (``cf.stack_create`` makes the stack and its inlet / outlet;
``cf.tuple_push`` inside the forward's regions, ``cf.tuple_pop`` / ``cf.has_elements`` in the
backward): :func:`reads_a_stack` recognises that backward, :func:`pushing_op` finds the
forward op it belongs to.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional

#: ops that read a stack the forward filled: only a backward does
STACK_READERS = frozenset({"cf.tuple_pop", "cf.has_elements"})
STACK_CREATE = "cf.stack_create"


def has_regions(op) -> bool:
    return op.num_regions() > 0


def inner_ops(op) -> Iterator:
    """Every op inside ``op``'s regions, nested ones too, in program order."""
    for block in op.blocks():
        for inner in block.ops:
            yield inner
            if inner.num_regions() > 0:
                yield from inner_ops(inner)


def _defined_inside(op) -> set:
    ids = set()
    for block in _blocks(op):
        ids.update(a.id for a in block.args())
        ids.update(a.id for a in block.kwargs().values())
        for inner in block.ops:
            ids.update(r.id for r in inner.results())
    return ids


def _blocks(op) -> Iterator:
    for block in op.blocks():
        yield block
        for inner in block.ops:
            if inner.num_regions() > 0:
                yield from _blocks(inner)


def captured_values(op) -> List:
    """The values of outer blocks that ``op``'s regions read, each once, in first-use order."""
    if op.num_regions() == 0:
        return []
    inside = _defined_inside(op)
    seen, out = set(), []
    for inner in inner_ops(op):
        for v in inner.operands_source():
            if v is None or not v.initialized() or v.id in inside or v.id in seen:
                continue
            seen.add(v.id)
            out.append(v)
    return out


def inputs_of(op) -> List:
    """``op``'s operands (absent optional ones left out) and, for a control-flow op, the outer
    values its regions read."""
    own = [v for v in op.operands_source() if v is not None and v.initialized()]
    if op.num_regions() == 0:
        return own
    ids = {v.id for v in own}
    return own + [v for v in captured_values(op) if v.id not in ids]


def outermost(op, index: Dict) -> Optional[object]:
    """The op of ``index`` (the ops of one block) that is ``op`` or holds it in a region;
    None when ``op`` is in no block of ``index``'s ops."""
    while op is not None:
        if op in index:
            return op
        op = op.get_parent_block().parent_op
    return None


def users_in(value, index: Dict) -> List:
    """The ops of ``index`` that read ``value``: a use inside a region counts as a use by the
    region op of ``index`` that holds it.  Each op once, in the order the uses are listed."""
    out = []
    for user in value.all_used_ops():
        top = user if user in index else outermost(user, index)
        if top is not None and top not in out:
            out.append(top)
    return out


def reads_a_stack(op) -> bool:
    """Is ``op`` the backward of a control-flow op: does it (or an op inside it) pop or test a
    stack the forward pushed onto?"""
    if op.name() in STACK_READERS:
        return True
    return op.num_regions() > 0 and any(i.name() in STACK_READERS for i in inner_ops(op))


def pushing_op(backward_op, index: Dict) -> Optional[object]:
    """The op of ``index`` whose regions push onto a stack ``backward_op`` reads: the forward
    control-flow op whose backward it is (None when there is none)."""
    creates = []
    for v in inputs_of(backward_op):
        d = v.get_defining_op()
        if d is not None and d.name() == STACK_CREATE and d not in creates:
            creates.append(d)
    for create in creates:
        forward_op = pushing_op_of_stack(create, index)
        if forward_op is not None and forward_op is not backward_op:
            return forward_op
    return None


def pushing_op_of_stack(stack_create, index: Dict) -> Optional[object]:
    """The op of ``index`` that pushes onto ``stack_create``'s stack (through its inlet)."""
    users = users_in(stack_create.result(1), index)
    return users[0] if users else None


def variable_owner(value):
    """The value whose variable ``value`` lives in: a stack's inlet and outlet are its stack's
    variable (one ``cf.stack_create`` makes one variable), any other value is its own.  A
    value handed between sub-programs is handed by its owner's name, once."""
    op = value.get_defining_op()
    if op is not None and op.name() == STACK_CREATE:
        return op.result(0)
    return value
