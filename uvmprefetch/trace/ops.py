"""What a dispatched aten op launches and touches, read from the dispatcher's arguments: whether it launches a GPU
kernel (``launches_kernel``), the byte range a tensor spans in its storage (``tensor_extent``), its accesses
(``scan_op`` / ``accesses_of``: READ for inputs, READ|WRITE for arguments its schema marks mutable, WRITE for
outputs), its shape key and execution id, its FLOPs. Shared by the recorder (``trace/recorder.py``) and the live
runtime's observer; torch is imported on first use, so the module imports without it.
"""

from __future__ import annotations

from .format import READ, WRITE, exec_id_of

# Ops that launch no kernel on a GPU: allocation-only factories, scalar reads, storage plumbing; and
# ``detach_``, which autograd handles above the dispatch mode (a mode never sees it; the C++ observer would).
NO_KERNEL = frozenset({
    "aten::detach_",
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::lift_fresh", "aten::_local_scalar_dense", "aten::set_.source_Storage",
    "aten::set_.source_Storage_storage_offset", "aten::resize_", "aten::is_same_size", "aten::is_nonzero",
    "aten::_has_compatible_shallow_copy_type", "aten::record_stream",
})

# Namespaces of marker ops that launch nothing (profiler ranges, TorchScript primitives).
SKIP_NAMESPACES = ("profiler", "prim")

