"""What pipesplit's stand-ins for Paddle's CPU-blind engine functions do (why each gap exists:
:mod:`pipesplit.passes.cpu_support`).  Each ``hook(original)`` returns the function installed
in place of Paddle's ``original``; the replacing itself is
:mod:`pipesplit.passes.engine.paddle_patches` (group ``"cpu"``, enabled by
:func:`pipesplit.passes.cpu_support.enable`)."""
from __future__ import annotations

import contextlib

from pipesplit.passes._paddle import require_supported_paddle
from pipesplit.passes.transport import GLOO

paddle = require_supported_paddle()

#: the rings this process registered a gloo comm context for (once per ring and process)
_gloo_rings: set = set()


def instantiate_gloo(group) -> None:
    """``ProcessGroup.instantiate`` for a CPU build: a gloo comm context for the group's ring."""
    from paddle.distributed.auto_parallel.static.process_group import _get_global_env

    if group._is_instantiate:
        return
    rank = _get_global_env().rank
    if group.nranks >= 2 and rank in group.ranks and group.id != 0 \
            and group.id not in _gloo_rings:
        core = paddle.base.core
        core.CommContextManager.create_gloo_comm_context(
            core.create_or_get_global_tcp_store(), str(group.id), group.local_rank(rank),
            group.nranks)
        _gloo_rings.add(group.id)
    group._is_instantiate = True


def _moves_between_meshes(tensor, dist_attr) -> bool:
    """A tensor going to another process mesh of the same shape with the same placements (a
    parameter whose stage moved to another rank, as chunk completion does for vpp > 1)."""
    src, dst = tensor.process_mesh, dist_attr.process_mesh
    return src.process_ids != dst.process_ids and list(src.shape) == list(dst.shape) \
        and _dims_mapping(tensor.placements, len(tensor.shape)) == list(dist_attr.dims_mapping) \
        and not dist_attr._is_partial()


def _dims_mapping(placements, ndim):
    """The dims mapping of ``placements`` (None when a placement is partial)."""
    mapping = [-1] * ndim
    for axis, placement in enumerate(placements):
        if placement.is_partial():
            return None
        if placement.is_shard():
            mapping[placement.get_dim()] = axis
    return mapping


def reshard(original):
    def reshard(tensor, dist_attr):
        if tensor.is_dist() and _moves_between_meshes(tensor, dist_attr):
            return _move_between_meshes(tensor, dist_attr)
        if not tensor._is_initialized():
            return _placed_elsewhere(tensor, dist_attr)
        if tensor.is_dist() and _changes_a_dim_of_one(tensor, dist_attr):
            return _without_dims_of_one(original, tensor, dist_attr)
        return original(tensor, dist_attr)
    return reshard


def _target_placements(dist_attr):
    from paddle.distributed.auto_parallel.placement_type import to_placements

    return to_placements(dist_attr.dims_mapping, dist_attr.process_mesh,
                         list(dist_attr._partial_dims()))


def _changes_a_dim_of_one(tensor, dist_attr) -> bool:
    """A reshard on one mesh, of a tensor placed other than ``Replicate`` on a mesh dimension
    of size 1 or to be so placed (a weight ``Shard`` on a dp x mp mesh's mp of 1, re-sharded
    over dp by ``ShardingStage3``).  Paddle 3.0.0 gathers over that dimension first, making a
    comm context of its one process, and its CPU executor then gives every later collective
    that context (``nranks: 4 should equal to 1``)."""
    src, mesh = tensor.process_mesh, dist_attr.process_mesh
    if list(src.process_ids) != list(mesh.process_ids) or list(src.shape) != list(mesh.shape):
        return False
    source, target = list(tensor.placements), _target_placements(dist_attr)
    return str(source) != str(target) and any(
        size == 1 and not (a.is_replicated() and b.is_replicated())
        for size, a, b in zip(mesh.shape, source, target))


def _without_dims_of_one(original, tensor, dist_attr):
    """The reshard with every placement on a mesh dimension of size 1 read as ``Replicate``
    (one process holds the whole of a ``Shard`` there, and a ``Partial`` sum of one is its
    value): the same local values, no communication over a dimension of one."""
    from paddle.distributed.auto_parallel.api import dtensor_from_local
    from paddle.distributed.auto_parallel.placement_type import to_dim_map

    mesh, target = dist_attr.process_mesh, _target_placements(dist_attr)

    def flat(placements):
        return [paddle.distributed.Replicate() if size == 1 else p
                for size, p in zip(mesh.shape, placements)]

    with _dygraph():
        source = dtensor_from_local(tensor._local_value(), mesh, flat(tensor.placements))
    dims_mapping, partial = to_dim_map(flat(target), len(tensor.shape))
    attr = paddle.base.core.TensorDistAttr()
    attr.process_mesh, attr.dims_mapping = mesh, dims_mapping
    if partial:
        attr._set_partial_dims(list(partial))
    moved = original(source, attr)
    with _dygraph():
        return dtensor_from_local(moved._local_value(), mesh, target)


