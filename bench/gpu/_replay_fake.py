"""The GPU replay's CPU dry run: a fake at the CUDA boundary, under the same replay loop and the same live runtime.

- ``ReplayFakeRuntime`` is ``_evict_fake.FakeRuntime`` (the cuda-python calls on a CPU: managed memory as NumPy
  buffers with a residency per 2 MiB block, streams as timelines on a virtual clock, as strict as a driver about
  the calls) that also counts what moved each way and what faulted.
- ``FakeTouchKernels`` stands for ``kernels/touch.cu``: it reads the same chunk table from fake device memory,
  writes the launch's stamp into the bytes it writes (as the kernel does), faults non-resident blocks in, queues its time on the compute stream (its spin, or longer when it faulted),
  and records which bytes it touched and in which order (``log``). Its effect on residency happens when it is
  launched, as if the GPU were idle (on a GPU a queued kernel may start after moves issued behind it).
- ``installed(rt)`` puts the fake where the live runtime looks for CUDA while the replay runs: PyTorch's
  ``torch.cuda`` streams, events and device queries (the backend's ``Mover`` and GPU-progress events), the
  ``cuda.bindings.runtime`` module (the ``Mover``'s calls) and the driver probe ``uvmprefetch.runtime.device
  .require_cuda``; everything it replaced is restored on exit. The runtime itself (policy, books, budget, the
  ``Mover``'s call order) is the real one.
"""

from __future__ import annotations

import contextlib
import sys
import types

import numpy as np

from _evict_cuda import Cuda
from _evict_fake import GPU, HOST, MB2, FakeRuntime
from _replay_core import READ, TABLE_DTYPE, WRITE, Device

FAKE_NAME = "fake GPU (dry run)"
# the fake's fault cost per 2 MiB block: the calibrated profiles' ~300 us (uvmprefetch/gpus.py *-cal)
FAULT_BLOCK_S = 300e-6


class ReplayFakeRuntime(FakeRuntime):
    """``FakeRuntime`` with counters: bytes each way and blocks faulted (what CUPTI would report on a GPU), and
    ``prefetches``: every successful ``cudaMemPrefetchAsync`` as ``(ptr, nbytes, to_gpu)``, in call order."""

    def __init__(self, free_bytes: int, total_bytes: int) -> None:
        super().__init__(free_bytes=free_bytes, total_bytes=total_bytes, truth={"fault_block_s": FAULT_BLOCK_S})
        self.moved = {"bytes_htod": 0, "bytes_dtoh": 0, "faults": 0}
        self.prefetches: list[tuple[int, int, bool]] = []

    def cudaMemPrefetchAsync(self, p, n, loc, flags, s):  # noqa: N802 - the binding's name
        res = super().cudaMemPrefetchAsync(p, n, loc, flags, s)
        if int(res[0]) == 0:
            self.prefetches.append((int(p), int(n), self._loc_gpu(loc)))
        return res

    def _migrate(self, a, off: int, n: int, to_gpu: bool) -> float:
        blk = self._blocks(a, off, n)
        frac = n / ((blk.stop - blk.start) * MB2)
        from_side = HOST if to_gpu else GPU
        moving = int(((a.where[blk] == from_side) & ~a.discarded[blk]).sum())
        self.moved["bytes_htod" if to_gpu else "bytes_dtoh"] += int(moving * MB2 * frac)
        return super()._migrate(a, off, n, to_gpu)


