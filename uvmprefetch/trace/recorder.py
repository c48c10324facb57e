"""Record what a PyTorch training step launches and touches, with no GPU: a ``TorchDispatchMode`` over meta
tensors (or real CPU tensors: the same code path).

Every aten op that would launch a GPU kernel becomes one trace launch. Its accesses are the storages of its
tensor arguments and outputs: the byte range a (possibly non-contiguous) view spans inside its storage,
READ for inputs, READ|WRITE for arguments the op's schema marks mutable, WRITE for outputs. A storage
becomes an allocation the first time a recorded launch touches it (or when registered up front, like the
parameters of a model built before recording) and is freed when PyTorch frees it: a ``weakref.finalize``
on the storage's Python object, which PyTorch keeps alive exactly as long as the storage itself.

To see the kernels a CUDA run would launch, the recorder routes ``F.scaled_dot_product_attention`` to the
memory-efficient (fp32, or with a mask) or flash (fp16/bf16) attention kernels, and ``F.dropout`` to
``native_dropout``. Meta tensors have kernels for these; on real CPU tensors the attention kernels are
emulated with the math formula (same outputs, shapes and strides as the CUDA kernels; dropout inside
attention is not applied on the CPU, see ``docs/recording.md``).

Phases: ``backward`` while the autograd engine runs a node, ``optimizer`` between the global optimizer step
hooks, ``forward`` otherwise. Each optimizer step ends an iteration.
"""

from __future__ import annotations

import collections
import contextlib
import math
import weakref
from dataclasses import dataclass

from ..errors import RecordError
from ..gpus import DEFAULT_GPU, get_profile
from .format import KIND, PHASE, READ, WRITE, Trace, TraceBuilder, exec_id_of
from .roofline import estimate

RECORDER_VERSION = 1

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


@dataclass
class _Alloc:
    id: int
    size: int


