"""GIVEN a recorded trace WHEN it is scaled down (uvmprefetch/trace/scale.py, the GPU replay's --scale) THEN every
launch, allocation, free and mark stays, sizes, ranges, FLOPs and durations shrink by the factor, every access
stays inside its allocation, and accesses that overlapped still overlap."""

from pathlib import Path

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.trace.format import TraceBuilder, load, READ, WRITE
from uvmprefetch.trace.scale import parse_scale, scale_trace

SHIPPED = Path(__file__).resolve().parents[2] / "traces" / "gpt2-small-b2s128.uvmt"


def test_parse_scale_forms_and_errors():
    assert parse_scale("0.125") == parse_scale("1/8") == parse_scale("12.5%") == 0.125
    assert parse_scale("1") == 1.0
    for bad in ("0", "2", "1/0", "-0.5", "lots", "nan"):
        with pytest.raises(ConfigError, match="--scale"):
            parse_scale(bad)


def test_scaled_trace_keeps_events_and_shrinks_sizes():
    t = load(SHIPPED)
    s = scale_trace(t, 1 / 8)
    for name in ("alloc_at", "free_at", "free_rank", "launch_name", "launch_exec_id", "launch_phase", "launch_iter",
                 "acc_ptr", "acc_alloc", "acc_mode"):
        assert np.array_equal(getattr(s, name), getattr(t, name)), name
    assert np.allclose(s.launch_dur, t.launch_dur / 8) and np.allclose(s.launch_flops, t.launch_flops / 8)
    big = t.alloc_size >= 4096
    assert np.allclose(s.alloc_size[big], t.alloc_size[big] / 8, rtol=1e-3)
    assert (s.alloc_size >= 1).all() and (s.acc_len >= 1).all()
    assert (s.acc_off + s.acc_len <= s.alloc_size[s.acc_alloc]).all()
    assert s.meta["scale"] == 0.125 and scale_trace(s, 0.5).meta["scale"] == 0.0625
    assert scale_trace(t, 1).equals(t)


def test_overlapping_accesses_still_overlap():
    b = TraceBuilder()
    a = b.alloc(1000)
    b.launch("k", [(a, 0, 100, READ), (a, 99, 1, WRITE), (a, 100, 900, WRITE)], duration=1e-3)
    s = scale_trace(b.build(), 0.01)
    lo, ln = s.acc_off, s.acc_len
    assert lo[0] < lo[1] + ln[1] and lo[1] < lo[0] + ln[0]  # [0, 100) and [99, 100) overlapped: still do
    assert lo[2] + ln[2] == 10 and s.alloc_size[0] == 10


def test_bad_scale_raises():
    t = load(SHIPPED)
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="scale"):
            scale_trace(t, bad)
