"""Roofline duration model: how long one launch takes on a GPU profile, from its FLOPs and bytes.

``duration = max(flops / (peak(dtype) * matmul_efficiency), bytes / (hbm_bw * memory_efficiency))
+ launch_overhead_s``. ``peak(dtype)`` is the profile's dense peak for the dtype the FLOPs run in: fp32
matmuls run at the fp32 (non tensor-core) peak, because PyTorch disables TF32 for matmuls by default; bf16
and fp16 run at the tensor-core peak. Only matmul-like ops (mm, addmm, bmm, convolutions, attention kernels:
``torch.utils.flop_counter``'s registry) have FLOPs; every other op is memory-bound by construction.
The model and its limits are documented in ``docs/recording.md``.
"""

from __future__ import annotations

import numpy as np

from ..gpus import GpuProfile, get_profile

# Codes for the dtype a launch's FLOPs run in; stored in a trace's meta as run-length pairs (see ``dtype_runs``).
FLOP_DTYPES = ("fp32", "tf32", "bf16", "fp16")


def _profile(profile: GpuProfile | str) -> GpuProfile:
    return get_profile(profile) if isinstance(profile, str) else profile


def estimate(flops: float, nbytes: float, dtype: str, profile: GpuProfile | str) -> float:
    """Estimated seconds for one launch.

    Parameters
    ----------
    flops : float
        Floating-point operations of the launch (0 for memory-bound ops).
    nbytes : float
        Bytes the launch reads plus writes.
    dtype : str
        'fp32', 'tf32', 'bf16' or 'fp16': the precision its FLOPs run in.
    profile : GpuProfile or str
        The GPU (a profile or its name).

    Raises
    ------
    ConfigError
        If ``profile`` names no known GPU.
    """
    return estimator(profile)(flops, nbytes, dtype)


def estimator(profile: GpuProfile | str):
    """``estimate`` for one profile, as a function ``(flops, nbytes, dtype) -> seconds`` with the profile's rates
    looked up once (the live runtime estimates every launch; the same figures as ``estimate``, bit for bit).

    Raises
    ------
    ConfigError
        If ``profile`` names no known GPU.
    """
    p = _profile(profile)
    matmul = {d: p.peak_flops(d) * p.matmul_efficiency for d in FLOP_DTYPES}
    hbm = p.hbm_bw * p.memory_efficiency
    overhead = p.launch_overhead_s

    def duration(flops: float, nbytes: float, dtype: str) -> float:
        rate = matmul.get(dtype)
        if rate is None:
            rate = p.peak_flops(dtype) * p.matmul_efficiency
        return max(flops / rate, nbytes / hbm) + overhead
    return duration


def dtype_codes(trace) -> np.ndarray:
    """Per-launch index into ``FLOP_DTYPES`` from ``trace.meta['flop_dtype_runs']`` (``[[first_launch, dtype],
    ...]``, each run lasting to the next); traces without it use ``meta['dtype']`` or fp32 throughout."""
    n = trace.n_launches
    runs = (trace.meta or {}).get("flop_dtype_runs")
    if not runs:
        d = str((trace.meta or {}).get("dtype", "fp32"))
        return np.full(n, FLOP_DTYPES.index(d) if d in FLOP_DTYPES else 0, dtype=np.int8)
    starts = np.array([int(s) for s, _ in runs], dtype=np.int64)
    codes = np.array([FLOP_DTYPES.index(d) if d in FLOP_DTYPES else 0 for _, d in runs], dtype=np.int8)
    idx = np.searchsorted(starts, np.arange(n), side="right") - 1
    return np.where(idx >= 0, codes[np.clip(idx, 0, None)], 0).astype(np.int8)


def durations_for(trace, profile: GpuProfile | str) -> np.ndarray:
    """Estimated duration of every launch of ``trace`` on ``profile`` (vectorised ``estimate``).

    Raises
    ------
    ConfigError
        If ``profile`` names no known GPU.
    """
    p = _profile(profile)
    peaks = np.array([p.peak_flops(d) for d in FLOP_DTYPES], dtype=np.float64)
    peak = peaks[dtype_codes(trace)]
    compute = trace.launch_flops / (peak * p.matmul_efficiency)
    memory = trace.launch_bytes.astype(np.float64) / (p.hbm_bw * p.memory_efficiency)
    return np.maximum(compute, memory) + p.launch_overhead_s