_DTYPE_NAMES = {"torch.float32": "fp32", "torch.float64": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def launches_kernel(func) -> bool:
    """Would ``func`` (an ``OpOverload``) launch a GPU kernel? Views, allocation-only ops and
    ``profiler::``/``prim::`` markers do not."""
    r = _LAUNCHES.get(func)
    if r is None:
        r = _LAUNCHES[func] = not (func.is_view or func.name() in NO_KERNEL
                                   or getattr(func, "namespace", "aten") in SKIP_NAMESPACES)
    return r


_LAUNCHES: dict = {}


def tensor_extent(t) -> tuple[int, int]:
    """(byte offset inside its storage, byte length) that a strided tensor spans; a non-contiguous view
    covers everything between its first and last element."""
    es = t.element_size()
    if t.is_contiguous():  # the common case: the extent is just the elements (same result, no stride walk)
        n = t.numel()
        return t.storage_offset() * es, n * es
    if t.numel() == 0:
        return t.storage_offset() * es, 0
    lo = hi = 0
    for n, st in zip(t.shape, t.stride()):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return (t.storage_offset() + lo) * es, (hi - lo + 1) * es


# ----------------------------------------------------------------------------------- the flat argument walk
# Dispatcher arguments are shallow: tensors, lists/tuples of tensors, scalars. ``tree_flatten`` costs ~10 us
# per op in Python; this walk visits the same leaves in the same order (lists and tuples of exactly those
# types are pytree nodes flattened in order; tensors and scalars are leaves) and hands anything else to
# ``tree_flatten`` itself, so its leaves are those of ``tree_flatten`` by construction.

_torch = _tree_flatten = _STRIDED = None  # torch is imported on first use: the module must import without it
_SCALARS: frozenset = frozenset()
_TENSOR_TYPES: frozenset = frozenset()
_DTYPE_STR: dict = {}  # torch.dtype -> 'float32' (``str(dtype)[6:]``)


def _init_torch():
    global _torch, _SCALARS, _TENSOR_TYPES, _STRIDED, _tree_flatten
    import torch
    from torch.utils._pytree import tree_flatten

    _torch, _tree_flatten = torch, tree_flatten
    _SCALARS = frozenset({int, float, bool, str, complex, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format})
    # exact types only: a tensor subclass might be a registered pytree node, so it takes the general path
    _TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
    _STRIDED = torch.strided


def _leaves(x, into: list) -> None:
    """Append the pytree leaves of ``x`` to ``into``, in ``tree_flatten`` order."""
    tp = type(x)
    if tp in _TENSOR_TYPES or tp in _SCALARS:
        into.append(x)
    elif tp is list or tp is tuple:
        for y in x:
            ty = type(y)
            if ty in _TENSOR_TYPES or ty in _SCALARS:
                into.append(y)
            else:
                _leaves(y, into)
    else:
        into.extend(_tree_flatten(x)[0])


def scan_op(func, args, kwargs, out, device_type: str):
    """One pass over a dispatched op's arguments: ``(accesses, shape_key, cache_key)``.

    ``accesses`` equals ``accesses_of(func, args, kwargs, out, device_type)`` and ``shape_key`` equals
    ``_shape_key(args, kwargs)``. ``cache_key`` is a hashable ``(func, shape_key)`` in which ``True``/``False``
    are told apart from 1/0 (equal as dict keys, different in the key's ``repr`` that the execution id
    hashes): a key for per-shape caches (``cached_exec_id``, ``cached_flops``).
    """
    if _torch is None:
        _init_torch()
    Tensor, strided, dstr, tensor_types = _torch.Tensor, _STRIDED, _DTYPE_STR, _TENSOR_TYPES
    acc, key = [], []
    has_bool = False
    mutable = _mutable_args(func)
    buf: list = []
    for src in (enumerate(args), (kwargs or {}).items()):
        for i, a in src:
            mode = READ | WRITE if i in mutable else READ
            buf.clear()
            _leaves(a, buf)
            for x in buf:
                if isinstance(x, Tensor):
                    d = x.dtype
                    s = dstr.get(d)
                    if s is None:
                        s = dstr[d] = str(d)[6:]
                    key.append((tuple(x.shape), s))
                    if x.layout == strided and x.device.type == device_type:
                        if type(x) in tensor_types:
                            acc.append((x, mode))
                        else:
                            _subclass_accesses(x, mode, acc)
                elif isinstance(x, (bool, int)):
                    key.append(x)
                    if x is True or x is False:
                        has_bool = True
    buf.clear()
    _leaves(out, buf)
    for x in buf:
        if isinstance(x, Tensor) and x.layout == strided and x.device.type == device_type:
            if type(x) in tensor_types:
                acc.append((x, WRITE))
            else:
                _subclass_accesses(x, WRITE, acc)
    key = tuple(key)
    ckey = (func, key)
    if has_bool:
        ckey = (func, tuple(("b", x) if x is True or x is False else x for x in key))
    return acc, key, ckey


def _subclass_accesses(x, mode: int, acc: list) -> None:
    """The accesses of a tensor subclass: a wrapper subclass (``DTensor``: FSDP2's parameters, their gradients
    and optimizer states) owns no memory of its own (its storage has no data pointer); the op runs on its inner
    tensors (``__tensor_flatten__``), which are what it touches."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    if not is_traceable_wrapper_subclass(x):
        acc.append((x, mode))  # a plain subclass: its own storage
        return
    for name in x.__tensor_flatten__()[0]:  # (torch 2.13's DTensor also names its DeviceMesh here)
        inner = getattr(x, name, None)
        if isinstance(inner, _torch.Tensor) and inner.layout == _STRIDED and inner.device.type == x.device.type:
            if type(inner) in _TENSOR_TYPES:
                acc.append((inner, mode))
            else:
                _subclass_accesses(inner, mode, acc)


def accesses_of(func, args, kwargs, out, device_type: str) -> list:
    """``[(tensor, mode)]`` for one dispatched op: inputs READ (READ|WRITE when the op's schema marks the
    argument mutable), outputs WRITE. Only strided tensors on ``device_type`` count (others stay on the host
    in a GPU run). Reusable by live observers: it needs nothing but the dispatcher's arguments."""
    return scan_op(func, args, kwargs, out, device_type)[0]


_MUTABLE: dict = {}


def _mutable_args(func) -> frozenset:
    r = _MUTABLE.get(func)
    if r is None:
        s = set()
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                s.update((i, a.name))
        r = _MUTABLE[func] = frozenset(s)
    return r


def flops_of(func, args, kwargs, out) -> float:
    """FLOPs of one op from ``torch.utils.flop_counter``'s registry (0 for ops it does not know)."""
    from torch.utils.flop_counter import flop_registry

    fn = flop_registry.get(func._overloadpacket)
    if fn is None:
        return 0.0
    try:
        return float(fn(*args, **(kwargs or {}), out_val=out))
    except Exception:  # noqa: BLE001 - a counter that cannot handle these arguments means "unknown", not an error
        return 0.0


def _shape_key(args, kwargs):
    """Shapes and dtypes of every tensor argument, and int/bool arguments (floats such as bias corrections
    change every step and would give the same kernel a new execution id each iteration)."""
    if _torch is None:
        _init_torch()
    Tensor = _torch.Tensor
    buf: list = []
    _leaves(args, buf)
    if kwargs:
        for v in kwargs.values():  # a dict flattens to its values in insertion order
            _leaves(v, buf)
    key = []
    for x in buf:
        if isinstance(x, Tensor):
            key.append((tuple(x.shape), str(x.dtype)[6:]))
        elif isinstance(x, (bool, int)):
            key.append(x)
    return tuple(key)


# Per-shape caches for the live observer. An execution id is a hash of the name and the shape key; a FLOP
# count is cached only for ops whose counter reads nothing but shapes and int/bool arguments (all in the
# key); attention counters also read sequence-length tensors' values (nested inputs), so they are not cached.
_EXEC_IDS: dict = {}
_FLOPS: dict = {}
_SHAPE_ONLY_FLOPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution",
                               "convolution_backward", "cudnn_convolution", "convolution_overrideable",
                               "_slow_conv2d_forward"})
_CACHE_MAX = 1 << 16  # distinct (op, shapes) pairs; a program with more (dynamic shapes) just stops caching


def cached_exec_id(name: str, key, ckey) -> int:
    """``exec_id_of(name, key)``, memoised on ``ckey`` (from ``scan_op``)."""
    e = _EXEC_IDS.get(ckey)
    if e is None:
        e = exec_id_of(name, key)
        if len(_EXEC_IDS) < _CACHE_MAX:
            _EXEC_IDS[ckey] = e
    return e


def cached_flops(func, args, kwargs, out, ckey) -> float:
    """``flops_of(func, args, kwargs, out)``; memoised on ``ckey`` for shape-only counters, 0.0 at once for
    ops the counter does not know."""
    f = _FLOPS.get(ckey)
    if f is not None:
        return f
    packet = func._overloadpacket
    if packet not in _flop_registry():
        return 0.0
    f = flops_of(func, args, kwargs, out)
    if packet.__name__ in _SHAPE_ONLY_FLOPS and len(_FLOPS) < _CACHE_MAX:
        _FLOPS[ckey] = f
    return f


_REGISTRY = None


def _flop_registry():
    global _REGISTRY
    if _REGISTRY is None:
        from torch.utils.flop_counter import flop_registry
        _REGISTRY = flop_registry
    return _REGISTRY
