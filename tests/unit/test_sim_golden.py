"""Golden tests: micro-traces whose exact time, faults and bytes are derived by hand below.

Notation (h100-pcie-lit profile, 2 MiB blocks): ``d`` the launch duration, ``lat`` = 45 us per fault batch,
``a`` = 52e9 B/s, and the UVMSmart size curve bw(n) = a * 2/pi * atan(0.0729 * n / 1024). Then

- ``T``  = 2 MiB / bw(2 MiB): one block prefetched (one 2 MiB copy) H2D; ``Td`` the same D2H;
- ``Tf`` = 32 * 64 KiB / bw(64 KiB): one faulted block (faulted data moves in 64 KiB pieces);
- one faulted 2 MiB block is ceil(0.51 * 32) = 17 fault entries, so up to 15 blocks fit one 256-entry batch.

The expected values are computed from these formulas here, independently of the engine's code paths.
"""

import dataclasses
import math

import numpy as np
import pytest

from uvmprefetch.gpus import get_profile
from uvmprefetch.policy.base import Advice, Decision, Policy
from uvmprefetch.sim.engine import GpuModel
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace import READ, WRITE, TraceBuilder

MiB = 1 << 20
GPU = get_profile("h100-pcie-lit")
A = 52e9
LAT = 45e-6
D = 1e-3


def bw(n):
    return A * 2 / math.pi * math.atan(0.0729 * n / 1024)


T = 2 * MiB / bw(2 * MiB)
TD = T  # h100-pcie-lit: same bandwidth both ways
TF = 32 * (64 * 1024) / bw(64 * 1024)


class Quiet(Policy):
    """No decisions, but (unlike ``demand``) learns of frees: freed blocks become dead."""
    name = "quiet"


def steps_trace(steps, tensors="ab"):
    """One 2 MiB tensor (one block) per letter of ``tensors``, in order (blocks 0, 1, ...). ``steps``: a launch per
    letter, each ``D`` long: an upper-case letter writes its tensor, a lower-case one reads it; ``-x`` frees tensor
    ``x`` before the next launch."""
    b = TraceBuilder()
    ts = {c: b.alloc(2 * MiB, "activation") for c in tensors}
    free = False
    for i, c in enumerate(steps):
        if c == "-":
            free = True
        elif free:
            b.free(ts[c])
            free = False
        else:
            b.launch(f"{c}{i}", [(ts[c.lower()], 0, 2 * MiB, WRITE if c.isupper() else READ)], duration=D)
    return b.build()


def three_blocks(first_mode, free_a=False):
    """A, B, C: 2 MiB each (one block each, blocks 0, 1, 2). L0 touches A (first_mode), L1 reads B,
    L2 reads C. With ``free_a`` A is freed before L2."""
    return steps_trace(("A" if first_mode == WRITE else "a") + "b" + ("-a" if free_a else "") + "c", "abc")


def test_single_fault_cold_start():
    """One 4 MiB tensor = 2 blocks, written by one launch, capacity 4 blocks, demand paging.

    2 blocks fault: 34 entries = 1 batch. time = lat + 2 Tf + d. H2D = 4 MiB, no D2H. The cold
    first-touch cost is exactly that stall: lat + 2 Tf.
    """
    b = TraceBuilder()
    x = b.alloc(4 * MiB, "activation")
    b.launch("k", [(x, 0, 4 * MiB, WRITE)], duration=D)
    r = replay(b.build(), "demand", GPU, capacity_bytes=8 * MiB, check=True)
    assert r["time_s"] == pytest.approx(LAT + 2 * TF + D, rel=1e-12)
    assert r["faults"] == 2 and r["fault_batches"] == 1 and r["fault_entries"] == 34
    assert r["bytes_htod"] == 4 * MiB and r["bytes_dtoh"] == 0
    assert r["cold_first_touch_s"] == pytest.approx(LAT + 2 * TF, rel=1e-12)
    assert r["ideal_s"] == D and r["slowdown"] == pytest.approx((LAT + 2 * TF + D) / D)