class FakeTouchKernels:
    """``kernels/touch.cu`` on the fake (module docstring). ``log``: per kernel call, the ``(addr, len, mode)``
    arrays of the chunks it visited, in order."""

    name = "fake (NumPy)"

    def __init__(self, cuda: Cuda) -> None:
        self.cuda, self.rt = cuda, cuda.rt
        self.log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def _chunks(self, table: int, first: int, n: int) -> np.ndarray:
        a, off = self.rt._find(int(table), max(1, (first + n) * TABLE_DTYPE.itemsize), ("device",))
        return a.buf[off:off + (first + n) * TABLE_DTYPE.itemsize].view(TABLE_DTYPE)[first:].copy()

    def _visit(self, ch: np.ndarray, stamp: int, counts=None, count_base: int = 0) -> float:
        """Touch the chunks; the seconds the kernel takes before its spin."""
        rt, t = self.rt, self.rt.truth
        self.log.append((ch["addr"].astype(np.int64), ch["len"].astype(np.int64), ch["mode"].astype(np.int64)))
        if not ch.size:
            return t["launch_s"]
        lo = ch["addr"].astype(np.int64)
        hi = lo + ch["len"].astype(np.int64)
        a, _ = rt._find(int(lo[0]), 1, ("managed", "device"))
        if lo.min() < a.base or hi.max() > a.base + a.n:
            raise RuntimeError("fake touch kernel: a chunk leaves its allocation (an illegal address on a GPU)")
        written = (ch["mode"] & WRITE) != 0
        rel = lo - a.base
        for r, n in zip(rel[written].tolist(), (hi - lo)[written].tolist()):
            a.buf[r:r + n] = stamp & 0xFF
        if counts is not None:  # the self-test's variant: counts every byte
            for s, e in zip((lo - count_base).tolist(), (hi - count_base).tolist()):
                counts[s:e] += 1
        nbytes = int((hi - lo).sum())
        if a.kind != "managed":
            return t["launch_s"] + nbytes / t["hbm_bw"]
        first_blk, last_blk = rel // MB2, (hi - a.base - 1) // MB2
        nb = last_blk - first_blk + 1
        blocks = np.unique(np.repeat(first_blk, nb) + np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb))
        where = a.where[blocks]
        faulted = blocks[where != GPU]
        came = int((where == HOST).sum())  # an empty block is populated on the GPU, nothing comes over the link
        a.where[faulted], a.chunk[faulted] = GPU, True
        a.discarded[blocks] = False
        rt.moved["faults"] += int(faulted.size)
        rt.moved["bytes_htod"] += came * MB2
        return (t["launch_s"] + faulted.size * t["fault_block_s"] + came * MB2 / t["prefetch_gpu_bw"]
                + nbytes / t["hbm_bw"])

    def _launch(self, secs: float, spin_ns: int) -> None:
        self.rt._entered = self.rt.vnow()
        self.rt._queue(int(self.cuda.stream), max(secs, spin_ns * 1e-9))

    def touch(self, table: int, first: int, n: int, spin_ns: int, stamp: int) -> None:
        ch = self.rt.emulate(self._chunks, table, first, n)
        self._launch(self.rt.emulate(self._visit, ch, stamp), spin_ns)

    def touch_count(self, table: int, first: int, n: int, spin_ns: int, stamp: int, counts: int, base: int) -> None:
        ch = self.rt.emulate(self._chunks, table, first, n)
        c, coff = self.rt._find(int(counts), 4, ("device",))
        view = c.buf[coff:].view(np.uint32)
        self._launch(self.rt.emulate(self._visit, ch, stamp, view, int(base)), spin_ns)


class FakeDevice(Device):
    """The replay's ``Device`` on the fake: ``free_bytes`` of ``total_bytes`` GPU memory free at start."""

    kind = "fake"

    def __init__(self, free_bytes: int = 3 << 30, total_bytes: int = 4 << 30) -> None:
        rt = ReplayFakeRuntime(free_bytes, total_bytes)
        cuda = Cuda(rt)
        super().__init__(cuda, FakeTouchKernels(cuda), FAKE_NAME)

    def runtime_env(self):
        return installed(self.rt)

    def clock(self) -> float:
        """The fake's virtual clock: real time less the time spent emulating the GPU on the CPU."""
        return self.rt.vnow()

    def read_bytes(self, base: int, offsets: np.ndarray) -> np.ndarray:
        a, off = self.rt._find(int(base), 1, ("managed",))
        return a.buf[off + offsets]

    def measured(self, backend_result: dict) -> dict:
        m = dict(self.rt.moved)
        self.rt.moved = {k: 0 for k in m}
        return {**m, "measured_by": "the fake driver's counters (dry run)"}


# ------------------------------------------------------------------------------------- the CUDA boundary


class _Stream:
    """``torch.cuda.Stream`` on the fake: a timeline of ``rt``."""

    def __init__(self, rt, handle: int) -> None:
        self.rt, self.cuda_stream = rt, int(handle)

    def wait_event(self, ev) -> None:
        t = self.rt.events.get(ev.handle)
        if t is not None:
            self.rt.streams[self.cuda_stream] = max(self.rt.streams.get(self.cuda_stream, 0.0), t)

    def wait_stream(self, other) -> None:
        t = self.rt.streams.get(other.cuda_stream, 0.0)
        self.rt.streams[self.cuda_stream] = max(self.rt.streams.get(self.cuda_stream, 0.0), t)

    def synchronize(self) -> None:
        _ok(self.rt.cudaStreamSynchronize(self.cuda_stream), "cudaStreamSynchronize")


class _Event:
    """``torch.cuda.Event`` on the fake. Like CUDA's, an event never recorded counts as complete."""

    def __init__(self, rt, torch_cuda) -> None:
        self.rt, self.tc = rt, torch_cuda
        self.handle = _ok(rt.cudaEventCreate(), "cudaEventCreate")

    def record(self, stream=None) -> None:
        s = stream if stream is not None else self.tc.current
        _ok(self.rt.cudaEventRecord(self.handle, s.cuda_stream), "cudaEventRecord")

    def query(self) -> bool:
        t = self.rt.events.get(self.handle)
        return t is None or t <= self.rt.vnow()

    def synchronize(self) -> None:
        if self.rt.events.get(self.handle) is not None:
            _ok(self.rt.cudaEventSynchronize(self.handle), "cudaEventSynchronize")

    def elapsed_time(self, other) -> float:
        return float(_ok(self.rt.cudaEventElapsedTime(self.handle, other.handle), "cudaEventElapsedTime"))


