"""The cuda backend on a CPU: a fake at the true boundary (``runtime.mover.CudaApi``), everything behind it real.

What is fake, and only that:

- ``FakeRuntime`` stands where ``cuda.bindings.runtime`` stands: the names the ``Mover`` calls, with cuda-python's
  argument order and ``(cudaError_t, *outputs)`` return tuples. Each call is logged (``calls``: kind, address,
  bytes, destination, stream, calling thread) and returns success; it is strict where a driver is (a zero-length or
  null range, a location of the wrong type, the legacy stream for a prefetch, advice that is not an advice:
  ``cudaErrorInvalidValue``), and ``fail`` makes the n-th call of a kind fail (injected errors).
- ``FakeTorchCuda`` stands where ``torch.cuda`` stands for the backend and the mover: device queries, non-blocking
  streams (numbered handles) and events. The fake GPU is idle: an event completes once recorded and ``lag`` more
  events were recorded after it (0: at once); an event never recorded reads as complete, as CUDA's does.
- ``CpuShim`` stands where the LD_PRELOAD shim stands: the managed allocations are one 2 MiB segment per block the
  backend has numbered (so each block's move is its own call: on a GPU, blocks of one large caching-allocator
  segment merge into fewer calls), and the managed bytes are this process's resident bytes.
- GPU progress: on a CPU no op has a stream, so the observer records no progress events; an op has run once the
  next op was recorded (``cpu_progress``: ``NativeProgress`` over the observer's own sequence numbers).
- ``build_libcudart``: a tiny C library with the five calls ``kernels/gate.cpp`` resolves (``uvmgate_init``).

``start(cfg, ...)`` switches the runtime on with a real ``CudaBackend`` over these fakes and the real C++ observer,
planner thread, mover thread, policy and books; the observer watches the CPU's ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import threading
import time
import types
from enum import IntEnum
from pathlib import Path

cudaError_t = IntEnum("cudaError_t", {"cudaSuccess": 0, "cudaErrorInvalidValue": 1, "cudaErrorLaunchFailure": 719})
cudaMemLocationType = IntEnum("cudaMemLocationType", {"cudaMemLocationTypeInvalid": 0, "cudaMemLocationTypeDevice": 1,
                                                      "cudaMemLocationTypeHost": 2})
cudaMemoryAdvise = IntEnum("cudaMemoryAdvise", {f"cudaMemAdvise{a}": i + 1 for i, a in enumerate(
    ("SetReadMostly", "UnsetReadMostly", "SetPreferredLocation", "UnsetPreferredLocation", "SetAccessedBy",
     "UnsetAccessedBy"))})
OK, BAD = (cudaError_t.cudaSuccess,), (cudaError_t.cudaErrorInvalidValue,)
GIB = 1 << 30


class cudaMemLocation:  # noqa: N801 - cuda-python's name
    type = cudaMemLocationType.cudaMemLocationTypeInvalid
    id = 0


class FakeRuntime:
    """``cuda.bindings.runtime`` as the ``Mover`` uses it (module docstring). ``fail``: {kind: n}: the n-th call
    (1-based) of that kind, and every later one, returns ``cudaErrorLaunchFailure``."""

    cudaError_t = cudaError_t
    cudaMemLocationType = cudaMemLocationType
    cudaMemLocation = cudaMemLocation
    cudaMemoryAdvise = cudaMemoryAdvise
    cudaHostAllocMapped = 2

    def __init__(self, fail: dict | None = None) -> None:
        self.calls: list = []  # (kind, address, bytes, "gpu"/"host"/advice, stream, thread name)
        self.counts: dict = {}
        self.fail = dict(fail or {})
        self.streams: set = set()  # handles of the non-blocking streams made (FakeTorchCuda.Stream)
        self._words: list = []  # the discard gate's host words (kept alive)

    def _log(self, kind: str, ptr: int, size: int, where, stream: int):
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if kind in self.fail and n >= self.fail[kind]:
            return (cudaError_t.cudaErrorLaunchFailure,)
        self.calls.append((kind, int(ptr), int(size), where, int(stream), threading.current_thread().name))
        return OK

    @staticmethod
    def _where(loc) -> str | None:
        return {cudaMemLocationType.cudaMemLocationTypeDevice: "gpu",
                cudaMemLocationType.cudaMemLocationTypeHost: "host"}.get(getattr(loc, "type", None))

    def _range_ok(self, ptr, size) -> bool:
        return int(ptr) > 0 and int(size) > 0

    def cudaGetErrorName(self, err):
        return OK + (cudaError_t(int(err)).name.encode(),)

    def cudaSetDevice(self, dev: int):
        return OK if int(dev) == 0 else BAD

    def cudaMemPrefetchAsync(self, ptr, size, loc, flags, stream):
        where = self._where(loc)
        if where is None or flags != 0 or not self._range_ok(ptr, size) or int(stream) not in self.streams:
            return BAD
        return self._log("prefetch", ptr, size, where, stream)

    def cudaMemPrefetchBatchAsync(self, ptrs, sizes, count, locs, loc_idx, n_locs, flags, stream):
        if count != len(ptrs) or count != len(sizes) or n_locs != len(locs) or int(stream) not in self.streams:
            return BAD
        if any(self._where(x) is None for x in locs) or not all(map(self._range_ok, ptrs, sizes)):
            return BAD
        for p, s in zip(ptrs, sizes):
            r = self._log("prefetch", p, s, self._where(locs[0]), stream)
            if r != OK:
                return r
        return OK

    def cudaMemDiscardBatchAsync(self, ptrs, sizes, count, flags, stream):
        if count != len(ptrs) or count != len(sizes) or int(stream) not in self.streams:
            return BAD
        for p, s in zip(ptrs, sizes):
            r = self._log("discard", p, s, None, stream)
            if r != OK:
                return r
        return OK

    def cudaMemAdvise(self, ptr, size, advice, loc):
        if not isinstance(advice, cudaMemoryAdvise) or self._where(loc) is None or not self._range_ok(ptr, size):
            return BAD
        return self._log("advise", ptr, size, advice.name, 0)

    def cudaHostAlloc(self, size, flags):
        buf = ctypes.create_string_buffer(int(size))
        self._words.append(buf)
        return OK + (ctypes.addressof(buf),)

    def cudaHostGetDevicePointer(self, host, flags):
        return OK + (int(host),)

    def mark(self, *what) -> None:
        """A test's marker in the call log (``("mark", *what)``), e.g. submitted to the mover's queue between moves."""
        self.calls.append(("mark", *what))

    def moves(self, kind: str = "prefetch") -> list:
        return [c for c in self.calls if c[0] == kind]


class FakeDriverApi:
    """``cuda.bindings.driver``'s stream memory operations (the discard gate): logged, successful."""

    class CUresult(IntEnum):
        CUDA_SUCCESS = 0

    class CUstreamWaitValue_flags(IntEnum):
        CU_STREAM_WAIT_VALUE_GEQ = 0

    CUstream = CUdeviceptr = int

    def __init__(self) -> None:
        self.calls: list = []

    def cuStreamWaitValue32(self, stream, addr, value, flags):
        self.calls.append(("wait_value", int(stream), int(value)))
        return (self.CUresult.CUDA_SUCCESS,)

    def cuStreamWriteValue32(self, stream, addr, value, flags):
        self.calls.append(("write_value", int(stream), int(value)))
        return (self.CUresult.CUDA_SUCCESS,)