class Recorder:
    """Context manager that records every kernel-launching op of the code inside it into a ``Trace``.

    Parameters
    ----------
    device : str
        Device type whose tensors are "on the GPU": 'meta' (default), 'cpu', or 'cuda'.
    gpu : str
        GPU profile the durations are estimated for (``uvmprefetch.gpus.PROFILES``).
    max_iters : int, optional
        Stop recording after this many optimizer steps; ``on_stop`` is then called (e.g. to end a script).
    on_stop : callable, optional
        Called with no arguments when ``max_iters`` steps have been recorded.
    meta : dict, optional
        Extra entries for the trace's meta.
    route_kernels : bool
        Route attention and dropout to the kernels CUDA would use (default: on unless ``device == 'cuda'``).
    progress : tqdm-like, optional
        ``.update(1)`` is called after every optimizer step.
    measure : bool, optional
        On ``device='cuda'`` (the default there), time every recorded launch with CUDA events and store
        the measured durations (``meta['durations'] = 'measured (cuda events)'``) instead of estimates.

    Raises
    ------
    RecordError
        Unknown ``device`` or ``max_iters`` < 1.
    ConfigError
        Unknown ``gpu`` profile.

    Examples
    --------
    >>> with Recorder(max_iters=3) as rec:      # doctest: +SKIP
    ...     train()                              # any code; tensors on meta are "the GPU"
    >>> trace = rec.trace()
    """

    def __init__(self, *, device: str = "meta", gpu: str = DEFAULT_GPU, max_iters: int | None = None,
                 on_stop=None, meta: dict | None = None, route_kernels: bool | None = None,
                 progress=None, measure: bool | None = None) -> None:
        if device not in ("meta", "cpu", "cuda"):
            raise RecordError(f"device {device!r}: expected meta, cpu or cuda")
        if max_iters is not None and max_iters < 1:
            raise RecordError(f"max_iters must be >= 1, got {max_iters}")
        self.device = device
        self.profile = get_profile(gpu)
        self.max_iters = max_iters
        self.on_stop = on_stop
        self.route_kernels = device != "cuda" if route_kernels is None else route_kernels
        self.progress = progress
        self.measure = device == "cuda" if measure is None else measure
        if self.measure and device != "cuda":
            raise RecordError("measured durations need device='cuda'")
        self._events: list = []  # (launch index, start event, end event) when measuring
        self.builder = TraceBuilder({"format": "uvmprefetch-trace", "recorder": RECORDER_VERSION,
                                     "device": device, "gpu": gpu, "durations": "estimated", **(meta or {})})
        self.builder.iteration = 0
        self.active = False
        self.steps = 0
        self.default_kind = KIND["activation"]
        self._live: dict[int, _Alloc] = {}  # StorageImpl address -> allocation (live storages only)
        self._dead: collections.deque = collections.deque()
        self._in_opt = False
        self._exit = contextlib.ExitStack()

    # ----------------------------------------------------------------------------------------- context

    def __enter__(self) -> "Recorder":
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        ex = self._exit
        if self.route_kernels:
            ex.enter_context(route_cuda_kernels())
        ex.callback(register_optimizer_step_pre_hook(self._opt_pre).remove)
        ex.callback(register_optimizer_step_post_hook(self._opt_post).remove)
        ex.enter_context(_make_mode(self, torch))
        self.active = True
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            self._drain()
        self.active = False
        self._exit.close()

    def stop(self) -> None:
        """Stop recording now (frees that already happened are kept)."""
        if self.active:
            self._drain()
        self.active = False

    @contextlib.contextmanager
    def paused(self):
        """Run the body unrecorded (e.g. building a model); storages it creates are seen when first used."""
        was, self.active = self.active, False
        try:
            yield
        finally:
            self.active = was

    # ----------------------------------------------------------------------------------------- tagging

    def register(self, tensors, kind: str) -> None:
        """Record the storages of ``tensors`` as allocated now (if not yet known) and of ``kind``."""
        for t in tensors:
            if t is None or t.device.type != self.device:
                continue
            st = t.untyped_storage()
            if st.nbytes() > 0:
                self._alloc_of(st, KIND[kind])
                self.builder.alloc_kind[self._live[st._cdata].id] = KIND[kind]

    def tag(self, tensors, kind: str) -> None:
        """Set the kind of the (already known) allocations backing ``tensors``."""
        k = KIND[kind]
        for t in tensors:
            if t is None or getattr(t, "device", None) is None or t.device.type != self.device:
                continue
            a = self._live.get(t.untyped_storage()._cdata)
            if a is not None:
                self.builder.alloc_kind[a.id] = k

    def _opt_pre(self, opt, args, kwargs) -> None:
        if not self.active:
            return
        params = [p for g in opt.param_groups for p in g["params"]]
        self.tag(params, "param")
        self.tag([p.grad for p in params], "grad")
        self._in_opt = True

    def _opt_post(self, opt, args, kwargs) -> None:
        if not self.active:
            return
        import torch
        state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        self.tag(state, "optimizer")
        self._in_opt = False
        self.steps += 1
        self.builder.iteration = self.steps
        if self.progress is not None:
            self.progress.update(1)
        if self.max_iters is not None and self.steps >= self.max_iters:
            self.stop()
            if self.on_stop is not None:
                self.on_stop()

    # ----------------------------------------------------------------------------------------- recording

    def _drain(self) -> None:
        b = self.builder
        while self._dead:
            key, a = self._dead.popleft()
            if self._live.get(key) is a:
                del self._live[key]
            if b.free_at[a.id] < 0:
                b.free(a.id)

    def _alloc_of(self, st, kind: int) -> _Alloc:
        key, nbytes = st._cdata, st.nbytes()
        a = self._live.get(key)
        if a is not None and a.size >= nbytes:
            return a
        if a is not None:  # the storage grew (resize_): from now on it is a new, larger allocation
            self.builder.free(a.id)
        a = self._live[key] = _Alloc(self.builder.alloc(nbytes, kind), nbytes)
        f = weakref.finalize(st, self._dead.append, (key, a))
        f.atexit = False
        return a

    def on_op(self, func, args, kwargs, out, events=None) -> None:
        """Record one dispatched op (called by the dispatch mode after the op ran; ``events`` = the CUDA
        start/end events around it when measuring)."""
        import torch

        self._drain()
        acc = accesses_of(func, args, kwargs, out, self.device)
        if not acc:
            return
        if torch._C._current_autograd_node() is not None:
            phase = PHASE["backward"]
        elif self._in_opt:
            phase = PHASE["optimizer"]
            # AdamW keeps its `step` counters on the host unless capturable: ops on 0-dim tensors only
            # are host work in a GPU run (on meta those counters are CPU tensors and never get here).
            if all(t.dim() == 0 for t, _ in acc):
                return
        else:
            phase = PHASE["forward"]
        kind = KIND["other"] if phase == PHASE["optimizer"] else self.default_kind
        if func is torch.ops.aten._to_copy.default and args and args[0].device.type != self.device:
            kind = KIND["input"]  # host -> device copy: data entering the GPU
        merged: dict = {}
        for t, mode in acc:
            st = t.untyped_storage()
            if st.nbytes() <= 0:
                continue
            a = self._alloc_of(st, kind)
            off, ln = tensor_extent(t)
            if ln <= 0:
                continue
            ln = min(ln, a.size - off)
            k = (a.id, off, ln)
            merged[k] = merged.get(k, 0) | mode
        if not merged:
            return
        accesses = [(a, off, ln, m) for (a, off, ln), m in merged.items()]
        nbytes = sum(ln * (2 if m == READ | WRITE else 1) for _, _, ln, m in accesses)
        flops = flops_of(func, args, kwargs, out)
        dtype = "fp32"
        if flops:
            dtype = next((_DTYPE_NAMES.get(str(t.dtype), "fp32") for t, _ in acc if t.is_floating_point()), "fp32")
            self.builder.note_flop_dtype(dtype)
        name = func.name()
        if events is not None:
            self._events.append((self.builder.n_launches, *events))
        self.builder.launch(name, accesses, duration=estimate(flops, nbytes, dtype, self.profile), flops=flops,
                            nbytes=nbytes, exec_id=exec_id_of(name, _shape_key(args, kwargs)), phase=phase)

    def trace(self, check: bool = True) -> Trace:
        """The recorded trace (validated)."""
        if self.active:
            self._drain()
        b = self.builder
        b.meta.setdefault("flop_dtype_runs", [])
        b.meta["iterations"] = self.steps
        if self._events:
            self._apply_measured()
        # Launches after the last optimizer step belong to no complete iteration.
        t = b.build(check=False)
        t.launch_iter[t.launch_iter >= self.steps] = -1
        if check:
            from .format import validate
            validate(t)
        return t


    def _apply_measured(self) -> None:
        import torch

        torch.cuda.synchronize()
        col = self.builder.launch_cols["launch_dur"]
        for i, start, end in self._events:
            col[i] = start.elapsed_time(end) / 1e3
        self._events.clear()
        self.builder.meta["durations"] = "measured (cuda events)"
        self.builder.meta["gpu"] = torch.cuda.get_device_name()