def test_dirty_block_is_written_back():
    """Capacity 2 blocks. L0 writes A, L1 reads B, L2 reads C -> C needs room; the least recently
    migrated block is A, dirty -> written back on D2H from end1 to end1 + Td; C's fault batch starts at
    end1, its copy can start at max(end1 + lat, end1 + Td).

    end0 = lat + Tf + d;  end1 = 2 (lat + Tf + d);  end2 = end1 + max(lat, Td) + Tf + d.
    Faults 3 (3 batches), H2D 6 MiB, D2H 2 MiB (one write-back), no drop.
    """
    r = replay(three_blocks(WRITE), "demand", GPU, capacity_bytes=4 * MiB, check=True)
    end1 = 2 * (LAT + TF + D)
    assert r["time_s"] == pytest.approx(end1 + max(LAT, TD) + TF + D, rel=1e-12)
    assert (r["faults"], r["fault_batches"], r["bytes_htod"], r["bytes_dtoh"]) == (3, 3, 6 * MiB, 2 * MiB)
    assert (r["evictions"], r["writebacks"], r["drops"]) == (1, 1, 0)


def test_clean_block_is_dropped():
    """Same, but L0 only reads A: A is clean, dropped for free; C's copy starts right after its batch.

    end2 = 3 (lat + Tf + d). D2H 0 bytes, one drop.
    """
    r = replay(three_blocks(READ), "demand", GPU, capacity_bytes=4 * MiB, check=True)
    assert r["time_s"] == pytest.approx(3 * (LAT + TF + D), rel=1e-12)
    assert r["bytes_dtoh"] == 0 and (r["writebacks"], r["drops"]) == (0, 1)


def test_clean_block_written_back_without_dirty_tracking():
    """``writeback_clean``: a driver without dirty tracking writes A back although it is clean: the dirty
    case's numbers."""
    r = replay(three_blocks(READ), "demand", GPU, capacity_bytes=4 * MiB, check=True, writeback_clean=True)
    assert r["time_s"] == pytest.approx(2 * (LAT + TF + D) + max(LAT, TD) + TF + D, rel=1e-12)
    assert r["bytes_dtoh"] == 2 * MiB


def test_dead_block_is_dropped_not_written_back():
    """L0 writes A, A is freed before L2. A policy that learns of frees marks A dead: evicting it is a
    drop (no D2H), end2 = 3 (lat + Tf + d). ``demand`` (the driver never learns of frees) still writes
    it back: the dirty case's numbers."""
    t = three_blocks(WRITE, free_a=True)
    r = replay(t, Quiet(), GPU, capacity_bytes=4 * MiB, check=True)
    assert r["time_s"] == pytest.approx(3 * (LAT + TF + D), rel=1e-12)
    assert r["bytes_dtoh"] == 0 and r["drops"] == 1
    r = replay(t, "demand", GPU, capacity_bytes=4 * MiB, check=True)
    assert r["bytes_dtoh"] == 2 * MiB
    assert r["time_s"] == pytest.approx(2 * (LAT + TF + D) + max(LAT, TD) + TF + D, rel=1e-12)


def test_without_discards_a_dead_block_is_written_back():
    """``discards=False`` (the live cuda backend's default): no runtime drops dead data, so the freed A of
    the case above is written back even under a policy that learns of frees: the dirty case's numbers."""
    t = three_blocks(WRITE, free_a=True)
    r = replay(t, Quiet(), GPU, capacity_bytes=4 * MiB, check=True, discards=False)
    assert r["bytes_dtoh"] == 2 * MiB and r["drops"] == 0
    assert r["time_s"] == pytest.approx(2 * (LAT + TF + D) + max(LAT, TD) + TF + D, rel=1e-12)


