"""The CUDA calls of ``evict_microbench.py``: a thin layer over cuda-python's ``cuda.bindings.runtime``.

Every CUDA call the microbenchmark makes goes through ``Cuda`` (memory, copies, prefetches, discards, advice,
events) and, for the remote-access part, through one of the kernel sets below. With ``--dry-run`` the same
class drives ``_evict_fake.FakeRuntime``, which follows the binding's signatures and return tuples; nothing here
knows which of the two it drives.

C signatures behind the calls (CUDA 13 ``cuda_runtime_api.h``; cuda-bindings 13 takes them in this order and
returns ``(cudaError_t, *outputs)``)::

    cudaMallocManaged(void** p, size_t size, unsigned flags)     cudaMallocHost(void** p, size_t size)
    cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s)
    cudaMemPrefetchAsync(const void* p, size_t n, cudaMemLocation loc, unsigned flags, cudaStream_t s)
    cudaMemDiscardBatchAsync(void** ptrs, size_t* sizes, size_t count, unsigned long long flags, cudaStream_t s)
    cudaMemDiscardAndPrefetchBatchAsync(void** ptrs, size_t* sizes, size_t count, cudaMemLocation* locs,
                                        size_t* locIdxs, size_t numLocs, unsigned long long flags, cudaStream_t s)
    cudaMemAdvise(const void* p, size_t n, cudaMemoryAdvise advice, cudaMemLocation loc)

What the driver does with them (NVIDIA open driver, ``kernel-open/nvidia-uvm/``): a discard marks the pages
discarded and revokes their residency but does not free the GPU chunks behind them; a fully discarded 2 MiB
block's chunk moves to the front of the eviction order, and evicting it copies nothing (``uvm_va_block.c``,
``va_block_discard_locked``; ``uvm.h``, UvmDiscard). A prefetch of a discarded range clears the discard and
copies nothing (``uvm_migrate.c``). So whether ``cudaMemGetInfo`` sees a discard free memory is a question the
script answers by measuring, not by assumption.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

MB2 = 2 << 20  # the driver's VA block

# Error names that mean "this driver or binding does not do that", as opposed to a failure of the call:
# the part that needs the call is skipped with the reason instead of failing.
UNSUPPORTED = frozenset({"cudaErrorNotSupported", "cudaErrorCallRequiresNewerDriver", "cudaErrorNotYetImplemented",
                         "cudaErrorInsufficientDriver", "cudaErrorSymbolNotFound"})


class CudaError(RuntimeError):
    """A CUDA call returned an error: ``call`` is what was called, ``name`` the error's name."""

    def __init__(self, call: str, name: str):
        super().__init__(f"{call} failed: {name}")
        self.call, self.name = call, name

    @property
    def unsupported(self) -> bool:
        return self.name in UNSUPPORTED


