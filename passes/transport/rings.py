"""One ring per group of ranks: every process gives a communication group it shares with others
the same ring id, before any communicator is made.

Paddle's auto-parallel ``new_process_group`` numbers a group by how many groups the process made
before it, so two processes that partition different programs (the stages of a pipeline, whose
reshards differ) number the same ranks differently: with sharding stage 3 at dp2 x pp2, ranks
[0, 1] are ring 15 on process 0 and ring 12 on process 1, and ring 14 is [0, 2] on process 2 but
[2, 3] on process 3.  Communicators meet by ring id (gloo's and NCCL's rendezvous keys), so such
a launch hangs or dies in ``instantiate``.

Before the engine makes its communicators (:func:`agree_on_rings`, from its ``_init_comm``):

1. every process publishes its groups (ring id, ranks, made yet or not) through the launcher's
   store (:meth:`~pipesplit.passes.transport.base.Transport.share`);
2. :func:`agreed_ids`, the same pure function on every process, keeps an id every holder of the
   group already uses and no other group claims, and gives every other group a fresh id from
   :data:`FRESH_RING_BASE` up, above all ids in use (deterministic: the groups in order of
   their ranks);
3. each process renumbers its own groups: the ``ring_id`` attribute of every op of the engine's
   programs and the key of each group in Paddle's table (:func:`renumber`);
4. the groups are made in ring-id order on every process (:func:`instantiate_in_order`), so no
   two processes wait on each other in crossed orders.

What cannot be mended is a :class:`RingDisagreement` (a ``RuntimeError``) on every process,
before any step: a group made already (its communicator exists) under different ids, or a
group a member never made (its communicator would wait forever for that member).
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Sequence, Set, Tuple

#: a group as one process holds it: (ring id, its ranks in order, its communicator made)
Held = Tuple[int, Tuple[int, ...], bool]
#: a group across processes: its ranks, and which of this process's groups of those ranks it
#: is (the n-th by ring id; Paddle makes a second group of the same ranks when forced)
GroupKey = Tuple[Tuple[int, ...], int]


#: where the ids given to renumbered groups start: far above the ids Paddle gives new groups
#: (the count of groups a process made, plus a small base), so a group Paddle makes later never
#: takes the id of a renumbered one
FRESH_RING_BASE = 1 << 16


class RingDisagreement(RuntimeError):
    """Processes that cannot agree on a ring (see the module docstring)."""


def held_groups() -> List[Held]:
    """This process's auto-parallel groups (Paddle's table), ring 0 (the world) left out."""
    from paddle.distributed.auto_parallel.static.process_group import get_all_process_groups

    return sorted((int(g.id), tuple(int(r) for r in g.ranks), bool(g.is_instantiate()))
                  for g in get_all_process_groups() if g.id != 0)


def _keys(held: Sequence[Held]) -> Dict[int, GroupKey]:
    """ring id -> key of each of one process's groups."""
    seen: Dict[Tuple[int, ...], int] = {}
    keys = {}
    for ring, ranks, _ in sorted(held):
        keys[ring] = (ranks, seen.get(ranks, 0))
        seen[ranks] = keys[ring][1] + 1
    return keys


def agreed_ids(tables: Mapping[int, Sequence[Held]], reserved: Iterable[int] = ()
               ) -> Dict[int, Dict[int, int]]:
    """process -> {its ring id: the agreed ring id} for every group each process holds
    (``tables[p]``: process p's :func:`held_groups`); ``reserved``: ids no new group may take
    (ring 0, the dygraph groups').  The same answer on every process given the same tables."""
    keys = {p: _keys(held) for p, held in tables.items()}
    made = {p: {ring for ring, _, done in held if done} for p, held in tables.items()}
    ids: Dict[GroupKey, Set[int]] = {}
    made_ids: Dict[GroupKey, Set[int]] = {}
    for p, by_ring in keys.items():
        for ring, key in by_ring.items():
            ids.setdefault(key, set()).add(ring)
            if ring in made[p]:
                made_ids.setdefault(key, set()).add(ring)
    _check_members(keys)
    taken = set(reserved) | {0}
    target: Dict[GroupKey, int] = {}
    for key in sorted(made_ids):  # a communicator exists: its id stays
        (ring,) = _one_id(key, made_ids[key], "made already")
        if ring in taken:
            raise RingDisagreement(f"ring {ring} was made for ranks {list(key[0])} and for "
                                   "another group of ranks on another process")
        target[key] = ring
        taken.add(ring)
    for key in sorted(ids):  # every holder uses one id that is still free: kept
        if key not in target and len(ids[key]) == 1 and next(iter(ids[key])) not in taken:
            target[key] = next(iter(ids[key]))
            taken.add(target[key])
    in_use = taken | {ring for rings in ids.values() for ring in rings}
    fresh = max(in_use | {FRESH_RING_BASE - 1}) + 1
    for key in sorted(ids):
        if key not in target:
            target[key] = fresh
            fresh += 1
    return {p: {ring: target[key] for ring, key in by_ring.items()} for p, by_ring in keys.items()}