def _placed_elsewhere(tensor, dist_attr):
    """Another rank's tensor (no data here) with the placements it is resharded to, as
    Paddle's reshard gives a rank outside the mesh on a GPU: nothing moves, but what this
    process's program reads of it follows (``ShardingStage3`` shards every parameter this
    way, also those of other stages, which a vpp > 1 placement may move onto this rank).  A
    tensor that is not a dist tensor comes back as it is."""
    if not tensor.is_dist():
        return tensor
    from paddle.distributed.auto_parallel.placement_type import to_placements

    mesh = dist_attr.process_mesh
    placements = to_placements(dist_attr.dims_mapping, mesh, list(dist_attr._partial_dims()))
    with _dygraph():
        return paddle.Tensor(_no_bytes_here(tensor), dims=tensor.shape, process_mesh=mesh,
                             placements=placements)


def _no_bytes_here(tensor):
    """The local value of another rank's tensor as a dist tensor may hold it: a parameter made
    eagerly has an empty one; one made under ``paddle.LazyGuard()`` (PaddleNLP's pretraining
    script) keeps its full local shape with no allocation, which a dist tensor cannot wrap
    (``Tensor's dimension is out of bound``), so it gets the empty local value too."""
    import math

    local = tensor._local_value()
    if local._is_initialized() or math.prod(int(d) for d in local.shape) == 0:
        return local
    return paddle.empty([0], dtype=tensor.dtype)


def _move_between_meshes(tensor, dist_attr):
    """Paddle's same-status reshard (p2p) crashes on CPU: broadcast the value from the first
    rank of the source mesh over the gloo world group instead (every rank takes part, in the
    engine's parameter order); ranks of the target mesh get it as a replicated dist tensor,
    the others an empty tensor (the caller then drops the parameter there)."""
    with _dygraph():
        return _broadcast_to_mesh(tensor, dist_attr)


@contextlib.contextmanager
def _dygraph():
    """Dygraph mode inside (the engine reshards parameters in static mode; a dygraph tensor
    made in static mode crashes the process)."""
    static = not paddle.in_dynamic_mode()
    if static:
        paddle.disable_static()
    try:
        yield
    finally:
        if static:
            paddle.enable_static()


def _broadcast_to_mesh(tensor, dist_attr):
    """Position k of the source mesh sends its local piece to position k of the target mesh:
    one broadcast over the world group per position, every rank taking part in each."""
    from paddle.distributed.auto_parallel.api import dtensor_from_local

    rank = paddle.distributed.get_rank()
    src, dst = tensor.process_mesh.process_ids, dist_attr.process_mesh.process_ids
    shape = _local_shape(tensor.shape, dist_attr)
    mine = None
    for root, receiver in zip(src, dst):
        buf = tensor._local_value().clone() if rank == root else paddle.zeros(shape, tensor.dtype)
        paddle.distributed.broadcast(buf, src=root)
        if rank == receiver:
            mine = buf
    if mine is None:
        return paddle.Tensor()
    return dtensor_from_local(mine, dist_attr.process_mesh, tensor.placements)


def _local_shape(shape, dist_attr):
    """Each rank's piece of a tensor of global ``shape`` sharded by ``dist_attr`` (even split)."""
    local = list(shape)
    mesh_shape = dist_attr.process_mesh.shape
    for dim, axis in enumerate(dist_attr.dims_mapping):
        if axis >= 0:
            local[dim] //= mesh_shape[axis]
    return local


def barrier(original):
    def barrier(x, out, *attrs):
        ring = dict(zip(attrs[::2], attrs[1::2])).get("ring_id", 0)
        if ring == 0:
            paddle.distributed.barrier()
            return out
        return original(x, out, *attrs)
    return barrier


def set_plan(original):
    def _set_plan(executor, plan):
        """Paddle's own pipeline plans carry NCCL-style send_v2 / recv_v2, whose CPU kernels
        are stubs: they become gloo broadcasts (what pipesplit's CPU transport uses)."""
        from paddle.distributed.auto_parallel.static.process_group import get_process_group
        from pipesplit.passes.transport.p2p import drop_event_dependencies, p2p_to_gloo_broadcasts

        rank = paddle.distributed.get_rank()
        programs = [plan.ir_program(t) for t in plan.job_types()]
        if sum(p2p_to_gloo_broadcasts(p, rank, lambda ring: get_process_group(ring).ranks)
               for p in programs):
            for p in programs:
                drop_event_dependencies(p)
        return original(executor, plan)
    return _set_plan


