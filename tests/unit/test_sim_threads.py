"""The runtime's threads in the simulator's host clock (``HostModel.planner``, ``planner_lag``, ``mover``; the ``live``
preset): golden cases derived by hand, as in test_sim_golden.py.

Notation (``h100-pcie-lit``, 2 MiB blocks): ``d`` = 1 ms per launch, ``T`` = one 2 MiB block prefetched H2D,
``Td`` the same D2H, ``F`` = one cold block faulted in (one batch of 17 entries: ``lat`` + 32 * 64 KiB / bw(64 KiB)).
Tensor A is block 0, B block 1. Launches 0-2 touch A, launch 3 reads B; a policy prefetches B at launch 1.
"""

import numpy as np
import pytest
from test_sim_golden import GPU, LAT, TF, D, MiB, T, steps_trace

from uvmprefetch.policy.base import Decision, Policy
from uvmprefetch.sim.host import HOST_PRESETS, HostModel, host_name, parse_host
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace import READ, WRITE, TraceBuilder

F = LAT + TF  # one cold block faulted in: one batch, 32 granules of 64 KiB


class PrefetchAt(Policy):
    """Prefetches block ``block`` at launch ``at``; nothing else."""
    name = "prefetch-at"

    def __init__(self, at=1, block=1, evict=()):
        super().__init__()
        self.at, self.block, self.evict = at, block, np.asarray(evict, dtype=np.int64)

    def on_launch(self, info, state):
        if info.index == self.at:
            return Decision(prefetch=np.array([self.block], dtype=np.int64), evict=self.evict)
        return None


two_tensors = steps_trace  # tensors A and B of one block each


def a_then_b():
    return two_tensors("Aaab")


def run(host, policy=None, cap=4):
    return replay(a_then_b(), policy or PrefetchAt(), GPU, capacity_bytes=cap * 2 * MiB, check=True, host=host)


def test_the_free_host_prefetches_in_time():
    """Launch 0 faults A (F), launches 1-2 find it resident. The prefetch of B, issued at launch 1's start (F + d),
    lands T later, before launch 3 starts at F + 3d: time F + 4d, B never faults."""
    r = run(None)
    assert r["time_s"] == pytest.approx(F + 4 * D, rel=1e-12)
    assert r["faults"] == 1 and r["late_blocks"] == 0


def test_a_planner_without_lag_or_cost_is_the_free_host():
    """planner=true with no lag and no costs: each decision is ready when its launch is issued, so it is applied
    at the same point as without a host model: the same time to the last digit."""
    r = run(HostModel(planner=True, mover=True))
    assert r["time_s"] == run(None)["time_s"] and r["host_stall_s"] == 0.0


def test_a_lag_of_four_launches_is_late_one_is_in_time():
    """launch_s = d/2 (no sync at iteration ends): the training thread issues launch i at (i + 1) d/2. Launch 0 waits
    for it (d/2), faults A: L0 runs d/2 + F .. 3d/2 + F; then the GPU trails the host. The planner takes launch 1 up
    once k more launches were issued: at d + k d/2.

    - k = 1: ready at 3d/2 <= launch 1's start (3d/2 + F): B is prefetched there and lands before launch 3.
      Time d/2 + F + 4d.
    - k = 4: ready at 3d: launch 2 starts at 5d/2 + F < 3d (F < d/2), launch 3 at 7d/2 + F: the prefetch is
      applied there and B is in flight: a late wait of T. Time d/2 + F + 4d + T."""
    assert F < D / 2 and T < D
    one = run(HostModel(launch_s=D / 2, planner=True, planner_lag=1))
    assert one["time_s"] == pytest.approx(D / 2 + F + 4 * D, rel=1e-12) and one["late_blocks"] == 0
    four = run(HostModel(launch_s=D / 2, planner=True, planner_lag=4))
    assert four["time_s"] == pytest.approx(D / 2 + F + 4 * D + T, rel=1e-12)
    assert four["late_blocks"] == 1 and four["faults"] == 1 and four["late_stall_s"] == pytest.approx(T, rel=1e-9)
    # without launch costs the lag costs nothing: the host is ahead of the GPU
    assert run(HostModel(planner=True, planner_lag=4))["time_s"] == run(None)["time_s"]


def test_a_slow_planner_decides_too_late_and_b_faults():
    """decision_s = 2.5d on the planner: launch 0's decision is done at 2.5d, launch 1's at 5d. The GPU reaches
    launch 3 at F + 3d < 5d, so the prefetch is still pending: B faults (F). Time 2F + 4d; the training thread
    (launch_s = 0) never waits, so the GPU never idles for the host (host_stall_s = 0)."""
    r = run(HostModel(planner=True, decision_s=2.5 * D))
    assert F + 3 * D < 5 * D
    assert r["time_s"] == pytest.approx(2 * F + 4 * D, rel=1e-12)
    assert r["faults"] == 2 and r["host_stall_s"] == 0.0
    assert r["host_decision_s"] == pytest.approx(4 * 2.5 * D)
    assert r["planner_pending_max"] == 1
    # on the training thread (planner=false) the same cost makes the GPU wait for every launch instead
    sync = run(HostModel(decision_s=2.5 * D))
    assert sync["host_stall_s"] > 0 and sync["time_s"] > r["time_s"]