class Cuda:
    """One device, one non-blocking stream (the batch calls refuse the legacy stream), two timing events.

    Every method that moves or frees memory queues on ``self.stream``, so the operations of one measurement run
    in the order they were issued (CUDA makes a prefetch that runs during a discard of the same range undefined
    behaviour). ``timed`` measures one call both ways: the calling thread's wall time inside the call (the
    time the caller is *held*) and the GPU time between events recorded before and after it.
    """

    def __init__(self, rt, device: int = 0):
        self.rt = rt
        self.dev = device
        self._allocs: list[tuple[str, object]] = []
        self.check(rt.cudaSetDevice(device), "cudaSetDevice")
        self.stream = self.check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self.e0 = self.check(rt.cudaEventCreate(), "cudaEventCreate")
        self.e1 = self.check(rt.cudaEventCreate(), "cudaEventCreate")
        self.gpu_loc = self._loc(rt.cudaMemLocationType.cudaMemLocationTypeDevice, device)
        self.host_loc = self._loc(rt.cudaMemLocationType.cudaMemLocationTypeHost, 0)  # id is ignored for Host

    # -- plumbing
    def _loc(self, typ, ident: int):
        loc = self.rt.cudaMemLocation()
        loc.type, loc.id = typ, ident
        return loc

    def check(self, res, what: str):
        """The outputs of a binding call (one value, a tuple, or None); raises ``CudaError`` on an error code."""
        err, *vals = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise CudaError(what, self.error_name(err))
        return vals[0] if len(vals) == 1 else (tuple(vals) or None)

    def error_name(self, err) -> str:
        try:
            name = self.rt.cudaGetErrorName(err)[1]
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 - a name is only for the message
            return str(err)

    def has(self, call: str) -> bool:
        """Whether the binding has ``call`` (a driver without it answers an UNSUPPORTED error instead)."""
        return hasattr(self.rt, call)

    def attribute(self, name: str) -> int:
        return int(self.check(self.rt.cudaDeviceGetAttribute(getattr(self.rt.cudaDeviceAttr, name), self.dev),
                              f"cudaDeviceGetAttribute({name})"))

    def versions(self) -> dict:
        return {"driver_api": int(self.check(self.rt.cudaDriverGetVersion(), "cudaDriverGetVersion")),
                "runtime_api": int(self.check(self.rt.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion"))}

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.check(self.rt.cudaMemGetInfo(), "cudaMemGetInfo")
        return int(free), int(total)

    # -- memory (freed by close(), newest first)
    def managed(self, nbytes: int) -> int:
        p = int(self.check(self.rt.cudaMallocManaged(nbytes, self.rt.cudaMemAttachGlobal), "cudaMallocManaged"))
        self._allocs.append(("cudaFree", p))
        return p

    def device(self, nbytes: int) -> int:
        p = int(self.check(self.rt.cudaMalloc(nbytes), "cudaMalloc"))
        self._allocs.append(("cudaFree", p))
        return p

    def pinned(self, nbytes: int) -> tuple[int, np.ndarray]:
        """Page-locked host memory and a NumPy view of it (the host side of every copy)."""
        p = int(self.check(self.rt.cudaMallocHost(nbytes), "cudaMallocHost"))
        self._allocs.append(("cudaFreeHost", p))
        return p, np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(p))

    def mark(self) -> int:
        """The allocations made so far: ``free_since(mark)`` frees those made after this point."""
        return len(self._allocs)

    def free_since(self, mark: int) -> None:
        """Wait for the stream, then free what was allocated after ``mark``, newest first (errors ignored: this
        runs after a failure too)."""
        self.rt.cudaStreamSynchronize(self.stream)
        while len(self._allocs) > mark:
            fn, p = self._allocs.pop()
            getattr(self.rt, fn)(p)

    def close(self) -> None:
        """Wait for the stream, then free everything (errors ignored: this runs after a failure too)."""
        self.free_since(0)
        for ev in (self.e0, self.e1):
            self.rt.cudaEventDestroy(ev)
        self.rt.cudaStreamDestroy(self.stream)

    # -- operations queued on the stream
    def copy(self, dst: int, src: int, nbytes: int) -> None:
        # cudaMemcpyDefault: the direction follows from the pointers (managed memory is neither side's own)
        self.check(self.rt.cudaMemcpyAsync(dst, src, nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDefault, self.stream),
                   "cudaMemcpyAsync")

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self.check(self.rt.cudaMemsetAsync(ptr, value, nbytes, self.stream), "cudaMemsetAsync")

    def prefetch(self, ptr: int, nbytes: int, to_gpu: bool) -> None:
        loc = self.gpu_loc if to_gpu else self.host_loc
        self.check(self.rt.cudaMemPrefetchAsync(ptr, nbytes, loc, 0, self.stream),
                   f"cudaMemPrefetchAsync(to {'GPU' if to_gpu else 'host'})")

    def discard(self, ranges: list[tuple[int, int]]) -> None:
        self.check(self.rt.cudaMemDiscardBatchAsync([p for p, _ in ranges], [n for _, n in ranges], len(ranges), 0,
                                                    self.stream), "cudaMemDiscardBatchAsync")

    def discard_prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """Discard ``ranges`` and make them resident on the GPU without copying their (discarded) contents."""
        self.check(self.rt.cudaMemDiscardAndPrefetchBatchAsync(
            [p for p, _ in ranges], [n for _, n in ranges], len(ranges), [self.gpu_loc], [0], 1, 0, self.stream),
            "cudaMemDiscardAndPrefetchBatchAsync")

    def prefer_host(self, ptr: int, nbytes: int, on: bool) -> None:
        """Preferred location = host and a standing GPU mapping (zero-copy access), or both undone."""
        adv = self.rt.cudaMemoryAdvise
        if on:
            calls = ((adv.cudaMemAdviseSetPreferredLocation, self.host_loc), (adv.cudaMemAdviseSetAccessedBy, self.gpu_loc))
        else:
            calls = ((adv.cudaMemAdviseUnsetAccessedBy, self.gpu_loc), (adv.cudaMemAdviseUnsetPreferredLocation, self.host_loc))
        for advice, loc in calls:
            self.check(self.rt.cudaMemAdvise(ptr, nbytes, advice, loc), f"cudaMemAdvise({advice.name})")

    def sync(self) -> None:
        self.check(self.rt.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def timed(self, fn) -> tuple[float, float]:
        """(host seconds inside ``fn``, GPU seconds from an event before it to one after it); waits for the GPU."""
        rt = self.rt
        self.check(rt.cudaEventRecord(self.e0, self.stream), "cudaEventRecord")
        t0 = time.perf_counter()
        fn()
        host = time.perf_counter() - t0
        self.check(rt.cudaEventRecord(self.e1, self.stream), "cudaEventRecord")
        self.check(rt.cudaEventSynchronize(self.e1), "cudaEventSynchronize")
        ms = self.check(rt.cudaEventElapsedTime(self.e0, self.e1), "cudaEventElapsedTime")
        return host, float(ms) / 1e3


# ------------------------------------------------------------------------------------- kernels for remote access

# A streaming read (sum of the 32-bit words, wrapping at 2^64, 16-byte loads) and a streaming write (one 32-bit
# value everywhere). The address goes as a 64-bit integer: no CuPy memory object wraps managed memory it did
# not allocate.
KERNEL_SOURCE = r"""
extern "C" __global__ void uvmp_read(unsigned long long addr, unsigned long long n16, unsigned long long out) {
    const uint4* p = (const uint4*)addr;
    unsigned long long acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc += (unsigned long long)v.x + (unsigned long long)v.y + (unsigned long long)v.z + (unsigned long long)v.w;
    }
    atomicAdd((unsigned long long*)out, acc);
}
extern "C" __global__ void uvmp_write(unsigned long long addr, unsigned long long n16, unsigned int value) {
    uint4* p = (uint4*)addr;
    uint4 v = make_uint4(value, value, value, value);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = v;
}
"""


def word_sum(host: np.ndarray) -> int:
    """The read kernel's checksum of ``host`` bytes: the sum of its 32-bit words modulo 2^64."""
    return int(host.view(np.uint32).sum(dtype=np.uint64))


class CupyKernels:
    """``KERNEL_SOURCE`` through CuPy's ``RawModule`` (NVRTC), launched on ``cuda.stream``."""

    name = "cupy RawModule"

    def __init__(self, cuda: Cuda):
        import cupy
        self.cupy, self.cuda = cupy, cuda
        mod = cupy.RawModule(code=KERNEL_SOURCE)
        self._read, self._write = mod.get_function("uvmp_read"), mod.get_function("uvmp_write")
        self.grid = (8 * cuda.attribute("cudaDevAttrMultiProcessorCount"),)
        self.out = cuda.device(8)
        self.out_host, self.out_view = cuda.pinned(8)
        cuda.memset(self.out, 0, 8)
        cuda.sync()

    def _launch(self, fn, args) -> None:
        with self.cupy.cuda.ExternalStream(int(self.cuda.stream)):
            fn(self.grid, (256,), args)

    def read(self, addr: int, nbytes: int) -> None:
        self._launch(self._read, (np.uint64(addr), np.uint64(nbytes // 16), np.uint64(self.out)))

    def checksum(self) -> int:
        """The last read's checksum (waits for the stream; leaves the accumulator at zero)."""
        self.cuda.copy(self.out_host, self.out, 8)
        self.cuda.memset(self.out, 0, 8)
        self.cuda.sync()
        return int(self.out_view.view(np.uint64)[0])

    def write(self, addr: int, nbytes: int, value: int) -> None:
        self._launch(self._write, (np.uint64(addr), np.uint64(nbytes // 16), np.uint32(value)))

    expected = staticmethod(word_sum)


class TorchKernels:
    """The same read and write as torch reductions over a zero-copy view (where CuPy is missing)."""

    name = "torch (sum / fill_)"

    def __init__(self, cuda: Cuda):
        import torch
        self.torch, self.cuda = torch, cuda
        self.stream = torch.cuda.ExternalStream(int(cuda.stream))
        self._last = None

    def _view(self, addr: int, nbytes: int):
        class _Cai:
            __cuda_array_interface__ = {"shape": (nbytes // 4,), "typestr": "<i4", "data": (addr, False),
                                        "version": 2, "strides": None}
        return self.torch.as_tensor(_Cai(), device="cuda")

    def read(self, addr: int, nbytes: int) -> None:
        with self.torch.cuda.stream(self.stream):
            self._last = self.torch.sum(self._view(addr, nbytes), dtype=self.torch.int64)

    def checksum(self) -> int:
        self.cuda.sync()
        return int(self._last.item()) % (1 << 64)

    def write(self, addr: int, nbytes: int, value: int) -> None:
        signed = value - (1 << 32) if value >= (1 << 31) else value
        with self.torch.cuda.stream(self.stream):
            self._view(addr, nbytes).fill_(signed)

    @staticmethod
    def expected(host: np.ndarray) -> int:
        return int(host.view(np.int32).sum(dtype=np.int64)) % (1 << 64)


def smoke_test(kern, cuda: Cuda) -> None:
    """Write and read back 4 KiB of device memory: the kernels compile, launch on the stream and compute."""
    buf = cuda.device(4096)
    kern.write(buf, 4096, 0x01020304)
    kern.read(buf, 4096)
    got, want = kern.checksum(), kern.expected(np.full(1024, 0x01020304, np.uint32).view(np.uint8))
    if got != want:
        raise RuntimeError(f"smoke test: checksum {got} != {want}")


def load_kernels(cuda: Cuda):
    """(kernels, notes): CuPy's where they compile and pass the smoke test, else torch's; (None, notes) when
    neither does."""
    notes = []
    for cls in (CupyKernels, TorchKernels):
        try:
            kern = cls(cuda)
            smoke_test(kern, cuda)
            return kern, notes
        except Exception as e:  # noqa: BLE001 - a missing or broken kernel path is a finding: say it, try the next
            notes.append(f"{cls.name}: {type(e).__name__}: {str(e)[:200]}")
    return None, notes
