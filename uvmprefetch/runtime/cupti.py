"""Optional driver-level observation through CUPTI (``pip install 'uvmprefetch[cupti]'``: ``cupti-python``).

What the dispatcher and the shim cannot see: every kernel the GPU ran (cuBLAS/cuDNN launch through driver
entry points) and unified-memory activity — GPU page faults and bytes migrated each way. Records arrive in
buffers, asynchronously; the cuda backend flushes them at each iteration end and puts the totals in the
report (``faults`` becomes the CUPTI GPU page-fault count instead of null). Nothing here is required: a
missing package or any CUPTI error leaves ``available()`` False with the reason, and the runtime goes on.

CUPTI allows one user of its activity API per process: ``torch.profiler`` in the same run will clash
(whichever registers second gets an error; ours is then switched off and the reason reported).
"""

from __future__ import annotations

import ctypes

# CUpti_ActivityUnifiedMemoryCounterScope / Kind (cupti_activity.h)
_SCOPE_PROCESS_SINGLE_DEVICE = 1
_UM_HTOD, _UM_DTOH, _UM_GPU_FAULT = 1, 2, 4


class _UmCounterConfig(ctypes.Structure):
    """CUpti_ActivityUnifiedMemoryCounterConfig: scope, kind, deviceId, enable (all 32-bit)."""

    _fields_ = [("scope", ctypes.c_uint32), ("kind", ctypes.c_uint32), ("device_id", ctypes.c_uint32),
                ("enable", ctypes.c_uint32)]


def available() -> tuple[bool, str]:
    """(True, version) when ``cupti-python`` imports, else (False, why)."""
    try:
        from cupti import cupti  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or a CUPTI library missing underneath
        return False, f"cupti-python not usable: {type(e).__name__}: {e}"
    return True, "cupti-python importable"


class CuptiObserver:
    """Counts kernels and unified-memory faults/migrations on one device.

    Raises
    ------
    RuntimeError
        If CUPTI refuses (another activity user, no permission to profile): the caller reports and goes on.
    """

    def __init__(self, device: int = 0, cupti_module=None) -> None:
        if cupti_module is None:
            from cupti import cupti as cupti_module
        c = self.c = cupti_module
        self.kernels = 0
        self.gpu_faults = 0
        self.bytes_htod = 0
        self.bytes_dtoh = 0
        self.kernel_names: dict[str, int] = {}
        self._cfg = (_UmCounterConfig * 3)(*[_UmCounterConfig(_SCOPE_PROCESS_SINGLE_DEVICE, k, device, 1)
                                             for k in (_UM_HTOD, _UM_DTOH, _UM_GPU_FAULT)])
        self._kinds = []
        try:
            c.activity_configure_unified_memory_counter(ctypes.addressof(self._cfg), len(self._cfg))
            c.activity_register_callbacks(self._requested, self._completed)
            for kind in (c.ActivityKind.CONCURRENT_KERNEL, c.ActivityKind.UNIFIED_MEMORY_COUNTER):
                c.activity_enable(kind)
                self._kinds.append(kind)
        except Exception as e:  # noqa: BLE001 - CUPTI errors come as its own exception type
            self.close()
            raise RuntimeError(f"CUPTI refused: {type(e).__name__}: {e}") from None

    @staticmethod
    def _requested():
        return 8 << 20, 0  # an 8 MiB buffer, as many records as fit

    def _completed(self, activities) -> None:
        c = self.c
        for a in activities:
            if a.kind == c.ActivityKind.CONCURRENT_KERNEL:
                self.kernels += 1
                name = getattr(a, "name", "")
                self.kernel_names[name] = self.kernel_names.get(name, 0) + 1
            elif a.kind == c.ActivityKind.UNIFIED_MEMORY_COUNTER:
                kind, value = int(getattr(a, "counter_kind", 0)), int(getattr(a, "value", 0))
                if kind == _UM_GPU_FAULT:
                    self.gpu_faults += 1  # one record per fault group the driver serviced
                elif kind == _UM_HTOD:
                    self.bytes_htod += value
                elif kind == _UM_DTOH:
                    self.bytes_dtoh += value

    def flush(self) -> None:
        self.c.activity_flush_all(1)

    def result(self) -> dict:
        top = sorted(self.kernel_names.items(), key=lambda kv: -kv[1])[:10]
        return {"kernels": self.kernels, "gpu_page_fault_groups": self.gpu_faults,
                "um_bytes_htod": self.bytes_htod, "um_bytes_dtoh": self.bytes_dtoh, "top_kernels": top}

    def close(self) -> None:
        for kind in self._kinds:
            try:
                self.c.activity_disable(kind)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        self._kinds = []
