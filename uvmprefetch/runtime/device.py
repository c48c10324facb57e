"""Probes of the CUDA driver through ``libcuda.so.1`` (ctypes): cheap, no torch, no CUDA context.

The start-up hook runs ``require_cuda`` before anything else, so a missing GPU or driver feature is one clear
line at start-up instead of a crash later; ``uvmprefetch doctor`` prints every probe.
"""

from __future__ import annotations

import ctypes
import importlib.util

from ..errors import DeviceError

# CUdevice_attribute values (cuda.h, CUDA 13)
ATTR_MANAGED_MEMORY = 83
ATTR_CONCURRENT_MANAGED_ACCESS = 89
BATCH_SYMBOLS = ("cuMemPrefetchBatchAsync", "cuMemDiscardBatchAsync", "cuMemDiscardAndPrefetchBatchAsync")
BATCH_MIN_DRIVER = 13000  # the batched prefetch/discard calls are new in CUDA 13.0


class Driver:
    """What ``libcuda.so.1`` says; every field is None/False when it could not be asked (``error`` says why)."""

    def __init__(self) -> None:
        self.error = ""
        self.version = None
        self.devices = 0
        self.name = None
        self.total_bytes = None
        self.managed = False
        self.concurrent_managed = False
        self.batch_api = False
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            self.error = "libcuda.so.1 not found (no NVIDIA driver on this machine)"
            return
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            self.version = v.value
        rc = lib.cuInit(0)
        if rc != 0:
            self.error = f"cuInit failed with CUresult {rc} (no usable GPU, or the driver is not loaded)"
            return
        n = ctypes.c_int(0)
        lib.cuDeviceGetCount(ctypes.byref(n))
        self.devices = n.value
        if not n.value:
            self.error = "the driver sees no GPU"
            return
        dev = ctypes.c_int(0)
        lib.cuDeviceGet(ctypes.byref(dev), 0)
        buf = ctypes.create_string_buffer(256)
        if lib.cuDeviceGetName(buf, 256, dev) == 0:
            self.name = buf.value.decode(errors="replace")
        tot = ctypes.c_size_t(0)
        if lib.cuDeviceTotalMem_v2(ctypes.byref(tot), dev) == 0:
            self.total_bytes = tot.value

        def attr(a: int) -> int:
            out = ctypes.c_int(0)
            return out.value if lib.cuDeviceGetAttribute(ctypes.byref(out), a, dev) == 0 else 0

        self.managed = bool(attr(ATTR_MANAGED_MEMORY))
        self.concurrent_managed = bool(attr(ATTR_CONCURRENT_MANAGED_ACCESS))
        self.batch_api = (self.version or 0) >= BATCH_MIN_DRIVER and all(hasattr(lib, s) for s in BATCH_SYMBOLS)


def have_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require_cuda() -> Driver:
    """Check that the cuda backend can run here.

    Raises
    ------
    DeviceError
        No driver / no GPU, no managed memory or concurrent managed access, or cuda-python missing.
    """
    d = Driver()
    hint = "; UVMPREFETCH_BACKEND=dryrun runs on the CPU against a simulated GPU"
    if d.error:
        raise DeviceError(f"the cuda backend needs an NVIDIA GPU: {d.error}{hint}")
    if not d.managed:
        raise DeviceError(f"GPU 0 ({d.name}) does not support managed memory")
    if not d.concurrent_managed:
        raise DeviceError(f"GPU 0 ({d.name}) has no concurrent managed access (pre-Pascal GPU, Windows or WSL): "
                          "prefetching and eviction of managed memory need it")
    if not have_module("cuda.bindings"):
        raise DeviceError("the cuda backend needs cuda-python: pip install 'uvmprefetch[cuda]'")
    return d
