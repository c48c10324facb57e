"""Record what a PyTorch training step launches and touches, with no GPU: a ``TorchDispatchMode`` over meta
tensors (or real CPU tensors: the same code path).

Every aten op that would launch a GPU kernel becomes one trace launch. Its accesses are the storages of its
tensor arguments and outputs: the byte range a (possibly non-contiguous) view spans inside its storage,
READ for inputs, READ|WRITE for arguments the op's schema marks mutable, WRITE for outputs. A storage
becomes an allocation the first time a recorded launch touches it (or when registered up front, like the
parameters of a model built before recording) and is freed when PyTorch frees it: a ``weakref.finalize``
on the storage's Python object, which PyTorch keeps alive exactly as long as the storage itself.

To see the kernels a CUDA run would launch, the recorder routes attention and dropout to the CUDA kernels
(``trace/cuda_kernels.py``). What an op launches and touches is read by ``trace/ops.py``, which the live runtime
shares.

Phases: ``backward`` while the autograd engine runs a node, ``optimizer`` between the global optimizer step
hooks, ``forward`` otherwise. Each optimizer step ends an iteration.
"""

from __future__ import annotations

import collections
import contextlib
import weakref
from dataclasses import dataclass

from ..errors import RecordError
from ..gpus import DEFAULT_GPU, get_profile
from .cuda_kernels import _emulated_table, route_cuda_kernels
from .format import KIND, PHASE, READ, WRITE, Trace, TraceBuilder, exec_id_of
# (re-exported: the live runtime and the tools import the op scanning from here)
from .ops import (NO_KERNEL, SKIP_NAMESPACES, _DTYPE_NAMES, _shape_key, accesses_of, cached_exec_id,  # noqa: F401
                  cached_flops, flops_of, launches_kernel, scan_op, tensor_extent)
from .roofline import estimate

RECORDER_VERSION = 1

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


__all__ = ["RECORDER_VERSION", "Recorder", "accesses_of", "cached_exec_id", "cached_flops", "flops_of",
           "launches_kernel", "route_cuda_kernels", "scan_op", "tensor_extent"]
