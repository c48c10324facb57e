"""GIVEN a real GPU WHEN a tiny GPT-2 training step is recorded on CUDA THEN the trace is the meta trace event
for event (the recorder's kernel routing matches what PyTorch picks on CUDA), with measured durations.
Skipped without a GPU (tests/gpu/conftest.py)."""

import numpy as np

from uvmprefetch.trace.models import record_model


def test_cuda_trace_matches_meta_with_measured_durations():
    kw = dict(batch=2, seq=64, iters=2)
    cuda = record_model("gpt2", "tiny", device="cuda", **kw)
    meta = record_model("gpt2", "tiny", device="meta", **kw)
    assert [cuda.names[i] for i in cuda.launch_name] == [meta.names[i] for i in meta.launch_name]
    for name in ("alloc_size", "alloc_at", "free_at", "alloc_kind", "launch_exec_id", "launch_phase",
                 "launch_iter", "acc_alloc", "acc_off", "acc_len", "acc_mode"):
        assert np.array_equal(getattr(cuda, name), getattr(meta, name)), name
    assert cuda.meta["durations"].startswith("measured")
    assert (cuda.launch_dur > 0).all() and np.isfinite(cuda.launch_dur).all()