def dist_model_init(original):
    def __init__(self, *args, **kwargs):
        """``DistModel`` calls ``fleet.init`` when the launcher set ``POD_NAME``; its hybrid
        gloo groups (which the engine does not use; a rendezvous each, see
        :func:`gloo_group_store`) are skipped on CPU.  What the engine does need of it is the
        global group (its barrier, the parameter broadcast between meshes, every gloo ring):
        created here when the script has not created it (Paddle's own tests never call
        ``dist.init_parallel_env()``), left alone when it has."""
        import os

        pod = os.environ.pop("POD_NAME", None)
        try:
            if paddle.distributed.get_world_size() > 1:
                ensure_global_group()
            original(self, *args, **kwargs)
        finally:
            if pod is not None:
                os.environ["POD_NAME"] = pod
    return __init__


def ensure_global_group() -> bool:
    """Create the global (gloo) group with ``dist.init_parallel_env()`` unless it exists, as
    ``fleet.init`` would have; True when this call created it."""
    if paddle.distributed.is_initialized():
        return False
    paddle.distributed.init_parallel_env()
    return True


def gloo_group_store(original):
    def _new_process_group_impl(backend, store, *args, **kwargs):
        """Paddle's ``ProcessGroupGloo.create`` rendezvous twice in the store it is given: its
        comm context under keys prefixed by the group id, and the group's own gloo context
        under the bare member numbers ``"0"``, ``"1"`` ... - the keys the global group wrote
        first and every later group writes again.  A member then reads a peer's address left
        by an earlier group, or by another group created at the same time (fleet's pipe
        groups [0, 1] and [2, 3]): ``connect ...: Connection refused`` (that pair's listener
        is gone) or a gloo ``TIMEOUT`` (a pair wired to the wrong process).  Each gloo group
        created through ``new_group`` gets a store of its own instead (served by its first
        member, announced in the launcher's store)."""
        if backend != GLOO or store is None:
            return original(backend, store, *args, **kwargs)
        import inspect

        call = inspect.signature(original).bind(backend, store, *args, **kwargs)
        call.apply_defaults()
        call.arguments["store"] = group_store(store, call.arguments["rank"],
                                              call.arguments["group_id"])
        return original(*call.args, **call.kwargs)
    return _new_process_group_impl


#: how often the first member of a gloo group tries a free port for the group's store
_STORE_PORT_TRIES = 20


def group_store(store, rank: int, group_id: int):
    """A TCP store for one gloo group's rendezvous: served by the member of group rank 0 on a
    free port, whose ``host:port`` it sets under a key no earlier group used (a round of
    :mod:`~pipesplit.passes.transport.launch_store`, per group id); the other members read it
    there and connect.  The store lives as long as the group (Paddle's group holds it)."""
    import os

    from paddle.distributed.collective import _get_global_env
    from pipesplit.passes.transport.launch_store import round_key

    env = _get_global_env()
    key = round_key(f"gloo_group_store/{group_id}", env.rank, store)
    timeout = int(os.getenv("FLAGS_stop_check_timeout", "900"))
    if rank != 0:
        host, port = bytes(store.get(key)).decode().rsplit(":", 1)
        return paddle.base.core.TCPStore(host, int(port), False, 0, timeout)
    host = (env.current_endpoint or "").rsplit(":", 1)[0] or "127.0.0.1"
    own, port = _serve_store(timeout)
    store.set(key, f"{host}:{port}".encode())
    return own


def _serve_store(timeout: int):
    """A master TCP store (waiting for no workers) on a free port, and the port.  Paddle's
    plain socket server, not its libuv one: libuv aborts the process when the port was taken
    in between; the plain one raises, and the next free port is tried."""
    import socket

    flag = "FLAGS_tcp_store_using_libuv"
    try:
        libuv = paddle.get_flags(flag)[flag]
    except ValueError:  # Paddle 3.1 / 3.2: no libuv store (nor its flag): the plain server
        libuv = None
    if libuv is not None:
        paddle.set_flags({flag: False})
    try:
        for attempt in range(_STORE_PORT_TRIES):
            with socket.socket() as probe:
                probe.bind(("", 0))
                port = probe.getsockname()[1]
            try:
                return paddle.base.core.TCPStore("127.0.0.1", port, True, 0, timeout), port
            except ValueError:
                if attempt == _STORE_PORT_TRIES - 1:
                    raise
    finally:
        if libuv is not None:
            paddle.set_flags({flag: libuv})
