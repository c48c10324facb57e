"""GIVEN the planner's per-launch shortcuts (the dryrun backend's block ids of a launch in integer arithmetic, the
roofline bound to one profile) WHEN they run on random launches THEN they give what the obvious code gives: the
union of ``block_ids`` per span with NumPy, and ``estimate``'s formula, bit for bit."""

import random

import numpy as np
import pytest

from uvmprefetch.config import RuntimeConfig
from uvmprefetch.gpus import PROFILES
from uvmprefetch.policy import make_policy
from uvmprefetch.runtime.dryrun import _SPAN_SET_MAX, DryrunBackend
from uvmprefetch.trace.format import READ, WRITE
from uvmprefetch.trace.roofline import FLOP_DTYPES, estimate, estimator


def _reference_blocks(be, spans):
    rs = [(be.block_ids(st, ln), m) for st, ln, m in spans]
    w = [r for r, m in rs if m & WRITE]
    b = np.unique(np.concatenate([r for r, _ in rs])) if rs else np.zeros(0, dtype=np.int64)
    return b, (np.unique(np.concatenate(w)) if w else np.zeros(0, dtype=np.int64))


@pytest.fixture(scope="module")
def backend():
    return DryrunBackend(RuntimeConfig(enabled=True, backend="dryrun", policy="demand"), make_policy("demand"))


def test_launch_blocks_is_the_union_of_block_ids(backend):
    rng = random.Random(3)
    bs = backend.block_size
    big = (_SPAN_SET_MAX + 3) * bs
    for _ in range(3000):
        spans = []
        for _ in range(rng.randrange(0, 7)):
            st = rng.choice([0, bs - 512, bs, 5 * bs + 4096, rng.randrange(0, 64 * bs)])
            lengths = [0, 1, 512, bs - 1, bs, bs + 1, 3 * bs, rng.randrange(0, 4 * bs)]
            ln = big if rng.random() < .05 else rng.choice(lengths)
            spans.append((st, ln, rng.choice([READ, WRITE, READ | WRITE])))
        b, w = backend.launch_blocks(spans)
        rb, rw = _reference_blocks(backend, spans)
        assert b.dtype == np.int64 and w.dtype == np.int64, spans
        assert b.tolist() == rb.tolist() and w.tolist() == rw.tolist(), spans


def test_launch_blocks_big_span_takes_the_numpy_route_with_the_same_answer(backend):
    bs = backend.block_size
    spans = [(bs, (_SPAN_SET_MAX + 10) * bs, READ), (3 * bs, 1, WRITE), (0, 0, READ)]
    b, w = backend.launch_blocks(spans)
    assert b.tolist() == list(range(0, _SPAN_SET_MAX + 11)) and w.tolist() == [3]


def test_estimator_is_estimate_bit_for_bit():
    rng = random.Random(5)
    for name, prof in PROFILES.items():
        est = estimator(prof)
        assert estimator(name)(1e9, 1e6, "bf16") == est(1e9, 1e6, "bf16")
        for _ in range(200):
            flops = rng.choice([0.0, 1.0, rng.uniform(0, 1e13)])
            nbytes = rng.choice([0, 512, rng.randrange(0, 1 << 34)])
            for dtype in FLOP_DTYPES + ("fp64",):  # an unknown dtype falls back to the fp32 peak in both
                ref = max(flops / (prof.peak_flops(dtype) * prof.matmul_efficiency),
                          nbytes / (prof.hbm_bw * prof.memory_efficiency)) + prof.launch_overhead_s
                assert est(flops, nbytes, dtype) == ref == estimate(flops, nbytes, dtype, prof)


def test_simulator_block_checks_small_and_large_arrays_alike():
    """The simulator's range check (a list's min/max for a launch's few blocks, NumPy's for more) refuses the same
    ids with the same message."""
    from uvmprefetch.sim.engine import SimError
    be = DryrunBackend(RuntimeConfig(enabled=True, backend="dryrun", policy="demand", budget=None),
                       make_policy("demand"))
    m, top = be.model, be.model.max_blocks
    for n in (1, 5, 32, 33, 200):
        ok = np.arange(top - n, top, dtype=np.int64)
        assert m._ids(ok, "x") is not None and m._ids(ok[::-1].copy(), "x").tolist() == ok[::-1].tolist()
        for bad in (np.append(ok[1:], top), np.append(ok[1:], -1)):
            lo, hi = int(min(bad.tolist())), int(max(bad.tolist()))
            with pytest.raises(SimError, match=rf"x: block id out of range 0\.\.{top - 1} \(got {lo}\.\.{hi}\)"):
                m._ids(bad, "x")
    assert m._ids(np.zeros(0, dtype=np.int64), "x").size == 0 and m._ids(np.int64(3), "x").shape == ()


def test_the_event_search_counts_as_searchsorted_from_any_start():
    """``_upto`` (a galloping search over the pending allocator events) gives ``np.searchsorted``'s count for every
    start at or below it: short and long backlogs, repeated seqs, targets before, inside and after them."""
    from uvmprefetch.runtime import native_observer as no
    from uvmprefetch.runtime.planner import _upto
    rng = np.random.default_rng(5)
    for n in (0, 1, 3, 255, 256, 257, 5000):
        ev = np.zeros(n, dtype=no.ALLOC_DTYPE)
        ev["seq"] = np.sort(rng.integers(0, 3 * n + 2, n))
        for seq in rng.integers(-1, 3 * n + 4, 40).tolist() + [0, 3 * n + 2]:
            seq = max(seq, 0)
            want = int(np.searchsorted(ev["seq"], seq))
            for lo in {0, want // 2, want}:
                assert _upto(ev, lo, seq) == want, (n, seq, lo)
