"""Property tests (Hypothesis) of the simulator's invariants on random traces.

GIVEN a random trace (small and large tensors, random lifetimes, random read/write accesses)
WHEN it is replayed under a policy at a random capacity
THEN capacity is never exceeded, only resident blocks are evicted (both asserted inside the engine with
``check=True``), bytes moved H2D (plus bytes read remotely) cover every first-touched byte, ``ideal`` time
is the sum of durations, ``oracle`` is never slower than ``demand``, and at oversub 1.0 every policy is
within the cold first-touch cost of ``ideal``.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uvmprefetch.gpus import get_profile
from uvmprefetch.policy.base import Advice, Decision, Policy
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace import READ, WRITE, TraceBuilder

GPU = get_profile("h100-pcie-lit")
KiB, MiB = 1 << 10, 1 << 20
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def traces(draw):
    b = TraceBuilder()
    live: list[int] = []
    sizes = st.sampled_from([4 * KiB, 300 * KiB, 900 * KiB, 2 * MiB, 3 * MiB + 5, 6 * MiB])
    n_launches = draw(st.integers(1, 40))
    for i in range(n_launches):
        b.iteration = i * 3 // n_launches
        for _ in range(draw(st.integers(0, 2))):
            live.append(b.alloc(draw(sizes)))
        if not live:
            live.append(b.alloc(draw(sizes)))
        k = draw(st.integers(1, min(4, len(live))))
        picked = draw(st.lists(st.sampled_from(live), min_size=k, max_size=k, unique=True))
        acc = []
        for a in picked:
            size = b.alloc_size[a]
            off = draw(st.integers(0, size - 1))
            ln = draw(st.integers(1, size - off))
            acc.append((a, off, ln, draw(st.sampled_from([READ, WRITE, READ | WRITE]))))
        b.launch(f"k{i % 5}", acc, duration=draw(st.sampled_from([2e-6, 5e-5, 1e-3])))
        if len(live) > 1 and draw(st.booleans()):
            victim = draw(st.sampled_from(live))
            live.remove(victim)
            b.free(victim)
    return b.build()


class Chaos(Policy):
    """Random but contract-abiding decisions: stresses the engine's bookkeeping."""
    name = "chaos"

    def __init__(self, seed=0):
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def on_launch(self, info, state):
        n = self.ctx.max_blocks
        r = self.rng
        adv = ()
        if r.random() < 0.2:
            adv = ((r.integers(0, n, 2), Advice(int(r.integers(0, 3)))),)
        return Decision(prefetch=r.integers(0, n, r.integers(0, 6)), evict=r.integers(0, n, r.integers(0, 3)),
                        discard=r.integers(0, n, r.integers(0, 2)), advise=adv)


def widest(t, bs=2 * MiB):
    from uvmprefetch.sim.layout import build_layout
    lay = build_layout(t, bs)
    return lay, int(np.diff(lay.ptr).max())


@SETTINGS
@given(t=traces(), extra=st.integers(0, 6), seed=st.integers(0, 1000), wb=st.booleans(),
       bs=st.sampled_from([2 * MiB, 64 * KiB]))