class FakeEvent:
    def __init__(self, gpu: "FakeTorchCuda", enable_timing: bool = False) -> None:
        self.gpu = gpu
        self.cuda_event = gpu._new_handle()
        self.at = None  # the fake GPU's event count when recorded

    def record(self, stream=None) -> None:
        with self.gpu._lock:
            self.gpu.recorded += 1
            self.at = self.gpu.recorded

    def query(self) -> bool:
        return self.at is None or self.gpu.recorded - self.at >= self.gpu.lag

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.0


class FakeStream:
    def __init__(self, gpu: "FakeTorchCuda", handle: int) -> None:
        self.gpu, self.cuda_stream = gpu, handle
        self.waits: list = []

    def wait_event(self, ev) -> None:
        self.waits.append(ev.cuda_event)

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass


class FakeTorchCuda:
    """``torch.cuda`` as the cuda backend and the mover call it (module docstring)."""

    def __init__(self, rt: FakeRuntime, total_bytes: int = 80 * GIB, lag: int = 0) -> None:
        self.rt, self.total, self.lag = rt, int(total_bytes), int(lag)
        self.recorded = 0
        self._lock = threading.Lock()
        self._handles = 0x1000
        self._current = FakeStream(self, 0)  # the legacy default stream: never a prefetch stream

    def _new_handle(self) -> int:
        with self._lock:
            self._handles += 0x10
            return self._handles

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return False

    def init(self) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def set_device(self, device) -> None:
        if int(device) != 0:
            raise RuntimeError(f"fake GPU: no device {device}")

    def get_device_name(self, device=None) -> str:
        return "fake GPU (CPU run)"

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return self.total, self.total

    def memory_reserved(self, device=None) -> int:
        return 0

    def memory_snapshot(self) -> list:
        return []

    def is_current_stream_capturing(self) -> bool:
        return False

    def Stream(self, device=None, priority=0) -> FakeStream:  # noqa: N802 - torch's name
        h = self._new_handle()
        self.rt.streams.add(h)
        return FakeStream(self, h)

    def Event(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):  # noqa: N802
        return FakeEvent(self, enable_timing)

    def current_stream(self, device=None) -> FakeStream:
        return self._current


