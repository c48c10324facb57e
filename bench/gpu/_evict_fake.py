"""A fake CUDA driver for ``evict_microbench.py --dry-run``: the cuda-python calls the script makes, on a CPU.

``FakeRuntime`` stands where ``cuda.bindings.runtime`` stands: the same function names, argument order and
``(cudaError_t, *outputs)`` return tuples, the enums and ``cudaMemLocation`` the script touches. It is strict
where the real driver is: unknown pointers, ranges that leave their allocation, non-zero flags, the legacy
stream for the batch calls, malformed location index lists and advice with the wrong location type all
return ``cudaErrorInvalidValue``, so a wrong call in the script fails the dry run as it would fail on a GPU.

Memory is real: pinned host memory is NumPy memory at its own address (the script reads it through
ctypes, as it reads real pinned memory); managed and device memory are NumPy buffers at invented device
addresses that only the fake can reach. A discard poisons a byte of every page (its contents are
indeterminate), so data that is read without a copy-in after a discard compares unequal. Managed memory keeps a
residency per 2 MiB block, and ``cudaMemGetInfo`` counts GPU chunks as the open driver does (as read from
``uvm_va_block.c``): a discard keeps the block's GPU chunk, an eviction to the host frees it.

Time: the fake keeps a virtual clock, the real clock minus the time it spends emulating on the CPU (copying
and filling NumPy buffers, summing for a kernel). Each stream is a timeline on that clock: an operation starts
when the stream is free and lasts what ``TRUTH`` says; events read the timeline; synchronising waits in real
time until the timeline is reached. A call that holds its caller on a GPU (a prefetch to the host; a discard)
holds it here too. So GPU times (events) are exactly the modelled ones, and a dry run can check that the
script's arithmetic gives ``TRUTH`` back; the host time of a call that moves data also contains the fake's
own copying.
"""

from __future__ import annotations

import time
from enum import IntEnum

import numpy as np

from _evict_cuda import MB2, word_sum

# What the fake GPU does (bytes/s, seconds). Round numbers near the H100/H200 calibrations (docs/design.md §3) so
# that the dry run's table reads like a GPU's; a dry run checks that the script measures these back.
TRUTH = {
    "copy_d2h_bw": 52e9, "copy_h2d_bw": 54e9, "copy_latency_s": 6e-6,
    "prefetch_gpu_bw": 47e9, "prefetch_host_bw": 9e9, "prefetch_call_s": 60e-6,
    "discard_call_s": 30e-6, "discard_block_s": 8e-6,
    "repopulate_block_s": 3e-6,  # prefetch of a discarded block to the GPU: no copy, mapping only
    "drop_block_s": 4e-6,  # prefetch of a discarded block to the host: no copy
    "remote_read_bw": 44e9, "remote_write_bw": 50e9, "hbm_bw": 2.4e12, "launch_s": 5e-6,
    "call_host_s": 4e-6,  # host time of any call that does not hold its caller
}
POISON = 0xDB  # what a discarded byte reads as here
NONE, GPU, HOST = 0, 1, 2  # where a managed block's data is


# The binding's enums, with its member names and values (the ones the script touches).
cudaError_t = IntEnum("cudaError_t", {"cudaSuccess": 0, "cudaErrorInvalidValue": 1, "cudaErrorMemoryAllocation": 2,
                                      "cudaErrorInvalidResourceHandle": 400, "cudaErrorNotSupported": 801})
cudaMemLocationType = IntEnum("cudaMemLocationType", {"cudaMemLocationTypeInvalid": 0, "cudaMemLocationTypeDevice": 1,
                                                      "cudaMemLocationTypeHost": 2})
cudaMemoryAdvise = IntEnum("cudaMemoryAdvise", {f"cudaMemAdvise{a}": i + 1 for i, a in enumerate(
    ("SetReadMostly", "UnsetReadMostly", "SetPreferredLocation", "UnsetPreferredLocation", "SetAccessedBy",
     "UnsetAccessedBy"))})
cudaMemcpyKind = IntEnum("cudaMemcpyKind", {f"cudaMemcpy{k}": i for i, k in enumerate(
    ("HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"))})
cudaDeviceAttr = IntEnum("cudaDeviceAttr", {"cudaDevAttrMultiProcessorCount": 16,
                                            "cudaDevAttrConcurrentManagedAccess": 89})


class cudaMemLocation:  # noqa: N801
    def __init__(self):
        self.type, self.id = cudaMemLocationType.cudaMemLocationTypeInvalid, 0


