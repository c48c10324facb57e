"""GIVEN one shared first-fit address space WHEN the runtime, the replay and trace stats place a trace THEN
they hand out the same addresses, and no two live allocations overlap (allocations freed where born too)."""

import random

import numpy as np

from uvmprefetch.runtime.observe import VirtualLayout
from uvmprefetch.sim.layout import build_layout
from uvmprefetch.trace import READ, TraceBuilder
from uvmprefetch.trace.addrspace import FirstFit, alloc_events, first_fit_addresses
from uvmprefetch.trace.stats import first_fit_layout


def _trace(seed: int):
    rng = random.Random(seed)
    b, live = TraceBuilder({}), []
    for _ in range(50):
        live += [b.alloc(rng.choice([1, 512, 4096, 1 << 20, rng.randrange(1, 5 << 20)]))
                 for _ in range(rng.randrange(0, 4))]
        if rng.random() < 0.4:  # a temporary freed at the point it was made
            b.free(b.alloc(rng.randrange(1, 1 << 20)))
        if live:
            b.launch("k", [(live[-1], 0, 1, READ)], duration=1e-6, flops=1)
        rng.shuffle(live)
        for _ in range(rng.randrange(0, 3)):
            if live:
                b.free(live.pop())
    return b.build()


def test_runtime_replay_and_stats_agree_and_never_overlap_live_allocations():
    for seed in range(20):
        t = _trace(seed)
        base, rsize, peak, events = first_fit_addresses(t)
        assert VirtualLayout is FirstFit
        lay = build_layout(t, allocator="first-fit")
        assert np.array_equal(lay.base, base) and lay.reserved_bytes == peak
        assert np.array_equal(first_fit_layout(t), base)  # no zero-byte allocations here: min_size is moot
        live = {}
        for _, kind, a in events:
            if kind > 0:
                lo, hi = int(base[a]), int(base[a] + rsize[a])
                assert all(hi <= s or lo >= e for s, e in live.values()), f"seed {seed}: {a} overlaps"
                live[a] = (lo, hi)
            else:
                del live[a]


def test_event_order_frees_older_first_then_allocates_then_frees_the_born():
    b = TraceBuilder({})
    x = b.alloc(4096)
    b.launch("k", [(x, 0, 1, READ)], duration=1e-6, flops=1)
    b.free(x)
    y = b.alloc(4096)
    b.free(y)
    z = b.alloc(100)
    b.launch("k", [(z, 0, 1, READ)], duration=1e-6, flops=1)
    t = b.build()
    assert alloc_events(t) == [(0, 1, x), (1, -1, x), (1, 1, y), (1, 1, z), (1, -1, y)]
    assert first_fit_addresses(t)[0].tolist() == [0, 0, 4096]


def test_rounding_and_min_size():
    assert FirstFit().round(0) == 512 and FirstFit().round(513) == 1024
    ff = FirstFit(min_size=0)
    assert ff.round(0) == 0 and ff.alloc(0) == 0 and ff.top == 0
    a, b = ff.alloc(1), ff.alloc(600)
    assert (a, b, ff.top) == (0, 512, 1536)
    ff.free(a, 1)
    assert ff.alloc(512) == 0
    ff.free(b, 600)
    assert ff.top == 512 and ff.peak_top == 1536