class FakeDriver:
    """What ``runtime.device.require_cuda`` returns: a CUDA 13 driver with the batch API."""

    version, batch_api, name, error, devices = 13000, True, "fake GPU (CPU run)", "", 1
    managed = concurrent_managed = True


class CpuShim:
    """The LD_PRELOAD shim's view (``runtime.shim.Shim``) on a CPU (module docstring). ``blocks``: the backend's
    block numbers (``CudaBackend._ids``), set once the backend exists."""

    def __init__(self, block_size: int = 2 << 20, total_bytes: int = 80 * GIB) -> None:
        self.bs, self.total = block_size, int(total_bytes)
        self.blocks: dict = {}
        self._rss, self._rss_at = 0, -1.0

    def stats(self) -> dict:
        n = len(self.blocks)
        now = time.monotonic()
        if now - self._rss_at > 0.01:  # (the backend asks per launch: /proc read at most every 10 ms)
            self._rss, self._rss_at = _resident_bytes(), now
        return {"n_alloc": n, "n_free": 0, "managed_bytes": self._rss, "peak_managed_bytes": n * self.bs,
                "limit_bytes": self.total, "n_refused": 0, "n_errors": 0, "n_launches": 0, "n_launches_dropped": 0}

    def segments(self) -> list[tuple[int, int]]:
        bs = self.bs
        return [(b * bs, bs) for b in sorted(self.blocks)]

    def limit(self) -> dict:
        return {"limit_bytes": self.total, "mode": "bytes", "requested": self.total, "device_free": self.total,
                "device_total": self.total, "gpu_cap": self.total, "host_known": False, "mem_available": 0,
                "cgroup_room": None, "cgroup_version": 0, "host_margin": 0, "host_backed": 0}

    def read_launches(self) -> list:
        return []

    def count_unknown_kernels(self, lib) -> bool:
        return False  # (no kernels run on a CPU: nothing for the shim to count)


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return 0