def test_invariants_under_every_policy(t, extra, seed, wb, bs):
    lay, w = widest(t, bs)
    cap = (w + extra * (2 * MiB // bs)) * lay.block_size
    for pol in ("demand", "oracle", Chaos(seed)):
        r = replay(t, pol, GPU, capacity_bytes=cap, layout=lay, check=True, writeback_clean=wb)
        assert r["peak_used_blocks"] <= r["capacity_bytes"] // lay.block_size
        assert r["bytes_htod"] + r["remote_bytes"] >= r["cold_first_touch_bytes"]
        assert r["time_s"] >= r["ideal_s"] - 1e-12
        assert r["prefetch_useful_bytes"] <= r["prefetch_issued_bytes"]


@SETTINGS
@given(t=traces())
def test_ideal_is_the_sum_of_durations(t):
    r = replay(t, "ideal", GPU, oversub=3.0)
    assert r["time_s"] == pytest.approx(float(np.sum(t.launch_dur)), rel=1e-12)
    assert r["faults"] == 0 and r["bytes_htod"] == 0 and r["stall_s"] == 0


@SETTINGS
@given(t=traces(), extra=st.integers(0, 6))
def test_oracle_never_slower_than_demand(t, extra):
    lay, w = widest(t)
    cap = (w + extra) * lay.block_size
    d = replay(t, "demand", GPU, capacity_bytes=cap, layout=lay)
    o = replay(t, "oracle", GPU, capacity_bytes=cap, layout=lay)
    assert o["time_s"] <= d["time_s"] * (1 + 1e-9)


@SETTINGS
@given(t=traces())
def test_oversub_one_equals_ideal_within_cold_cost(t):
    from uvmprefetch.sim.layout import build_layout
    lay = build_layout(t)
    for pol in ("demand", "oracle"):
        r = replay(t, pol, GPU, oversub=1.0, layout=lay)
        assert r["evictions"] == 0
        assert r["time_s"] <= r["ideal_s"] + r["cold_first_touch_s"] + 1e-12


def reference_demand(t, lay, cap_blocks, gpu=GPU):
    """Slow, obvious re-implementation of the driver model for ``demand`` at 2 MiB blocks (no prefetch, no
    invalidation): Python sets and lists, one block at a time. Returns (time, faults, bytes H2D, D2H)."""
    import math
    bs = lay.block_size
    tf = gpu.transfer_time(64 * 1024) * (bs / (64 * 1024))
    td = gpu.transfer_time(bs, "dtoh")
    lat = gpu.fault_batch_latency_s
    entries_per_block = math.ceil(0.51 * bs / (64 * 1024))
    resident: dict[int, int] = {}  # block -> migration sequence number
    dirty: set[int] = set()
    wb_done: dict[int, float] = {}  # a block cannot come back before its write-back ends
    seq = 0
    t_c = t_d2h = 0.0
    faults = htod = dtoh = 0
    for i in range(t.n_launches):
        now = t_c
        blocks = lay.launch_blocks(i).tolist()
        missing = [b for b in blocks if b not in resident]
        done = now
        if missing:
            n = len(missing)
            rooms = [now] * min(cap_blocks - len(resident), n)
            while len(rooms) < n:
                victim = min((b for b in resident if b not in blocks), key=resident.get)
                del resident[victim]
                if victim in dirty:
                    dirty.discard(victim)
                    t_d2h = max(t_d2h, now) + td
                    wb_done[victim] = t_d2h
                    rooms.append(t_d2h)
                    dtoh += bs
                else:
                    rooms.append(now)
            e = now + math.ceil(n * entries_per_block / gpu.fault_batch_size) * lat
            for b, r in zip(missing, sorted(rooms)):
                e = max(e, r, wb_done.get(b, 0.0)) + tf
            done = e
            for b in missing:
                seq += 1
                resident[b] = seq
            faults += n
            htod += n * bs
        dirty.update(lay.launch_writes(i).tolist())
        t_c = max(now, done) + float(t.launch_dur[i])
    return t_c, faults, htod, dtoh


@SETTINGS
@given(t=traces(), extra=st.integers(0, 6))
def test_demand_matches_slow_reference(t, extra):
    """Differential: the vectorised engine (lazy LRM queue, FIFO formula, counters) against the reference."""
    lay, w = widest(t)
    cap = w + extra
    r = replay(t, "demand", GPU, capacity_bytes=cap * lay.block_size, layout=lay)
    time_s, faults, htod, dtoh = reference_demand(t, lay, cap)
    assert r["time_s"] == pytest.approx(time_s, rel=1e-12, abs=1e-15)
    assert (r["faults"], r["bytes_htod"], r["bytes_dtoh"]) == (faults, htod, dtoh)
