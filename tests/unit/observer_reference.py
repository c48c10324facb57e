"""The reference the C++ observer is held to: what the Python runtime (``Session.on_op`` behind the dispatch
mode) makes of each op, as plain tuples, from the recorder's own functions (``scan_op``, ``tensor_extent``,
``cached_exec_id``, ``cached_flops``). Used by ``test_native_observer.py``."""

from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from uvmprefetch.trace.format import PHASE, READ, WRITE
from uvmprefetch.trace.recorder import cached_exec_id, cached_flops, launches_kernel, scan_op, tensor_extent


class Op(tuple):
    """(name, exec_id, phase, ranges, flops): ranges = ((storage address, offset, length, mode), ...) in first-seen
    order, the same range named twice joined."""


class ReferenceMode(TorchDispatchMode):
    """Collects ``Op`` tuples for every kernel-launching op, as the live session would see it. Enter it on each
    thread whose ops are to be seen (a dispatch mode is per thread; the autograd engine carries it to its own)."""

    def __init__(self, sink: list, lock: threading.Lock, in_optimizer, device_type: str = "cpu"):
        super().__init__()
        self.sink, self.lock, self.in_optimizer, self.device_type = sink, lock, in_optimizer, device_type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if launches_kernel(func):
            op = reference_op(func, args, kwargs, out, self.in_optimizer(), self.device_type)
            if op is not None:
                with self.lock:
                    self.sink.append(op)
        return out


def reference_op(func, args, kwargs, out, in_optimizer: bool, device_type: str):
    acc, key, ckey = scan_op(func, args, kwargs, out, device_type)
    if not acc:
        return None
    backward = torch._C._current_autograd_node() is not None or torch._C._current_graph_task_id() != -1
    phase = "optimizer" if in_optimizer else "backward" if backward else "forward"
    if phase == "optimizer" and all(t.dim() == 0 for t, _ in acc):
        return None
    ranges: dict = {}
    for t, mode in acc:
        st = t.untyped_storage()
        nbytes = st.nbytes()
        if nbytes <= 0:
            continue
        off, length = tensor_extent(t)
        length = min(length, nbytes - off)
        if length <= 0:
            continue
        k = (st.data_ptr(), off, length)
        ranges[k] = ranges.get(k, 0) | mode
    name = func.name()
    return Op((name, cached_exec_id(name, key, ckey), PHASE[phase],
               tuple((a, o, ln, m) for (a, o, ln), m in ranges.items()), cached_flops(func, args, kwargs, out, ckey)))


__all__ = ["Op", "READ", "ReferenceMode", "WRITE", "reference_op"]


def native_ops(lib, recs) -> list:
    """The C++ observer's records (``lib.drain_ops()``) as ``Op`` tuples; marks are skipped."""
    from uvmprefetch.runtime import native_observer as no
    a, b, c, d = (recs[k].tolist() for k in "abcd")
    f = recs["a"].view("<f8").tolist()
    ops, i = [], 0
    while i < len(a):
        if c[i] >> 56 != no.HEAD:
            i += 1
            continue
        n = d[i] - ((c[i] >> 40) & 0xFF)  # RANGE records (GATE ones follow them)
        ranges = tuple((a[j], b[j], c[j] & no.LEN_MASK, (c[j] >> 48) & 0xF) for j in range(i + 2, i + 2 + n))
        phase = PHASE[("forward", "backward", "optimizer")[(c[i] >> 32) & 0xFF]]
        ops.append(Op((lib.op_name(c[i] & 0xFFFFFFFF), b[i], phase, ranges, f[i + 1])))
        i += 2 + d[i]
    return ops