class _Bad(Exception):
    """An invalid call: the fake answers it with an error code."""

    def __init__(self, err=cudaError_t.cudaErrorInvalidValue):
        self.err = err


class _Alloc:
    def __init__(self, kind: str, base: int, buf: np.ndarray):
        self.kind, self.base, self.buf, self.n = kind, base, buf, buf.size
        if kind == "managed":
            nb = -(-self.n // MB2)
            self.where = np.full(nb, NONE, np.int8)
            self.chunk = np.zeros(nb, bool)  # a GPU chunk backs the block
            self.discarded = np.zeros(nb, bool)
            self.pref_host = np.zeros(nb, bool)
            self.accessed_by = np.zeros(nb, bool)


def _wait_real(t: float) -> None:
    while True:
        left = t - time.perf_counter()
        if left <= 0:
            return
        if left > 2e-3:
            time.sleep(left - 1e-3)  # sleep most of it, spin the last stretch (sleep overshoots by ~0.1 ms)


def _api(fn):
    """A binding call: its outputs after cudaSuccess, or the error code of an invalid call."""
    def call(self, *args):
        self._entered = self.vnow()  # the operation is issued when the call starts, not after the emulation
        try:
            out = fn(self, *args)
        except _Bad as e:
            return (e.err,)
        return (cudaError_t.cudaSuccess, *(out if isinstance(out, tuple) else () if out is None else (out,)))
    call.__name__ = fn.__name__
    return call


class FakeRuntime:
    """The subset of ``cuda.bindings.runtime`` the microbenchmark calls. ``unsupported``: call names that answer
    ``cudaErrorNotSupported`` (a driver without them); ``free_bytes``: the GPU memory free at start."""

    cudaError_t = cudaError_t
    cudaMemLocationType = cudaMemLocationType
    cudaMemoryAdvise = cudaMemoryAdvise
    cudaMemcpyKind = cudaMemcpyKind
    cudaDeviceAttr = cudaDeviceAttr
    cudaMemLocation = cudaMemLocation
    cudaStreamNonBlocking = 1
    cudaMemAttachGlobal = 1

    def __init__(self, free_bytes: int = 1331 << 20, total_bytes: int = 2 << 30, unsupported=(), truth=None):
        self.truth = dict(TRUTH, **(truth or {}))
        self.free0, self.total = free_bytes, total_bytes
        self.unsupported = set(unsupported)
        self.allocs: dict[int, _Alloc] = {}
        self._next = 0x7F10_0000_0000
        self.streams: dict[int, float] = {}  # stream -> time its last operation ends
        self.events: dict[int, float | None] = {}
        self._handles = 0x5000
        self._emulated = 0.0  # seconds spent emulating (excluded from the virtual clock)
        self._entered = 0.0

    # -- internals
    def vnow(self) -> float:
        return time.perf_counter() - self._emulated

    def _wait(self, v: float) -> None:
        """Wait in real time until the virtual clock reaches ``v``. A late wake-up (a busy CPU) is taken off the
        virtual clock: there, the caller resumes when the GPU finishes."""
        target = v + self._emulated
        began = time.perf_counter()
        _wait_real(target)
        # (lateness counts from the target or from the call, whichever is later: a wait for a time already
        # passed, an idle stream's say, must not take the whole past off the clock)
        self._emulated += max(0.0, time.perf_counter() - max(target, began))

    def emulate(self, fn, *args):
        """Run CPU work that stands for GPU work (copies, fills, sums) off the virtual clock."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self._emulated += time.perf_counter() - t0

    def _guard(self, name: str) -> None:
        if name in self.unsupported:
            raise _Bad(cudaError_t.cudaErrorNotSupported)

    def _find(self, ptr: int, n: int, kinds=("managed", "device", "pinned")) -> tuple[_Alloc, int]:
        for a in self.allocs.values():
            if a.base <= ptr < a.base + a.n:
                if a.kind not in kinds or n <= 0 or ptr + n > a.base + a.n:
                    raise _Bad()
                return a, ptr - a.base
        raise _Bad()

    def _stream(self, s, batch: bool = False) -> int:
        s = int(s)
        if s == 0 and batch:  # the batch calls refuse the legacy stream
            raise _Bad()
        if s != 0 and s not in self.streams:
            raise _Bad(cudaError_t.cudaErrorInvalidResourceHandle)
        self.streams.setdefault(0, 0.0)
        return s

    def _queue(self, s: int, dur: float, hold: bool = False) -> None:
        """An operation of ``dur`` seconds on stream ``s``; ``hold``: the call returns when it ends."""
        now = self._entered
        end = max(self.streams[s], now) + dur
        self.streams[s] = end
        self._wait(end if hold else now + self.truth["call_host_s"])

    def _blocks(self, a: _Alloc, off: int, n: int) -> slice:
        return slice(off // MB2, -(-(off + n) // MB2))

    def _loc_gpu(self, loc) -> bool:
        if not isinstance(loc, cudaMemLocation):
            raise _Bad()
        if loc.type == cudaMemLocationType.cudaMemLocationTypeDevice and loc.id == 0:
            return True
        if loc.type == cudaMemLocationType.cudaMemLocationTypeHost:
            return False
        raise _Bad()

    def _ranges(self, dptrs, sizes, count) -> list[tuple[_Alloc, int, int]]:
        if not (len(dptrs) == len(sizes) == count) or count == 0:
            raise _Bad()
        out = []
        for p, n in zip(dptrs, sizes):
            if p % 4096 or n % 4096:  # UvmDiscard: page-aligned ranges only
                raise _Bad()
            a, off = self._find(int(p), int(n), ("managed",))
            out.append((a, off, int(n)))
        return out

    def _discard(self, a: _Alloc, off: int, n: int) -> None:
        blk = self._blocks(a, off, n)
        a.buf[off:off + n:4096] = POISON  # one byte a page is enough to make stale data read as different
        a.discarded[blk] = True
        a.where[blk] = NONE  # residency revoked; the GPU chunk stays (it is first in line for eviction)

    def _migrate(self, a: _Alloc, off: int, n: int, to_gpu: bool) -> float:
        """Make the range resident on one side; the seconds the move takes."""
        t = self.truth
        blk = self._blocks(a, off, n)
        disc = a.discarded[blk]
        frac = n / ((blk.stop - blk.start) * MB2)
        if to_gpu:
            moving = (a.where[blk] == HOST) & ~disc
            secs = moving.sum() * MB2 * frac / t["prefetch_gpu_bw"] + disc.sum() * t["repopulate_block_s"]
            a.where[blk], a.chunk[blk] = GPU, True
        else:
            moving = (a.where[blk] == GPU) & ~disc
            secs = moving.sum() * MB2 * frac / t["prefetch_host_bw"] + disc.sum() * t["drop_block_s"]
            a.where[blk], a.chunk[blk] = HOST, False
        a.discarded[blk] = False
        return secs

    def _device_side(self, a: _Alloc, off: int, n: int) -> bool:
        """Whether a copy finds the range in GPU memory; a managed block with no data is populated there."""
        if a.kind == "managed":
            blk = self._blocks(a, off, n)
            a.discarded[blk] = False  # a write lands and ends the discard; a read is indeterminate
            empty = a.where[blk] == NONE
            a.where[blk][empty], a.chunk[blk][empty] = GPU, True
            return bool((a.where[blk] == GPU).all())
        return a.kind == "device"

    # -- device and memory
    @_api
    def cudaSetDevice(self, dev):
        if int(dev) != 0:
            raise _Bad()

    @_api
    def cudaDeviceGetAttribute(self, attr, dev):
        known = {cudaDeviceAttr.cudaDevAttrMultiProcessorCount: 132, cudaDeviceAttr.cudaDevAttrConcurrentManagedAccess: 1}
        if attr not in known or int(dev) != 0:
            raise _Bad()
        return known[attr]

    @_api
    def cudaDriverGetVersion(self):
        return 13000

    @_api
    def cudaRuntimeGetVersion(self):
        return 13000

    @_api
    def cudaGetErrorName(self, err):
        return cudaError_t(int(err)).name.encode()

    @_api
    def cudaMemGetInfo(self):
        used = sum(a.n for a in self.allocs.values() if a.kind == "device")
        used += sum(int(a.chunk.sum()) * MB2 for a in self.allocs.values() if a.kind == "managed")
        return self.free0 - used, self.total

    def _alloc(self, kind: str, n: int) -> int:
        if n <= 0:
            raise _Bad()
        if kind == "pinned":
            buf = np.empty(n, np.uint8)
            base = buf.ctypes.data
        else:
            if kind == "device" and n > self._mem_free():
                raise _Bad(cudaError_t.cudaErrorMemoryAllocation)
            buf = np.empty(n, np.uint8)
            base, self._next = self._next, self._next + -(-n // MB2) * MB2 + MB2
        self.allocs[base] = _Alloc(kind, base, buf)
        return base

    def _mem_free(self) -> int:
        return self.cudaMemGetInfo()[1]

    @_api
    def cudaMallocManaged(self, n, flags):
        if flags != self.cudaMemAttachGlobal:
            raise _Bad()
        return self._alloc("managed", int(n))

    @_api
    def cudaMalloc(self, n):
        return self._alloc("device", int(n))

    @_api
    def cudaMallocHost(self, n):
        return self._alloc("pinned", int(n))

    @_api
    def cudaFree(self, p):
        if self.allocs.get(int(p), None) is None or self.allocs[int(p)].kind == "pinned":
            raise _Bad()
        del self.allocs[int(p)]

    @_api
    def cudaFreeHost(self, p):
        if self.allocs.get(int(p), None) is None or self.allocs[int(p)].kind != "pinned":
            raise _Bad()
        del self.allocs[int(p)]

    # -- streams and events
    @_api
    def cudaStreamCreateWithFlags(self, flags):
        self._handles += 1
        self.streams[self._handles] = 0.0
        return self._handles

    @_api
    def cudaStreamDestroy(self, s):
        self.streams.pop(self._stream(s), None)

    @_api
    def cudaStreamSynchronize(self, s):
        self._wait(self.streams[self._stream(s)])

    @_api
    def cudaEventCreate(self):
        self._handles += 1
        self.events[self._handles] = None
        return self._handles

    @_api
    def cudaEventDestroy(self, ev):
        if int(ev) not in self.events:
            raise _Bad(cudaError_t.cudaErrorInvalidResourceHandle)
        del self.events[int(ev)]

    @_api
    def cudaEventRecord(self, ev, s):
        if int(ev) not in self.events:
            raise _Bad(cudaError_t.cudaErrorInvalidResourceHandle)
        s = self._stream(s)
        self.events[int(ev)] = max(self.streams[s], self.vnow())

    @_api
    def cudaEventSynchronize(self, ev):
        if self.events.get(int(ev)) is None:
            raise _Bad(cudaError_t.cudaErrorInvalidResourceHandle)
        self._wait(self.events[int(ev)])

    @_api
    def cudaEventElapsedTime(self, e0, e1):
        t0, t1 = self.events.get(int(e0)), self.events.get(int(e1))
        if t0 is None or t1 is None:
            raise _Bad(cudaError_t.cudaErrorInvalidResourceHandle)
        return (t1 - t0) * 1e3

    # -- the operations
    @_api
    def cudaMemcpyAsync(self, dst, src, n, kind, s):
        if kind != cudaMemcpyKind.cudaMemcpyDefault:
            raise _Bad()
        s, n = self._stream(s), int(n)
        da, doff = self._find(int(dst), n)
        sa, soff = self._find(int(src), n)
        src_dev, dst_dev = self._device_side(sa, soff, n), self._device_side(da, doff, n)
        self.emulate(np.copyto, da.buf[doff:doff + n], sa.buf[soff:soff + n])
        t = self.truth
        bw = t["hbm_bw"] if src_dev and dst_dev else t["copy_d2h_bw"] if src_dev else t["copy_h2d_bw"]
        self._queue(s, t["copy_latency_s"] + n / bw)

    @_api
    def cudaMemsetAsync(self, p, value, n, s):
        s, n = self._stream(s), int(n)
        a, off = self._find(int(p), n, ("device", "managed"))
        self.emulate(a.buf[off:off + n].fill, int(value) & 0xFF)
        self._queue(s, self.truth["launch_s"])

    @_api
    def cudaMemPrefetchAsync(self, p, n, loc, flags, s):
        to_gpu = self._loc_gpu(loc)
        if flags != 0:
            raise _Bad()
        s, n = self._stream(s), int(n)
        a, off = self._find(int(p), n, ("managed",))
        secs = self.truth["prefetch_call_s"] + self._migrate(a, off, n, to_gpu)
        # a migration to the host allocates and maps host pages in the call (uvm_migrate.c): it holds the caller
        self._queue(s, secs, hold=not to_gpu)

    @_api
    def cudaMemDiscardBatchAsync(self, dptrs, sizes, count, flags, s):
        self._guard("cudaMemDiscardBatchAsync")
        s = self._stream(s, batch=True)
        if flags != 0:
            raise _Bad()
        ranges = self._ranges(dptrs, sizes, count)
        blocks = 0
        for a, off, n in ranges:
            self._discard(a, off, n)
            blocks += -(-n // MB2)
        self._queue(s, self.truth["discard_call_s"] + blocks * self.truth["discard_block_s"], hold=True)

    @_api
    def cudaMemDiscardAndPrefetchBatchAsync(self, dptrs, sizes, count, locs, idxs, nlocs, flags, s):
        self._guard("cudaMemDiscardAndPrefetchBatchAsync")
        s = self._stream(s, batch=True)
        if flags != 0 or not (len(locs) == len(idxs) == nlocs) or not 0 < nlocs <= count or list(idxs)[0] != 0 \
                or any(b <= a for a, b in zip(idxs, list(idxs)[1:])):
            raise _Bad()
        gpu = [self._loc_gpu(loc) for loc in locs]
        ranges = self._ranges(dptrs, sizes, count)
        secs = self.truth["discard_call_s"]
        for i, (a, off, n) in enumerate(ranges):
            self._discard(a, off, n)
            to_gpu = gpu[max(k for k, first in enumerate(idxs) if first <= i)]
            secs += -(-n // MB2) * self.truth["discard_block_s"] + self._migrate(a, off, n, to_gpu)
        self._queue(s, secs, hold=True)

    @_api
    def cudaMemAdvise(self, p, n, advice, loc):
        a, off = self._find(int(p), int(n), ("managed",))
        blk = self._blocks(a, off, int(n))
        gpu = self._loc_gpu(loc)
        adv = cudaMemoryAdvise
        if advice == adv.cudaMemAdviseSetPreferredLocation:
            a.pref_host[blk] = not gpu
        elif advice == adv.cudaMemAdviseUnsetPreferredLocation:
            a.pref_host[blk] = False
        elif advice == adv.cudaMemAdviseSetAccessedBy:
            if not gpu:
                raise _Bad()
            a.accessed_by[blk] = True
        elif advice == adv.cudaMemAdviseUnsetAccessedBy:
            a.accessed_by[blk] = False
        else:
            raise _Bad()


class FakeKernels:
    """The read and write kernels of ``_evict_cuda`` on the fake GPU: a host-resident range that prefers the host
    and is mapped for the GPU is read and written over the link; any other host-resident block faults to the
    GPU first (the driver's default), which a second read then finds local."""

    name = "fake"

    def __init__(self, cuda):
        self.cuda, self.rt = cuda, cuda.rt
        self._sum = 0

    def _range(self, addr: int, nbytes: int):
        a, off = self.rt._find(addr, nbytes, ("managed", "device"))
        return a, off, self.rt._blocks(a, off, nbytes)

    def _time(self, a, blk, nbytes: int, bw_remote: float) -> float:
        t = self.rt.truth
        if a.kind == "device":
            return t["launch_s"] + nbytes / t["hbm_bw"]
        remote = (a.where[blk] == HOST) & a.pref_host[blk] & a.accessed_by[blk]
        faulted = (a.where[blk] != GPU) & ~remote
        a.where[blk][faulted], a.chunk[blk][faulted] = GPU, True
        frac = nbytes / ((blk.stop - blk.start) * MB2)
        return (t["launch_s"] + remote.sum() * MB2 * frac / bw_remote + faulted.sum() * MB2 * frac / t["prefetch_gpu_bw"]
                + (~remote).sum() * MB2 * frac / t["hbm_bw"])

    def read(self, addr: int, nbytes: int) -> None:
        a, off, blk = self._range(addr, nbytes)
        self.rt._entered = self.rt.vnow()
        self._sum = self.rt.emulate(word_sum, a.buf[off:off + nbytes])
        self.rt._queue(int(self.cuda.stream), self._time(a, blk, nbytes, self.rt.truth["remote_read_bw"]))

    def checksum(self) -> int:
        self.cuda.sync()
        return self._sum

    def write(self, addr: int, nbytes: int, value: int) -> None:
        a, off, blk = self._range(addr, nbytes)
        self.rt._entered = self.rt.vnow()
        self.rt.emulate(a.buf[off:off + nbytes].view(np.uint32).fill, value)
        if a.kind == "managed":
            a.discarded[blk] = False
        self.rt._queue(int(self.cuda.stream), self._time(a, blk, nbytes, self.rt.truth["remote_write_bw"]))

    expected = staticmethod(word_sum)