def test_oracle_prefetch_timing():
    """Capacity 2 blocks, L0 reads A, L1 reads B. The oracle prefetches A then B at t=0 (FIFO on H2D):
    A arrives at T, B at 2T. L0 starts at T (late-prefetch stall T), ends T + d; L1 starts at
    max(T + d, 2T). No faults; H2D 4 MiB; accuracy = coverage = 1."""
    b = TraceBuilder()
    a, bb = b.alloc(2 * MiB), b.alloc(2 * MiB)
    b.launch("l0", [(a, 0, 2 * MiB, READ)], duration=D)
    b.launch("l1", [(bb, 0, 2 * MiB, READ)], duration=D)
    r = replay(b.build(), "oracle", GPU, capacity_bytes=4 * MiB, check=True)
    assert r["time_s"] == pytest.approx(max(T + D, 2 * T) + D, rel=1e-12)
    assert r["faults"] == 0 and r["bytes_htod"] == 4 * MiB
    assert r["accuracy"] == 1 and r["coverage"] == 1
    assert r["late_stall_s"] == pytest.approx(T, rel=1e-12)


def test_small_tensors_share_a_block():
    """Three 100 KiB tensors are packed into one 2 MiB small-pool segment: one block, one fault."""
    b = TraceBuilder()
    xs = [b.alloc(100 * 1024) for _ in range(3)]
    b.launch("k", [(x, 0, 100 * 1024, READ) for x in xs], duration=D)
    r = replay(b.build(), "demand", GPU, capacity_bytes=4 * MiB, check=True)
    assert r["faults"] == 1 and r["footprint_bytes"] == 2 * MiB
    assert r["time_s"] == pytest.approx(LAT + TF + D, rel=1e-12)


def test_prefer_host_reads_over_the_link():
    """A policy advising PREFER_HOST for block 0: no fault, no migration; the launch takes
    d + 2 MiB / a (remote reads at link bandwidth)."""

    class Remote(Policy):
        name = "remote"

        def on_launch(self, info, state):
            return Decision(advise=((info.blocks, Advice.PREFER_HOST),))

    b = TraceBuilder()
    x = b.alloc(2 * MiB)
    b.launch("k", [(x, 0, 2 * MiB, READ)], duration=D)
    r = replay(b.build(), Remote(), GPU, capacity_bytes=4 * MiB, check=True)
    assert r["faults"] == 0 and r["bytes_htod"] == 0
    assert r["time_s"] == pytest.approx(D + 2 * MiB / A, rel=1e-12)


def test_policy_pre_eviction_frees_room_after_write_back():
    """Stepping the GpuModel directly (the dryrun backend's API). Capacity 1 block. L0 writes block 0
    (fault: lat + Tf, ends at e0 = lat + Tf + d). Before L1 (block 1) the policy evicts block 0 (dirty:
    write-back e0 .. e0 + Td) and prefetches block 1: its room is free at e0 + Td, so it arrives at
    e0 + Td + T and L1 ends there + d."""
    import numpy as np
    from uvmprefetch.policy.base import LaunchInfo

    class Swap(Policy):
        name = "swap"

        def on_launch(self, info, state):
            if info.index == 1:
                return Decision(evict=np.array([0]), prefetch=np.array([1]))
            return None

    m = GpuModel(GPU, 2 * MiB, 2 * MiB, 2, Swap(), check=True)
    r0 = m.launch(LaunchInfo(0, 0, 0, 0, 0, D, np.array([0]), np.array([0])))
    e0 = LAT + TF + D
    assert r0["end"] == pytest.approx(e0, rel=1e-12) and r0["faults"] == 1
    r1 = m.launch(LaunchInfo(1, 0, 0, 0, 0, D, np.array([1]), np.array([], dtype=np.int64)))
    assert r1["faults"] == 0 and r1["late"] == 1
    assert r1["end"] == pytest.approx(e0 + TD + T + D, rel=1e-12)
    m.end_iteration(0)
    res = m.result()
    assert res["bytes_dtoh"] == 2 * MiB and res["policy_evictions"] == 1 and res["peak_used_blocks"] == 1
    assert res["iteration_times_s"] == [pytest.approx(e0 + TD + T + D)]