class _TorchCuda:
    """The ``torch.cuda`` functions and classes the cuda backend calls, on the fake."""

    def __init__(self, rt) -> None:
        self.rt = rt
        self.current = _Stream(rt, 0)

    def attrs(self) -> dict:
        rt = self.rt
        return {
            "is_available": lambda: True, "is_initialized": lambda: False, "init": lambda: None,
            "current_device": lambda: 0, "get_device_name": lambda device=None: FAKE_NAME,
            "mem_get_info": lambda device=None: tuple(_ok(rt.cudaMemGetInfo(), "cudaMemGetInfo")),
            "memory_reserved": lambda device=None: 0, "is_current_stream_capturing": lambda: False,
            "Stream": lambda device=None, priority=0: _Stream(rt, _ok(rt.cudaStreamCreateWithFlags(1),
                                                                       "cudaStreamCreateWithFlags")),
            "ExternalStream": lambda stream_ptr, device=None: _Stream(rt, stream_ptr),
            "Event": lambda enable_timing=False, blocking=False, interprocess=False: _Event(rt, self),
            "current_stream": lambda device=None: self.current,
            "set_stream": self._set_stream,
        }

    def _set_stream(self, stream) -> None:
        self.current = stream


def _ok(res, what: str):
    err, *vals = res
    if int(err) != 0:
        raise RuntimeError(f"fake {what} failed: {err!r}")
    return vals[0] if len(vals) == 1 else tuple(vals)


class _Driver:
    """What ``uvmprefetch.runtime.device.require_cuda`` returns: the driver's version and its batch API."""

    version, batch_api, name, error, devices = 13000, True, FAKE_NAME, "", 1
    managed = concurrent_managed = True


@contextlib.contextmanager
def installed(rt):
    """``rt`` as the CUDA the live runtime sees (module docstring); restored on exit."""
    import torch

    import uvmprefetch.runtime.device as device
    fake = _TorchCuda(rt).attrs()
    saved_attrs = {k: getattr(torch.cuda, k) for k in fake}
    saved_modules = {k: sys.modules.get(k) for k in ("cuda", "cuda.bindings", "cuda.bindings.runtime")}
    saved_probe = device.require_cuda
    try:
        for k, v in fake.items():
            setattr(torch.cuda, k, v)
        bindings = types.ModuleType("cuda.bindings")
        bindings.runtime = rt
        sys.modules.update({"cuda": types.ModuleType("cuda"), "cuda.bindings": bindings,
                            "cuda.bindings.runtime": rt})
        device.require_cuda = lambda: _Driver()
        yield
    finally:
        for k, v in saved_attrs.items():
            setattr(torch.cuda, k, v)
        for k, v in saved_modules.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        device.require_cuda = saved_probe


# ------------------------------------------------------------------------------------------ the dry run's check


def merged(spans) -> list[tuple[int, int]]:
    """``(lo, hi)`` spans as sorted, disjoint, non-touching ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def expected_ranges(trace, base: np.ndarray, arena: int, i: int, bit: int = READ | WRITE) -> list[tuple[int, int]]:
    """The bytes launch ``i`` reads and/or writes (``bit``), merged, with allocation ``a`` at ``arena + base[a]``:
    a slow, obvious reference, independent of ``touch_plan``."""
    s = trace.accesses(i)
    return merged((arena + int(base[a]) + int(o), arena + int(base[a]) + int(o) + int(n))
                  for a, o, n, m in zip(trace.acc_alloc[s], trace.acc_off[s], trace.acc_len[s], trace.acc_mode[s])
                  if m & bit)


def check_log(log, trace, base: np.ndarray, arena: int) -> tuple[bool, str]:
    """Did the kernels touch, launch after launch in trace order, exactly each launch's bytes, each byte once,
    reading the bytes its accesses read and writing those they write? ``log``: ``FakeTouchKernels.log`` of one
    replay (one entry per launch)."""
    if len(log) != trace.n_launches:
        return False, f"{len(log)} kernels ran for {trace.n_launches} launches"
    for i, (addr, ln, mode) in enumerate(log):
        order = np.argsort(addr, kind="stable")
        lo, hi = addr[order], addr[order] + ln[order]
        if lo.size and (hi[:-1] > lo[1:]).any():
            return False, f"launch {i}: a byte was touched twice (two chunks overlap)"
        for bit, what in ((READ | WRITE, "touched"), (READ, "read"), (WRITE, "written")):
            got = merged((a, b) for a, b, m in zip(addr.tolist(), (addr + ln).tolist(), mode.tolist()) if m & bit)
            want = expected_ranges(trace, base, arena, i, bit)
            if got != want:
                return False, f"launch {i}: bytes {what} {got[:2]}..., expected {want[:2]}..."
    return True, f"{len(log)} launches in trace order, each launch's bytes exactly once, reads and writes as traced"
