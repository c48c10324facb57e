"""GIVEN a real GPU WHEN a tiny GPT-2 training step is recorded on CUDA THEN the trace is the meta trace event
for event (the recorder's kernel routing matches what PyTorch picks on CUDA), with measured durations.
Skipped without a GPU (tests/gpu/conftest.py)."""

import numpy as np

from uvmprefetch.trace.models import record_model


def differ(trace, a, b) -> str:
    """Where two event arrays first differ, with the launch that made the allocation (on the H100 the
    alloc_size arrays differed and the bare assertion did not say where)."""
    if a.shape != b.shape:
        return f"lengths {a.shape} (cuda) vs {b.shape} (meta)"
    i = int(np.flatnonzero(a != b)[0])
    n = int((a != b).sum())
    at = ""
    if hasattr(trace, "alloc_at") and i < len(trace.alloc_at):
        j = int(trace.alloc_at[i])
        if 0 <= j < len(trace.launch_name):
            at = f", allocated at launch {j} ({trace.names[trace.launch_name[j]]})"
    return f"{n} differ, first at {i}: cuda {a[i]} vs meta {b[i]}{at}"


def test_cuda_trace_matches_meta_with_measured_durations():
    kw = dict(batch=2, seq=64, iters=2)
    cuda = record_model("gpt2", "tiny", device="cuda", **kw)
    meta = record_model("gpt2", "tiny", device="meta", **kw)
    assert [cuda.names[i] for i in cuda.launch_name] == [meta.names[i] for i in meta.launch_name]
    for name in ("alloc_size", "alloc_at", "free_at", "alloc_kind", "launch_exec_id", "launch_phase",
                 "launch_iter", "acc_alloc", "acc_off", "acc_len", "acc_mode"):
        a, b = getattr(cuda, name), getattr(meta, name)
        assert np.array_equal(a, b), f"{name}: {differ(cuda, a, b)}"
    assert cuda.meta["durations"].startswith("measured")
    assert (cuda.launch_dur > 0).all() and np.isfinite(cuda.launch_dur).all()