@pytest.mark.parametrize("touched, dense", [(17, True), (16, False)])
def test_density_prefetch_with_64k_blocks(touched, dense):
    """64 KiB blocks: a 2 MiB tensor is 32 blocks of one 2 MiB region. A launch reads the first ``touched``
    of them: each is one fault entry (one batch), each moves in 64 KiB (t64 = 64 KiB / bw(64 KiB)).
    With 17/32 = 53 % > 51 % the driver pulls the other 15 blocks along as one 960 KiB copy:
    time = lat + 17 t64 + 960 KiB / bw(960 KiB) + d. With 16/32 = 50 % nothing more moves:
    time = lat + 16 t64 + d."""
    b = TraceBuilder()
    x = b.alloc(2 * MiB)
    b.launch("k", [(x, 0, touched * 64 * 1024, READ)], duration=D)
    r = replay(b.build(), "demand", GPU, capacity_bytes=4 * MiB, block_size=64 * 1024, check=True)
    t64 = 64 * 1024 / bw(64 * 1024)
    assert r["faults"] == touched and r["fault_batches"] == 1
    if dense:
        rest = 15 * 64 * 1024
        assert r["driver_prefetch_bytes"] == rest and r["bytes_htod"] == 2 * MiB
        assert r["time_s"] == pytest.approx(LAT + 17 * t64 + rest / bw(rest) + D, rel=1e-12)
    else:
        assert r["driver_prefetch_bytes"] == 0 and r["bytes_htod"] == 16 * 64 * 1024
        assert r["time_s"] == pytest.approx(LAT + 16 * t64 + D, rel=1e-12)


def test_block_cannot_return_before_its_write_back_ends():
    """Slow D2H link (1 GB/s, so Td1 = 2 MiB / bw_d(2 MiB) ~ 2.1 ms > d). Capacity 3 blocks.
    L0 writes block 0 (fault): e0 = lat + Tf + d. Before L1 the policy evicts block 0 (dirty: written back
    from e0 to e0 + Td1) and L1 faults block 1 into free room: e1 = e0 + lat + Tf + d. L2 needs block 0
    again: room is free, but its data is still on its way to the host, so its copy starts at
    max(e1 + lat, e0 + Td1): e2 = max(e1 + lat, e0 + Td1) + Tf + d."""
    import numpy as np
    from uvmprefetch.policy.base import LaunchInfo

    class EvictFirst(Policy):
        name = "evict-first"

        def on_launch(self, info, state):
            return Decision(evict=np.array([0])) if info.index == 1 else None

    gpu = GPU.with_overrides(link_dtoh_bw=1e9)
    td1 = 2 * MiB / (1e9 * 2 / math.pi * math.atan(0.0729 * 2 * MiB / 1024))
    m = GpuModel(gpu, 6 * MiB, 2 * MiB, 3, EvictFirst(), check=True)
    none = np.array([], dtype=np.int64)
    m.launch(LaunchInfo(0, 0, 0, 0, 0, D, np.array([0]), np.array([0])))
    m.launch(LaunchInfo(1, 0, 0, 0, 0, D, np.array([1]), none))
    r2 = m.launch(LaunchInfo(2, 0, 0, 0, 0, D, np.array([0]), none))
    e0 = LAT + TF + D
    e1 = e0 + LAT + TF + D
    assert td1 > LAT + TF + D  # the write-back really is the constraint
    assert r2["end"] == pytest.approx(max(e1 + LAT, e0 + td1) + TF + D, rel=1e-12)
    assert m.result()["bytes_dtoh"] == 2 * MiB


POP_CALL, POP_BLK = 20e-6, 2e-6
POP_GPU = dataclasses.replace(GPU, repopulate_call_s=POP_CALL, repopulate_block_s=POP_BLK)