def b_then_a_again():
    """A written by launch 0; launches 1-2 read B; launch 3 reads A; launch 4 reads B."""
    return two_tensors("Abbab")


class EvictA(Policy):
    """At launch 1 evicts A (dirty, not used by launch 1) and at launch 2 prefetches A back."""
    name = "evict-a"

    def on_launch(self, info, state):
        if info.index == 1:
            return Decision(evict=np.array([0], dtype=np.int64))
        if info.index == 2:
            return Decision(prefetch=np.array([0], dtype=np.int64))
        return None


def test_a_uvm_eviction_holds_the_training_thread_or_the_mover():
    """Capacity 2 blocks. Launch 0 faults A (F); launch 1 faults B (F); the policy's decision at launch 1 evicts A
    (dirty: one write-back Td = T on the literature profile) and is applied at launch 1's start (F + d).

    - On the training thread (blocking_evict, no planner): the thread waits for the write-back: launch 1 is issued
      at F + d + T, then faults B: ends 2F + 2d + T. Launch 2's decision prefetches A at 2F + 2d + T; A lands T
      later, before launch 3 at 2F + 3d + T. Time 2F + 5d + T; host_blocked_s = T.
    - On the mover: launch 1 starts at once (F + d), faults B, ends 2F + 2d. The mover is held until F + d + T.
      Launch 2's decision is due at launch 2 (2F + 2d > F + d + T): A's prefetch waits for A's write-back to end
      (F + d + T) and leaves at 2F + 2d, lands at 2F + 2d + T < launch 3's start. Time 2F + 5d; no host wait,
      mover_busy_s = T."""
    t = b_then_a_again()
    sync = replay(t, EvictA(), GPU, capacity_bytes=2 * 2 * MiB, check=True, host=HostModel(blocking_evict=True))
    assert sync["time_s"] == pytest.approx(2 * F + 5 * D + T, rel=1e-12)
    assert sync["host_blocked_s"] == pytest.approx(T, rel=1e-9)
    mv = replay(t, EvictA(), GPU, capacity_bytes=2 * 2 * MiB, check=True,
                host=HostModel(planner=True, mover=True, blocking_evict=True))
    assert mv["time_s"] == pytest.approx(2 * F + 5 * D, rel=1e-12)
    assert mv["host_blocked_s"] == 0.0 and mv["mover_busy_s"] == pytest.approx(T, rel=1e-9)
    assert mv["writebacks"] == 1 and mv["bytes_dtoh"] == 2 * MiB


def test_a_held_mover_delays_the_next_decision():
    """As above, with a write-back 3d long (``link_dtoh_bw`` lowered so that Td = 3d) and F < d:

    - L1: the eviction of A is applied at F + d; its write-back holds A's room and the mover until F + 4d. B faults
      into the free block: L1 ends 2F + 2d.
    - L2: the prefetch of A is due, but the mover is held (2F + 2d < F + 4d): pending. L2 ends 2F + 3d.
    - L3 needs A: still pending (2F + 3d < F + 4d), so A faults. A cannot come back before its write-back ends,
      which is also when its room comes free (B stays): the fault batch (lat) is serviced meanwhile, A's data moves
      from F + 4d on and takes F - lat: L3 runs 2F + 4d - lat .. 2F + 5d - lat.
    - L4: the prefetch is applied (the mover is free) but A is resident: skipped. B is resident: ends 2F + 6d - lat.

    Time 2F + 6d - lat, three faults (A, B cold; A back), nothing prefetched, the training thread never held."""
    g1 = GPU.with_overrides(link_dtoh_bw=1.0)
    g = GPU.with_overrides(link_dtoh_bw=g1.transfer_time(2 * MiB, "dtoh") / (3 * D))
    assert g.transfer_time(2 * MiB, "dtoh") == pytest.approx(3 * D, rel=1e-9)
    assert F < D
    mv = replay(b_then_a_again(), EvictA(), g, capacity_bytes=2 * 2 * MiB, check=True,
                host=HostModel(planner=True, mover=True, blocking_evict=True))
    assert mv["faults"] == 3 and mv["prefetch_issued_bytes"] == 0
    assert mv["time_s"] == pytest.approx(2 * F + 6 * D - LAT, rel=1e-9)
    assert mv["host_blocked_s"] == 0.0 and mv["mover_busy_s"] == pytest.approx(3 * D, rel=1e-9)