def _make_mode(rec: Recorder, torch):
    from torch.utils._python_dispatch import TorchDispatchMode

    emulate = _emulated_table() if rec.device == "cpu" and rec.route_kernels else {}

    class RecordMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            em = emulate.get(func)
            timed = rec.measure and rec.active and launches_kernel(func)
            if timed:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            out = em(func, args, kwargs) if em is not None else func(*args, **kwargs)
            if timed:
                end.record()
            if rec.active and launches_kernel(func):
                rec.on_op(func, args, kwargs, out, (start, end) if timed else None)
            return out

    return RecordMode()


# --------------------------------------------------------------------------------------------- kernel routing


@contextlib.contextmanager
def route_cuda_kernels():
    """Within the block, ``F.scaled_dot_product_attention`` calls the CUDA attention kernels (flash for
    fp16/bf16 without a mask, memory-efficient otherwise) and ``F.dropout`` calls ``native_dropout``, as
    PyTorch does on a GPU; on meta/CPU it would pick the math path and ``bernoulli_`` instead."""
    import torch.nn.functional as F

    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = _sdpa_cuda, _dropout_cuda
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def _dropout_cuda(input, p=0.5, training=True, inplace=False):
    import torch

    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input.mul_(0.0) if inplace else input * 0.0
    out = torch.ops.aten.native_dropout(input, p, True)[0]
    if inplace:
        return input.copy_(out)
    return out