class _CpuSeq:
    """``NativeProgress``'s view of the observer library on a CPU: the newest finished op is the one before the
    newest recorded (an op runs on the CPU between its record and the next)."""

    def __init__(self, lib) -> None:
        self.lib = self
        self._held = lib.held

    def uvmgate_completed_seq(self) -> int:
        return max(0, int(self._held.uvmobs_seq()) - 1)


def cpu_progress(lib, max_blocks: int):
    from uvmprefetch.runtime.native_observer import NativeProgress
    return NativeProgress(_CpuSeq(lib), max_blocks)


FAKE_LIBCUDART = r"""
#include <stdint.h>
static uintptr_t next_event = 0x1000;
int n_waits, n_records;
int cudaStreamWaitEvent(void *s, void *e, unsigned f) { (void)s; (void)e; (void)f; n_waits++; return 0; }
int cudaEventCreateWithFlags(void **e, unsigned f) { (void)f; *e = (void *)next_event; next_event += 0x10; return 0; }
int cudaEventRecord(void *e, void *s) { (void)e; (void)s; n_records++; return 0; }
int cudaEventQuery(void *e) { (void)e; return 0; }
int cudaStreamIsCapturing(void *s, int *st) { (void)s; *st = 0; return 0; }
"""


def build_libcudart(folder) -> Path:
    """Compile the fake libcudart the pre-op gate resolves its calls from (``UVMPREFETCH_CUDART``) into ``folder``.

    Raises
    ------
    subprocess.CalledProcessError
        The C compiler failed.
    """
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    (d / "fakecudart.c").write_text(FAKE_LIBCUDART)
    so = d / "libfakecudart.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(so), str(d / "fakecudart.c")], check=True,
                   capture_output=True)
    return so


def api(fail: dict | None = None, lag: int = 0):
    """(``CudaApi`` over the fakes, the ``FakeRuntime``, the ``FakeTorchCuda``, the ``FakeDriverApi``)."""
    from uvmprefetch.runtime.mover import CudaApi
    rt = FakeRuntime(fail)
    tc = FakeTorchCuda(rt, lag=lag)
    drv = FakeDriverApi()
    return (CudaApi(rt=rt, torch=types.SimpleNamespace(cuda=tc), drv=drv, require_cuda=FakeDriver,
                    native_progress=cpu_progress, device_type="cpu"), rt, tc, drv)


def session(cfg, fail: dict | None = None, lag: int = 0, dormant: bool = False):
    """A ``Session`` (not started) whose backend is a real ``CudaBackend`` over the fakes (``cfg.backend`` "cuda"),
    and the ``FakeRuntime``."""
    from uvmprefetch.runtime.cuda_backend import CudaBackend
    from uvmprefetch.runtime.session import Session, build_policy
    a, rt, _, _ = api(fail, lag)
    shim = CpuShim()
    be = CudaBackend(cfg, build_policy(cfg), shim=shim, api=a)
    shim.blocks = be._ids
    s = Session(cfg, backend=be, dormant=dormant)
    s.policy = be.policy  # (the session's own policy object would be a second one, never told of a launch)
    return s, rt


@contextlib.contextmanager
def gate_library(libcudart):
    """``UVMPREFETCH_CUDART`` is the fake ``libcudart`` (``build_libcudart``) inside: the pre-op gate resolves its
    calls from it when the backend attaches to the C++ observer."""
    saved = os.environ.get("UVMPREFETCH_CUDART")
    os.environ["UVMPREFETCH_CUDART"] = str(libcudart)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("UVMPREFETCH_CUDART", None)
        else:
            os.environ["UVMPREFETCH_CUDART"] = saved


def start(cfg, libcudart, fail: dict | None = None, lag: int = 0, dormant: bool = False):
    """``session(...)`` started (the C++ observer, the planner and mover threads run; stop it with ``stop()``)."""
    s, rt = session(cfg, fail, lag, dormant)
    with gate_library(libcudart):
        s.start()
    return s, rt