def _one_id(key: GroupKey, rings: Set[int], why: str):
    if len(rings) > 1:
        a, b = sorted(rings)[:2]
        raise RingDisagreement(
            f"ranks {list(key[0])} are ring {a} on one process and ring {b} on another, and "
            f"their communicator was {why}: it cannot be renumbered (the processes built their "
            "programs in different orders; make the groups in the same order on every process)")
    return tuple(rings)


def _check_members(keys: Mapping[int, Mapping[int, GroupKey]]) -> None:
    """Every member of a group of two or more ranks holds it (else its communicator, made by
    the others, waits for that member forever)."""
    holders: Dict[GroupKey, Dict[int, int]] = {}
    for p, by_ring in keys.items():
        for ring, key in by_ring.items():
            holders.setdefault(key, {})[p] = ring
    for key, held_by in sorted(holders.items()):
        ranks = key[0]
        if len(ranks) < 2 or not set(ranks) & set(held_by):
            continue
        missing = sorted(set(ranks) & set(keys) - set(held_by))
        if missing:
            here = ", ".join(f"ring {ring} on process {p}" for p, ring in sorted(held_by.items()))
            raise RingDisagreement(
                f"the group of ranks {list(ranks)} ({here}) is not held by its member(s) "
                f"{missing}: its communicator would wait for them forever")


def rewrite_ring_ids(programs: Iterable, mapping: Mapping[int, int]) -> int:
    """Set every op's ``ring_id`` attribute (in every block) by ``mapping`` (old -> new, all at
    once); returns how many ops changed."""
    changed = 0
    for program in programs:
        for op in _ops(program.global_block()):
            if not op.has_attr("ring_id"):
                continue
            ring = int(op.attrs()["ring_id"])
            if mapping.get(ring, ring) != ring:
                op.set_int_attr("ring_id", mapping[ring])
                changed += 1
    return changed


def _ops(block):
    for op in block.ops:
        yield op
        for inner in op.blocks():
            yield from _ops(inner)


def renumber(programs: Iterable, mapping: Mapping[int, int]) -> None:
    """This process's groups and ``programs`` renumbered by ``mapping`` (old id -> new)."""
    from paddle.distributed.auto_parallel.static import process_group

    moved = {old: new for old, new in mapping.items() if old != new}
    if not moved:
        return
    rewrite_ring_ids(programs, moved)
    # not the patch table's: Paddle's group table is data, renumbered once before the
    # communicators are made, whose ids are then these; nothing to give back
    table = process_group._g_process_group_map
    groups = {old: table.pop(old) for old in moved}
    for old, group in groups.items():
        group._group_id = moved[old]
        table[moved[old]] = group


def dygraph_ring_ids() -> Set[int]:
    """The ids of the process's dygraph groups (``new_group`` / fleet): taken already."""
    from paddle.distributed import collective

    return {int(ring) for ring in collective._get_group_map()}


def agree_on_rings(programs: Sequence, share) -> Dict[int, int]:
    """Renumber this process's groups and ``programs`` to the ids every process agrees on
    (:func:`agreed_ids`, see the module docstring); ``share(value, key)`` gives every process's
    value (the transport's).  Returns this process's mapping (old id -> agreed id)."""
    import paddle.distributed as dist

    from pipesplit.passes.transport.launch_store import round_key

    rank = dist.get_rank()
    mine = {"held": held_groups(), "reserved": sorted(dygraph_ring_ids())}
    everyone = share(mine, round_key("rings", rank))
    tables = {p: [(int(r), tuple(ranks), bool(done)) for r, ranks, done in given["held"]]
              for p, given in enumerate(everyone)}
    reserved = {int(r) for given in everyone for r in given["reserved"]}
    mapping = agreed_ids(tables, reserved)[rank]
    renumber(programs, mapping)
    return mapping


def instantiate_in_order() -> None:
    """Make the communicator of every group this process holds, in ring-id order (the same
    order on every process once the ids agree)."""
    from paddle.distributed.auto_parallel.static.process_group import get_all_process_groups

    for group in sorted(get_all_process_groups(), key=lambda g: g.id):
        group.instantiate()
