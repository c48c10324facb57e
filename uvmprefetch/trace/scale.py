"""A trace shrunk by a factor: the same launches over proportionally smaller memory, in proportionally less time.

The GPU replay (``bench/gpu/replay_gpu.py``) allocates a trace's footprint as managed memory, which must fit in
what the card has free; a trace recorded at a training shape of tens of GiB is replayed at ``scale < 1``.
``scale_trace`` keeps every launch, allocation, free, phase and iteration mark, and multiplies:

- every allocation's size by ``scale`` (at least 1 byte);
- every access's byte range: ``[off, off + len)`` becomes ``[floor(off * scale), ceil((off + len) * scale))``,
  clipped to the scaled allocation and at least 1 byte long, so an access stays inside its allocation and
  ranges that overlapped (or touched) still do;
- every launch's FLOPs, bytes and duration by ``scale``, so that compute and transfers shrink together and the
  ratio of a launch's time to the time its data takes over the link is roughly kept (a re-estimate on another
  GPU profile, ``roofline.durations_for``, still adds the profile's launch overhead in full).

What does not scale: the allocator's rounding (512 B, 2 MiB large-pool rounding, 2 MiB small-pool segments), so
small tensors pack more densely and the scaled footprint is not exactly ``scale`` times the original; the
number of launches, so per-launch costs (launch overhead, the runtime's host time, fault latency per block)
weigh more. The replay measures oversubscription on the scaled trace's own layout.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from .format import ARRAYS, Trace, validate


def parse_scale(text: str) -> float:
    """A scale given as ``0.125``, ``1/8`` or ``12.5%``.

    Raises
    ------
    ConfigError
        Not a number in (0, 1].
    """
    s = str(text).strip()
    try:
        if s.endswith("%"):
            v = float(s[:-1]) / 100
        elif "/" in s:
            num, den = s.split("/", 1)
            v = float(num) / float(den)
        else:
            v = float(s)
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"--scale {text!r}: expected a number in (0, 1] such as 0.125, 1/8 or 12.5%") from None
    if not (math.isfinite(v) and 0 < v <= 1):
        raise ConfigError(f"--scale {text!r}: must be in (0, 1] (1 = the trace as recorded)")
    return v


def scale_trace(t: Trace, scale: float) -> Trace:
    """``t`` with sizes, access ranges, FLOPs, bytes and durations multiplied by ``scale`` (module docstring).

    Raises
    ------
    ConfigError
        ``scale`` not in (0, 1].
    """
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and 0 < scale <= 1):
        raise ConfigError(f"trace scale {scale!r} must be in (0, 1]")
    meta = dict(t.meta or {})
    if scale == 1:
        return Trace(names=list(t.names), meta=meta, **{k: getattr(t, k).copy() for k in ARRAYS})
    size = np.maximum(1, np.round(t.alloc_size * scale)).astype(np.int64)
    a = t.acc_alloc
    end = np.minimum(np.ceil((t.acc_off + t.acc_len) * scale).astype(np.int64), size[a])
    off = np.minimum(np.floor(t.acc_off * scale).astype(np.int64), end - 1)
    end = np.maximum(end, off + 1)
    meta["scale"] = float(scale) * float(meta.get("scale", 1.0))
    out = Trace(names=list(t.names), meta=meta, alloc_size=size, alloc_at=t.alloc_at.copy(), free_at=t.free_at.copy(),
                free_rank=t.free_rank.copy(), alloc_kind=t.alloc_kind.copy(), launch_name=t.launch_name.copy(),
                launch_exec_id=t.launch_exec_id.copy(), launch_phase=t.launch_phase.copy(),
                launch_iter=t.launch_iter.copy(), launch_flops=t.launch_flops * scale,
                launch_bytes=np.round(t.launch_bytes * scale).astype(np.int64), launch_dur=t.launch_dur * scale,
                acc_ptr=t.acc_ptr.copy(), acc_alloc=a.copy(), acc_off=off, acc_len=end - off,
                acc_mode=t.acc_mode.copy())
    validate(out)
    return out