def test_discards_of_dead_blocks_cost_the_mover_and_move_nothing():
    """A is written by launch 0 and freed; the policy discards it at launch 1 (dead: dropped, no bytes), with
    discard_call_s = 2d and discard_block_s = d: 3d for one call of one block.

    - On the training thread (no planner; its clock runs from 0, launch_s = 0): launch 1 is issued at 3d, after
      launch 0's end F + d (F < 2d); it faults B: ends 3d + F + d; launch 2 ends F + 5d.
    - On the mover: launch 1 starts at F + d, faults B: ends 2F + 2d; launch 2 ends 2F + 3d; the mover was held 3d."""
    b = TraceBuilder()
    a, bb = b.alloc(2 * MiB, "activation"), b.alloc(2 * MiB, "activation")
    b.launch("w", [(a, 0, 2 * MiB, WRITE)], duration=D)
    b.free(a)
    b.launch("rb", [(bb, 0, 2 * MiB, READ)], duration=D)
    b.launch("rb2", [(bb, 0, 2 * MiB, READ)], duration=D)
    t = b.build()

    class DiscardA(Policy):
        name = "discard-a"

        def on_launch(self, info, state):
            return Decision(discard=np.array([0], dtype=np.int64)) if info.index == 1 else None

    kw = dict(discard_call_s=2 * D, discard_block_s=D)
    assert F < 2 * D
    sync = replay(t, DiscardA(), GPU, capacity_bytes=4 * 2 * MiB, check=True, host=HostModel(**kw))
    assert sync["time_s"] == pytest.approx(F + 5 * D, rel=1e-12)
    mv = replay(t, DiscardA(), GPU, capacity_bytes=4 * 2 * MiB, check=True,
                host=HostModel(planner=True, mover=True, **kw))
    assert mv["time_s"] == pytest.approx(2 * F + 3 * D, rel=1e-12) and mv["mover_busy_s"] == pytest.approx(3 * D)
    for r in (sync, mv):
        assert r["discards"] == 1 and r["bytes_dtoh"] == 0 and r["writebacks"] == 0


def test_presets_and_parsing():
    live = HOST_PRESETS["live"]
    assert live.planner and live.mover and live.blocking_evict and live.planner_lag == 4
    assert not live.measure_decision  # a modelled cost: runs repeat
    assert parse_host("free") is None and host_name(None) == "free"
    assert host_name(parse_host("live")) == "live" and host_name(parse_host("live-sync")) == "live-sync"
    assert host_name(parse_host("live:planner_lag=8")) == "custom"
    assert parse_host("live:planner_lag=8").planner_lag == 8  # (its bad values: test_sim_host.py)


def test_prefetch_calls_hold_their_thread():
    """prefetch_block_s = 2d: launch 1's decision prefetches one block (B).

    - On the training thread (its clock runs from 0, launch_s = 0, so it is ahead of the GPU): the call returns at
      2d, after launch 1's start F + d: the GPU idles d - F (host_stall_s) and runs launches 1-3 from 2d on; B landed
      at F + d + T. Time 5d.
    - On the mover: nothing waits; the mover is busy 2d. Time F + 4d."""
    sync = run(HostModel(prefetch_block_s=2 * D))
    assert sync["time_s"] == pytest.approx(5 * D, rel=1e-12)
    assert sync["host_stall_s"] == pytest.approx(D - F, rel=1e-9)
    mv = run(HostModel(planner=True, mover=True, prefetch_block_s=2 * D))
    assert mv["time_s"] == pytest.approx(F + 4 * D, rel=1e-12) and mv["mover_busy_s"] == pytest.approx(2 * D)


def test_the_live_defaults_compose_with_the_copy_path():
    """GIVEN the shipped trace WHEN replayed with the ``live`` host and ``--evict copy`` on the calibrated profile,
    with the engine's invariants checked after every launch THEN the copy path's calls are charged to the mover (at
    least 5 us per copy or repopulate call and per discard call) and the training thread is never held."""
    from pathlib import Path

    from uvmprefetch.trace.format import load
    path = sorted((Path(__file__).resolve().parents[2] / "traces").glob("gpt2*.uvmt"))[0]
    r = replay(load(path), "uvmprefetch", "h100-pcie", oversub=1.5, host="live", evict="copy", check=True)
    assert r["copy_path"] and r["copy_evictions"] > 0
    calls = r["copy_calls"] + r["repopulate_calls"] + r["discard_calls"]
    assert r["mover_busy_s"] >= 5e-6 * calls * (1 - 1e-9) and r["host_blocked_s"] == 0.0


def test_a_measured_decision_leaves_out_numba_compilation():
    """GIVEN a policy whose first decision compiles a Numba function (tens of ms or more) WHEN its decisions are
    measured (``measure_decision``, as ``live-sync``) THEN the decision time charged excludes the compilation: the
    time the call took, less what Numba reported compiling, is what the host pays."""
    import time

    import numba

    class Compiles(Policy):
        name = "compiles"

        def on_launch(self, info, state):
            if info.index == 0:
                t0 = time.perf_counter()

                @numba.njit(cache=False)
                def f(x):
                    return x * 2 + 1

                f(np.arange(3))
                self.took = time.perf_counter() - t0
            return None

    pol = Compiles()
    r = replay(a_then_b(), pol, GPU, capacity_bytes=8 * MiB, host=HostModel(measure_decision=True))
    assert pol.took > 0.02  # the compilation happened inside the measured call
    assert r["host_decision_s"] < 0.25 * pol.took