def _reuse_after_drop(gpu, l3_populate, discards=True):
    """Stepping the GpuModel directly. Capacity 4 blocks. L0 writes block 0 (fault), which is then freed; L1 writes
    block 1, L2 writes block 2 (faults) and before L2 the policy discards block 0 (dead: dropped, no copy anywhere);
    L3 writes block 0 again (its memory handed out again), with ``Decision(populate=l3_populate)``. Returns the model
    and L3's result."""
    import numpy as np
    from uvmprefetch.policy.base import LaunchInfo

    class Reuse(Quiet):
        def on_launch(self, info, state):
            if info.index == 2:
                return Decision(discard=np.array([0]))
            if info.index == 3:
                return Decision(populate=np.array(l3_populate, dtype=np.int64))
            return None

    m = GpuModel(gpu, 8 * MiB, 2 * MiB, 4, Reuse(), check=True, discards=discards)
    for i, blk in enumerate((0, 1, 2)):
        m.launch(LaunchInfo(i, 0, 0, 0, 0, D, np.array([blk]), np.array([blk])))
        if i == 0:
            m.free(np.array([0]))
    return m, m.launch(LaunchInfo(3, 0, 0, 0, 0, D, np.array([0]), np.array([0])))


def test_a_populate_maps_a_dropped_dead_block_without_a_fault_or_a_transfer():
    """L0..L2 fault one live block each: e2 = 3 (lat + Tf + d). Before L3 the populate of block 0 (dead, dropped)
    is one call: it ends at e2 + call + 1 block, and L3 waits for it: end3 = e2 + call + blk + d. No fault, no byte
    H2D beyond the three faults' 6 MiB. Block 3 (never used: not dead) is prefetched instead (one transfer T,
    arriving at e2 + T, which L3 does not need): refused."""
    e2 = 3 * (LAT + TF + D)
    m, r3 = _reuse_after_drop(POP_GPU, [0, 3])
    assert r3["faults"] == 0 and r3["start"] == pytest.approx(e2 + POP_CALL + POP_BLK, rel=1e-12)
    assert r3["end"] == pytest.approx(e2 + POP_CALL + POP_BLK + D, rel=1e-12)
    res = m.result()
    assert res["populated_blocks"] == 1 and res["populate_calls"] == 1 and res["refused_populates"] == 1
    assert res["zero_fill_blocks"] == 0 and res["faults"] == 3
    assert res["bytes_htod"] == 6 * MiB + 2 * MiB  # three faults + the refused block's prefetch
    assert m.arrive[3] == pytest.approx(e2 + T, rel=1e-12)


def test_without_a_populate_the_reused_dead_block_faults_zero_filled():
    """The same run with no populate: L3 faults block 0, dead, so no transfer: one fault batch, end3 = e2 + lat +
    d (one zero-filled block)."""
    e2 = 3 * (LAT + TF + D)
    m, r3 = _reuse_after_drop(POP_GPU, [])
    assert r3["faults"] == 1 and r3["end"] == pytest.approx(e2 + LAT + D, rel=1e-12)
    assert m.result()["zero_fill_blocks"] == 1 and m.result()["populated_blocks"] == 0


@pytest.mark.parametrize("case", ["no populate cost", "no discards"])
def test_where_the_caller_cannot_populate_a_populate_is_a_prefetch(case):
    """A profile without a populate cost (the -lit ones): block 0 is prefetched instead, dead, so without a transfer
    and at once (end3 = e2 + d). Without discards nothing is dead: the discard before L2 is an eviction (block 0 is
    written back, dirty) and L3's populate a prefetch of its data, one transfer T after L2's end: end3 = e2 + T + d."""
    e2 = 3 * (LAT + TF + D)
    gpu, discards = (GPU, True) if case == "no populate cost" else (POP_GPU, False)
    m, r3 = _reuse_after_drop(gpu, [0], discards=discards)
    res = m.result()
    assert res["populated_blocks"] == 0 and res["refused_populates"] == 1 and r3["faults"] == 0
    assert not m.policy.ctx.populates
    if discards:
        assert r3["end"] == pytest.approx(e2 + D, rel=1e-12) and res["bytes_htod"] == 6 * MiB
    else:
        assert r3["end"] == pytest.approx(e2 + T + D, rel=1e-12) and res["bytes_htod"] == 8 * MiB


