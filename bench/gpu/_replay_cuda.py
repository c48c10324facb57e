"""The GPU replay on a real GPU: cuda-python for memory and events (``_evict_cuda.Cuda``), the touch kernels of
``kernels/touch.cu`` through CuPy (NVRTC), and the unified-memory counts CUPTI gave the runtime where it ran.

Kernel arguments (``kernels/touch.cu``)::

    uvmp_touch(u64 table, u64 first, u32 n, u64 spin_ns, u32 stamp, u64 sink)
    uvmp_touch_count(u64 table, u64 first, u32 n, u64 spin_ns, u32 stamp, u64 sink, u64 counts, u64 count_base)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from _evict_cuda import Cuda
from _replay_core import Device

SOURCE = Path(__file__).resolve().parents[2] / "kernels" / "touch.cu"
THREADS = 256
CTAS_PER_SM = 2  # 2 x 256 threads: every CTA of a launch is resident at once (each spins from its own start)


class TouchKernels:
    """``kernels/touch.cu`` compiled by CuPy, launched on the replay's compute stream (``cuda.stream``)."""

    name = "cupy RawModule (kernels/touch.cu)"

    def __init__(self, cuda: Cuda) -> None:
        import cupy
        mod = cupy.RawModule(code=SOURCE.read_text(), options=("--std=c++14",))
        self._touch, self._count = mod.get_function("uvmp_touch"), mod.get_function("uvmp_touch_count")
        self.max_grid = CTAS_PER_SM * cuda.attribute("cudaDevAttrMultiProcessorCount")
        self.sink = cuda.device(16)
        cupy.cuda.ExternalStream(int(cuda.stream)).use()  # CuPy launches on the current stream

    def touch(self, table: int, first: int, n: int, spin_ns: int, stamp: int) -> None:
        self._touch((max(1, min(n, self.max_grid)),), (THREADS,),
                    (np.uint64(table), np.uint64(first), np.uint32(n), np.uint64(spin_ns), np.uint32(stamp),
                     np.uint64(self.sink)))

    def touch_count(self, table: int, first: int, n: int, spin_ns: int, stamp: int, counts: int, base: int) -> None:
        self._count((max(1, min(n, self.max_grid)),), (THREADS,),
                    (np.uint64(table), np.uint64(first), np.uint32(n), np.uint64(spin_ns), np.uint32(stamp),
                     np.uint64(self.sink), np.uint64(counts), np.uint64(base)))


class CudaDevice(Device):
    """GPU 0 through cuda-python and CuPy.

    Raises
    ------
    ImportError
        cuda-python or CuPy missing.
    _evict_cuda.CudaError
        A CUDA call failed while setting up.
    """

    kind = "gpu"

    def __init__(self, name: str) -> None:
        from cuda.bindings import runtime as rt
        cuda = Cuda(rt)
        super().__init__(cuda, TouchKernels(cuda), name)

    def measured(self, backend_result: dict) -> dict:
        """GPU page-fault groups and bytes each way from CUPTI, where the runtime had it (``cupti-python``);
        ``None`` each otherwise: nothing else on the GPU counts them."""
        cup = backend_result.get("cupti")
        if not cup:
            return {"faults": None, "bytes_htod": None, "bytes_dtoh": None, "measured_by": None,
                    "not_measured": f"faults and bytes: CUPTI not active ({backend_result.get('cupti_status')})"}
        return {"faults": cup.get("gpu_page_fault_groups"), "bytes_htod": cup.get("um_bytes_htod"),
                "bytes_dtoh": cup.get("um_bytes_dtoh"), "measured_by": "CUPTI unified-memory counters"}