def _sdpa_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import torch

    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if attn_mask is None and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] <= 256:
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                                  scale=scale)[0]
    bias = attn_mask
    if bias is not None:
        if bias.dtype == torch.bool:  # PyTorch turns boolean masks into an additive bias for these kernels
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(~bias, float("-inf"))
        shape = (query.shape[0], query.shape[-3], query.shape[-2], key.shape[-2])
        bias = bias.expand(shape)
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, bias, need_lse, dropout_p,
                                                                  is_causal, scale=scale)[0]


# CPU emulation of the CUDA-only attention kernels: outputs shaped/strided as the kernels' meta functions say,
# filled by the math formula. Dropout inside attention is not applied (values only; the trace is unaffected).


def _bind(func, args, kwargs) -> dict:
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


def _meta_shapes(func, args, kwargs):
    import torch
    from torch.utils._pytree import tree_map

    to_meta = lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x  # noqa: E731
    return func(*tree_map(to_meta, args), **tree_map(to_meta, kwargs))


def _materialise(meta_outs, values):
    import torch

    res = []
    for m, v in zip(meta_outs, values):
        if isinstance(m, torch.Tensor):
            t = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device="cpu")
            if v is None:
                t.zero_()
            else:
                idx = tuple(slice(0, s) for s in v.shape)
                if m.dtype.is_floating_point and tuple(v.shape) != tuple(m.shape):
                    t.fill_(float("inf"))
                t[idx].copy_(v)
            res.append(t)
        else:
            res.append(m)
    return tuple(res)


def _math_attention(q, k, v, bias, is_causal, scale):
    import torch

    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if bias is not None:
        s = s + bias.float()
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    p = torch.softmax(s, -1)
    return p @ v.float(), torch.logsumexp(s, -1), p, scale


def _math_attention_backward(dout, q, k, v, bias, is_causal, scale):
    _, _, p, scale = _math_attention(q, k, v, bias, is_causal, scale)
    dout = dout.float()
    dv = p.transpose(-2, -1) @ dout
    dp = dout @ v.float().transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return ds @ k.float() * scale, ds.transpose(-2, -1) @ q.float() * scale, dv, ds


def _emu_efficient(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    o, lse, _, _ = _math_attention(a["query"], a["key"], a["value"], a["attn_bias"], a["is_causal"], a["scale"])
    return _materialise(meta, (o, lse if a["compute_log_sumexp"] else None, None, None))


def _emu_efficient_bwd(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    dq, dk, dv, ds = _math_attention_backward(a["grad_out_"], a["query"], a["key"], a["value"], a["attn_bias"],
                                              a["is_causal"], a["scale"])
    return _materialise(meta, (dq, dk, dv, ds if meta[3] is not None else None))


def _emu_flash(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    o, lse, _, _ = _math_attention(a["query"], a["key"], a["value"], None, a["is_causal"], a["scale"])
    return _materialise(meta, (o, lse) + (None,) * (len(meta) - 2))


def _emu_flash_bwd(func, args, kwargs):
    a = _bind(func, args, kwargs)
    meta = _meta_shapes(func, args, kwargs)
    dq, dk, dv, _ = _math_attention_backward(a["grad_out"], a["query"], a["key"], a["value"], None,
                                             a["is_causal"], a["scale"])
    return _materialise(meta, (dq, dk, dv))


def _emulated_table() -> dict:
    import torch

    ops = torch.ops.aten
    return {ops._scaled_dot_product_efficient_attention.default: _emu_efficient,
            ops._scaled_dot_product_efficient_attention_backward.default: _emu_efficient_bwd,
            ops._scaled_dot_product_flash_attention.default: _emu_flash,
            ops._scaled_dot_product_flash_attention_backward.default: _emu_flash_bwd}




__all__ = ["RECORDER_VERSION", "Recorder", "accesses_of", "cached_exec_id", "cached_flops", "flops_of",
           "launches_kernel", "route_cuda_kernels", "scan_op", "tensor_extent"]