def _weight_and_output(small: bool):
    """W (a weight: registered before the first launch, first read) and X (a new output, first written), 2 MiB each
    (blocks 0 and 1) or, with ``small``, 100 KiB each packed into one small-pool block. L0 reads W and writes X."""
    b = TraceBuilder()
    size = 100 * 1024 if small else 2 * MiB
    w, x = b.alloc(size, "param"), b.alloc(size, "activation")
    b.launch("l0", [(w, 0, size, READ), (x, 0, size, WRITE)], duration=D)
    return b.build()


@pytest.mark.parametrize("gpu", ["populates", "lit"])
def test_fresh_memory_faults_zero_filled_on_first_touch(gpu):
    """Both blocks fault in one batch (34 entries). With populates modelled (``POP_GPU``) X's block is fresh (no tensor
    from before the trace lies there): zero-filled, no transfer: time = lat + Tf + d, 2 MiB H2D, and the cold
    first-touch cost is W's alone (lat + Tf, 2 MiB). The -lit profile moves both: lat + 2 Tf + d, 4 MiB."""
    moved = 1 if gpu == "populates" else 2
    r = replay(_weight_and_output(False), "demand", POP_GPU if gpu == "populates" else GPU, capacity_bytes=4 * MiB,
               check=True)
    assert r["faults"] == 2 and r["fault_batches"] == 1 and r["zero_fill_blocks"] == 2 - moved
    assert r["time_s"] == pytest.approx(LAT + moved * TF + D, rel=1e-12)
    assert r["bytes_htod"] == moved * 2 * MiB and r["cold_first_touch_bytes"] == moved * 2 * MiB
    assert r["cold_first_touch_s"] == pytest.approx(LAT + moved * TF, rel=1e-12)


def test_a_block_a_tensor_from_before_the_trace_shares_is_not_fresh():
    """W and X share one small-pool block: W's data lies there, so the block moves: lat + Tf + d, 2 MiB H2D."""
    r = replay(_weight_and_output(True), "demand", POP_GPU, capacity_bytes=4 * MiB, check=True)
    assert r["faults"] == 1 and r["zero_fill_blocks"] == 0 and r["bytes_htod"] == 2 * MiB
    assert r["time_s"] == pytest.approx(LAT + TF + D, rel=1e-12)


def test_a_populate_maps_a_fresh_block_and_a_prefetch_of_one_moves_nothing():
    """Stepping the GpuModel with blocks 0 and 1 fresh, 2 not. Before L0 (writes block 0) the policy populates 0 and
    2: block 0 is mapped by one call (L0 starts at call + blk, no fault); block 2 holds data: refused, prefetched (one
    transfer T). Before L1 (writes block 1) it prefetches block 1: fresh, so it arrives at once, behind block 2 in
    the H2D queue (at T, the queue's end): L1 starts at max(call + blk + d, T), no fault. 2 MiB H2D in all: block
    2's."""
    from uvmprefetch.policy.base import LaunchInfo

    class Pop(Quiet):
        def on_launch(self, info, state):
            if info.index == 0:
                return Decision(populate=np.array([0, 2]))
            return Decision(prefetch=np.array([1]))

    m = GpuModel(POP_GPU, 8 * MiB, 2 * MiB, 4, Pop(), check=True, fresh=np.array([True, True, False, False]))
    assert m.policy.ctx.populates
    r0 = m.launch(LaunchInfo(0, 0, 0, 0, 0, D, np.array([0]), np.array([0])))
    assert r0["faults"] == 0 and r0["start"] == pytest.approx(POP_CALL + POP_BLK, rel=1e-12)
    r1 = m.launch(LaunchInfo(1, 0, 0, 0, 0, D, np.array([1]), np.array([1])))
    assert r1["faults"] == 0 and r1["start"] == pytest.approx(max(POP_CALL + POP_BLK + D, T), rel=1e-12)
    res = m.result()
    assert res["populated_blocks"] == 1 and res["refused_populates"] == 1 and res["bytes_htod"] == 2 * MiB
