"""Discards decided by the caching allocator's own events, end to end through the cuda backend on the CPU.

The one fake is the event source (``alloc_model.FakeAllocator`` behind the tracker's entry points: there is no
CUDA caching allocator on a CPU) and the mover's CUDA calls; the ``AllocatorFeed``, ``Liveness``, the backend's
tickets and books, and the order "decision -> gate -> check -> discard" are the real ones. Each scenario is one
the H100/H200 runs or the allocator's rules make possible; in each, no live byte is ever discarded.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from test_runtime_cuda_logic import BASE, BS, Event, Scripted, backend, blocks_allocated, die, info
from uvmprefetch.policy.base import Decision


class Truth:
    """Wraps the fake mover: when the check has decided, every block it kept must be dead by the byte-level
    truth of the fake allocator at that moment (nothing allocated in any byte of it); ``extents``: the same truth
    read over extents (large address spaces)."""

    def __init__(self, be, extents=False):
        self.be, self.bad, self.kept = be, [], 0
        real = be.mover.discard

        def discard(items, after=0, check=None):
            def checked():
                keep = check()
                fa = be.feed.lib.a
                live, ok = (None, None) if extents else (fa.live_bytes(), fa.discardable_bytes())
                for it, k in zip(items, keep):
                    if k and it:
                        self.kept += 1
                        blk = it[0][0] // BS
                        if not (fa.dead_by_extents(blk, BS) if extents else fa.dead(blk, BS, live, ok)):
                            self.bad.append(blk)
                return keep
            return real(items, after, checked if check is not None else None)
        be.mover.discard = discard


def discarded(be):
    return [r for k, r, *_ in be.mover.log if k == "discard"]


def run_discard(be, block, index):
    """A launch elsewhere (block 7) whose Decision discards ``block``."""
    be.policy.decisions.append(Decision(discard=np.array([block])))
    be.launch(info(index, be, BASE + 7 * BS, BS))


def setup(n=8, batch=1):
    pol = Scripted([])
    be = backend(pol, 16, [(BASE, 16 * BS)], batch=batch)
    be.feed.lib.a.segment(16 * BS, base=BASE)
    Event.done = 1 << 30  # the GPU has finished every launch: nothing is protected
    be.block_ids(BASE, n * BS)
    return be, be.feed.lib.a


def test_a_workspace_no_op_touches_keeps_its_block_live():
    # GIVEN block 1 holding a tensor the launches use (first half) and a library workspace no op ever touches
    # (second half: cuBLAS takes it from the caching allocator; the runtime's ops never show it)
    be, fa = setup()
    first = fa.alloc(BS)  # block 0
    t = fa.alloc(BS // 2)  # block 1, first half
    w = fa.alloc(BS // 2)  # block 1, second half: the workspace
    assert (first, t, w) == (BASE, BASE + BS, BASE + BS + BS // 2)
    be.launch(info(0, be, t, BS // 2))
    # WHEN the tensor dies and the policy discards block 1
    die(be, t)
    run_discard(be, 1, 1)
    # THEN it is evicted (data kept), never discarded: the workspace holds it
    assert discarded(be) == [] and be.refused["not_dead"] == 1
    # AND once the workspace is freed too, the block is dead and may go
    die(be, w)
    run_discard(be, 1, 2)
    assert discarded(be) == [[(BASE + BS, BS)]]


def test_a_free_completed_long_after_it_was_requested_waits_for_completion():
    # GIVEN a tensor in block 2 freed with record_stream (FREE_REQUESTED now, FREE_COMPLETED when the other
    # stream is done with it)
    be, fa = setup()
    addrs = [fa.alloc(BS) for _ in range(8)]
    be.launch(info(0, be, addrs[2], BS))
    fa.free(addrs[2], deferred=True)
    be.feed.take_events()
    be.deaths_before(1 << 62)
    run_discard(be, 2, 1)
    assert discarded(be) == [] and be.refused["not_dead"] == 1
    # WHEN the free completes
    fa.complete(addrs[2])
    be.feed.take_events()
    be.deaths_before(1 << 62)
    run_discard(be, 2, 2)
    assert discarded(be) == [[(BASE + 2 * BS, BS)]]


def test_a_block_split_between_a_dead_and_a_live_allocation_stays():
    be, fa = setup()
    a = fa.alloc(BS + BS // 2)  # blocks 0 and half of 1
    b = fa.alloc(BS + BS // 2)  # the other half of 1, and 2
    be.launch(info(0, be, a, 3 * BS))
    die(be, a)
    assert be.ticket[0] and not be.ticket[1] and not be.ticket[2]
    run_discard(be, 0, 1)
    run_discard(be, 1, 2)
    assert discarded(be) == [[(BASE, BS)]] and be.refused["not_dead"] == 1
    assert b


def test_memory_reused_after_the_decision_but_before_the_discard_is_refused():
    # GIVEN block 3 dead, a discard decided; WHEN the allocator hands it out while the mover gates the compute
    # stream (after the decision, before the check), THEN the check sees the ALLOC and the block is evicted
    be, fa = setup()
    addrs = [fa.alloc(BS) for _ in range(8)]
    be.launch(info(0, be, addrs[3], BS))
    die(be, addrs[3])
    be.mover.before_check = lambda: fa.alloc(BS)  # first fit: block 3 again
    run_discard(be, 3, 1)
    assert discarded(be) == [] and be.refused["reused_before_issue"] == 1
    assert ("to_host", [(BASE + 3 * BS, BS)], 0) in be.mover.log


def test_a_segment_given_back_by_empty_cache_leaves_the_books_and_is_never_discarded():
    be, fa = setup()
    seg2 = fa.segment(2 * BS, base=BASE + 32 * BS)
    x = fa.alloc(2 * BS, seg=seg2)
    be.launch(info(0, be, x, 2 * BS))
    ids = be.block_ids(x, 2 * BS)
    assert be.res.resident[ids].all()
    die(be, x)
    assert be.ticket[ids].all()
    fa.empty_cache()
    be.feed.take_events()
    be.deaths_before(1 << 62)
    # THEN the blocks are no longer resident, their tickets are gone, the policy was told
    assert not be.res.resident[ids].any() and not be.ticket[ids].any()
    assert ("free", ids.tolist()) in be.policy.events
    run_discard(be, int(ids[0]), 1)
    assert discarded(be) == []


def test_an_overflow_makes_every_block_live_until_a_quiescent_rebuild():
    be, fa = setup()
    addrs = [fa.alloc(BS) for _ in range(8)]
    be.feed.take_events()
    be.launch(info(0, be, addrs[4], 2 * BS))
    # GIVEN the ring dropped an event (an ALLOC of block 5 the books never see) while block 4 died
    fa.free(addrs[4])
    fa.free(addrs[5])
    n = len(fa.queue)
    fa.alloc(BS)  # block 4 again ...
    be.feed.lib.drop = {n}  # ... and that ALLOC is lost
    be.feed.take_events()
    be.deaths_before(1 << 62)
    # THEN nothing is discarded on incomplete knowledge
    run_discard(be, 5, 1)
    run_discard(be, 4, 2)
    assert discarded(be) == [] and be.liveness_result()["unknown"] == "allocator event ring overflowed"
    # WHEN an iteration ends: the books are rebuilt from the allocator's snapshot; block 5 is dead, 4 is not
    be.feed.quiescent(fa.snapshot)
    be.deaths_before(1 << 62)
    assert be.liveness_result()["unknown"] is None and be.liveness_result()["resyncs"] == 1
    run_discard(be, 4, 3)
    run_discard(be, 5, 4)
    assert discarded(be) == [[(BASE + 5 * BS, BS)]]


# ------------------------------------------------------------------------------------- one gate per batch
def with_dead(batch, used, dead):
    """A backend that batches discards by ``batch`` launches over eight one-block allocations: launch 0 used blocks
    ``0 .. used - 1``, the allocations at ``dead`` died since. Returns the backend and the allocator."""
    be, fa = setup(batch=batch)
    addrs = [fa.alloc(BS) for _ in range(8)]
    be.launch(info(0, be, BASE, used * BS))
    die(be, *(addrs[k] for k in dead))
    return be, fa


def test_the_discards_of_several_launches_go_behind_one_gate_closure():
    # GIVEN discards batched by 3 launches, blocks 0..5 dead
    be, _ = with_dead(3, 6, range(6))
    # WHEN two launches discard a block each: nothing is issued yet (no move of them is due)
    run_discard(be, 0, 1)
    run_discard(be, 1, 2)
    assert discarded(be) == [] and be.gate_closures == 0
    # THEN the third issues all three behind one closure
    run_discard(be, 2, 3)
    three = [(BASE + k * BS, BS) for k in range(3)]  # (a range per block: the mover checks each apart)
    assert discarded(be) == [three] and be.gate_closures == 1 and be.discarded_blocks == 3
    # AND an iteration end issues what is left, and counts the iteration's closures
    run_discard(be, 3, 4)
    be.discards_iteration_end()
    run_discard(be, 4, 5)
    be.discards_iteration_end()
    be.discards_iteration_end()
    assert discarded(be) == [three, [(BASE + 3 * BS, BS)], [(BASE + 4 * BS, BS)]]
    assert be.gate_closures_per_iteration == [2, 1, 0]
    assert be.liveness_result()["gate_closures_per_iteration"] == [2, 1, 0]
    assert sum(be.refused.values()) == 0


def test_a_batched_block_the_allocator_hands_out_again_is_never_discarded():
    be, fa = with_dead(8, 4, range(4))
    run_discard(be, 0, 1)
    run_discard(be, 1, 2)
    run_discard(be, 2, 3)
    # WHEN block 0 is handed out again and a launch uses it, and block 1 is handed out with no launch yet
    a0 = fa.alloc(BS)
    be.feed.take_events()
    be.launch(info(4, be, a0, BS))
    fa.alloc(BS)
    be.feed.take_events()
    be.discards_iteration_end()
    # THEN only block 2 is discarded: 0 left the batch when the launch used it (not evicted: it is in use), the
    # check refused 1 at issue time (evicted: the books count it gone)
    assert discarded(be) == [[(BASE + 2 * BS, BS)]]
    assert be.refused["reused_before_issue"] == 2 and be.gate_closures == 1
    assert ("to_host", [(BASE + BS, BS)], 0) in be.mover.log and ("to_host", [(BASE, BS)], 0) not in be.mover.log
    # AND the books hold block 0 resident again (it never left the GPU): the launch that used it did not fault
    assert be.res.resident[0] and not [e for e in be.policy.events if e[:2] == ("fault", 4)]


def test_a_batched_block_handed_out_and_dead_again_is_checked_against_its_latest_death():
    # GIVEN block 3 in the batch; WHEN the allocator hands it out and takes it back before the batch goes, no
    # launch using it: THEN it is discarded (dead since its latest death), the policy heard of both deaths
    be, fa = with_dead(16, 4, (3,))
    run_discard(be, 3, 1)
    a = fa.alloc(BS)
    assert a == BASE + 3 * BS
    die(be, a)
    be.discards_iteration_end()
    assert discarded(be) == [[(BASE + 3 * BS, BS)]] and sum(be.refused.values()) == 0
    # AND had it been handed out again once more (live now), the check would have refused it
    be, fa = with_dead(16, 4, (3,))
    run_discard(be, 3, 1)
    die(be, fa.alloc(BS))
    fa.alloc(BS)
    be.feed.take_events()
    be.discards_iteration_end()
    assert discarded(be) == [] and be.refused["reused_before_issue"] == 1


def test_a_move_of_a_batched_block_issues_the_batch_first_and_waits_for_it():
    # GIVEN blocks 2 and 5 in the batch; WHEN a launch prefetches block 5 (the policy expects it reused)
    be, _ = with_dead(16, 6, (2, 5))
    run_discard(be, 2, 1)
    run_discard(be, 5, 2)
    assert discarded(be) == []
    be.policy.decisions.append(Decision(prefetch=np.array([5])))
    be.launch(info(3, be, BASE + 7 * BS, BS))
    # THEN the batch is issued before the prefetch, and the prefetch waits for its mark
    log = [e for e in be.mover.log if e[0] != "mark"]
    assert log[-2:] == [("discard", [(BASE + 2 * BS, BS), (BASE + 5 * BS, BS)], 0),
                        ("to_gpu", [(BASE + 5 * BS, BS)], 1)]


def test_a_batched_block_whose_segment_goes_back_to_the_driver_leaves_the_batch():
    be, fa = setup(batch=16)
    seg2 = fa.segment(2 * BS, base=BASE + 32 * BS)
    x = fa.alloc(2 * BS, seg=seg2)
    be.launch(info(0, be, x, 2 * BS))
    ids = be.block_ids(x, 2 * BS)
    die(be, x)
    run_discard(be, int(ids[0]), 1)
    fa.empty_cache()
    be.feed.take_events()
    be.deaths_before(1 << 62)
    be.discards_iteration_end()
    # THEN neither discarded nor moved (the memory is the driver's again)
    assert discarded(be) == [] and be.refused["released"] == 1
    assert not [e for e in be.mover.log if e[0] in ("to_host", "to_gpu")]


def test_a_gap_in_the_op_records_evicts_the_batch_instead():
    be, _ = with_dead(16, 4, (0, 1))
    run_discard(be, 0, 1)
    run_discard(be, 1, 2)
    be.gap()
    be.discards_iteration_end()
    assert discarded(be) == [] and be.refused["unknown"] == 2
    assert ("to_host", [(BASE, 2 * BS)], 0) in be.mover.log


def test_the_real_mover_closes_the_gate_once_per_batch():
    """The backend over the real ``Mover`` with the driver faked at its boundary (``FakeCudart``, the gate's
    ``cuStreamWaitValue32``/``cuStreamWriteValue32``): three discarding launches, one closure, one
    ``cudaMemDiscardBatchAsync`` with every block, issued after the kernels queued until then."""
    from test_runtime_cuda_logic import mover
    be, _ = with_dead(3, 6, (0, 2, 4))
    be.mover, log = mover(batch=True)
    for k, b in enumerate((0, 2, 4)):
        run_discard(be, b, k + 1)
    gates = [e for e in log if e[0] == "gate"]
    discards = [c for c in be.mover.rt.calls if c[0] == "discard_batch"]
    assert gates == [("gate", 0, 1)] and len(discards) == 1
    assert discards[0][1][0] == (BASE, BASE + 2 * BS, BASE + 4 * BS)
    # (the compute stream's event is recorded when the batch goes, the gate right after it, opened after the discard)
    i = log.index(("gate", 0, 1))
    assert log[i - 1][:2] == ("record", 0) and log[-1] == ("open", 12, 1)
    assert be.gate_closures == 1


def replay_trace(path, batch, ratio=1.5):
    """The trace's allocations and frees through the fake caching allocator (one large segment, first fit), its
    launches through the real backend and the real ``uvmprefetch`` policy at working set / ``ratio``, discards
    batched by ``batch`` launches, an iteration end at each iteration mark. Returns the backend and its ``Truth``."""
    from test_runtime_cuda_logic import backend

    from uvmprefetch.policy import make_policy
    from uvmprefetch.policy.base import LaunchInfo
    from uvmprefetch.trace.format import load
    t = load(path)
    live = np.zeros(t.n_launches + 2, dtype=np.int64)  # bytes allocated before launch i, freed after it
    np.add.at(live, t.alloc_at, t.alloc_size)
    freed = t.free_at >= 0
    np.add.at(live, t.free_at[freed] + 1, -t.alloc_size[freed])
    cap = int(np.cumsum(live).max() / ratio) // BS
    seg = 1 << 34
    be = backend(make_policy("uvmprefetch"), cap, [(BASE, seg)], batch=batch, max_blocks=8192)
    fa = be.feed.lib.a
    fa.segment(seg, base=BASE)
    Event.done = 1 << 40  # the GPU keeps up: no launch is protected
    truth = Truth(be, extents=True)
    born = {i: np.flatnonzero(t.alloc_at == i) for i in np.unique(t.alloc_at)}
    dies = {i: np.flatnonzero(t.free_at == i) for i in np.unique(t.free_at[freed])}
    addr = {}
    it = int(t.launch_iter[0])
    for i in range(t.n_launches):
        if int(t.launch_iter[i]) != it:
            it = int(t.launch_iter[i])
            be.discards_iteration_end()
        for a in born.get(i, ()):
            addr[int(a)] = fa.alloc(int(t.alloc_size[a]))
        be.feed.take_events()
        be.deaths_before(1 << 62)
        sl = t.accesses(i)
        parts = [be.block_ids(addr[int(a)] + int(off), int(n)) for a, off, n
                 in zip(t.acc_alloc[sl], t.acc_off[sl], t.acc_len[sl]) if addr.get(int(a)) is not None]
        b = np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
        be.launch(LaunchInfo(index=i, exec_id=int(t.launch_exec_id[i]), name=0, phase=int(t.launch_phase[i]),
                             iteration=it, duration=float(t.launch_dur[i]), blocks=b, write_blocks=b))
        for a in dies.get(i, ()):
            if addr.get(int(a)) is not None:
                fa.free(addr.pop(int(a)))
    be.discards_iteration_end()
    return be, truth


def test_a_training_trace_batched_closes_the_gate_less_often_and_discards_no_live_byte():
    """GIVEN the shipped GPT-2 small trace (3 iterations) replayed through the fake caching allocator into the real
    backend, allocator feed and ``uvmprefetch`` policy at 1.5x; WHEN discards are batched by 16 launches instead
    of going one launch at a time; THEN the steady iteration closes the gate at least 4 times less often, the
    batched run still discards, and neither discards a block that holds a live byte. (Batched, some dead blocks are
    handed out again before their batch goes: no discard is needed for them.)"""
    from pathlib import Path
    trace = Path(__file__).resolve().parents[2] / "traces" / "gpt2-small-b2s128.uvmt"
    one, t1 = replay_trace(trace, 1)
    many, t16 = replay_trace(trace, 16)
    c1, c16 = one.gate_closures_per_iteration, many.gate_closures_per_iteration
    assert len(c1) == len(c16) == 3  # (an entry per iteration)
    assert c1[1] >= 20 and 4 * c16[1] <= c1[1], (c1, c16)
    assert one.discarded_blocks > 0 and many.discarded_blocks >= one.discarded_blocks // 2
    assert t1.kept > 0 and not t1.bad and t16.kept > 0 and not t16.bad


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc"] * 3 + ["free"] * 2 + ["discard"] * 3 +
                                          ["defer", "complete", "launch", "drop", "quiescent", "empty", "end"]),
                          st.integers(0, 15),
                          # (mostly whole blocks: a block dies only when no allocation overlaps any byte of it)
                          st.integers(1, 40).map(lambda n: (n % 3 + 1) * BS if n <= 34 else n * 150_001)),
                min_size=5, max_size=60),
       st.sampled_from([1, 3, 16]))
def test_no_live_byte_is_ever_discarded(steps, batch):
    """Random allocator histories interleaved with launches and discard decisions (allocations made between a
    decision and its check included, dropped events, rebuilds, empty_cache, iteration ends), discards batched by
    ``batch`` launches: every block the check lets through holds no live byte at that moment, by the fake
    allocator's byte-level truth."""
    be, fa = setup(16, batch=batch)
    truth = Truth(be)
    live: list[int] = []
    pending: list[int] = []
    k = 0
    for op, i, size in steps:
        if op == "alloc":
            a = fa.alloc(size)
            if a is not None:
                live.append(a)
        elif op in ("free", "defer") and live:
            a = live.pop(i % len(live))
            fa.free(a, deferred=op == "defer")
            if op == "defer":
                pending.append(a)
        elif op == "complete" and pending:
            fa.complete(pending.pop(i % len(pending)))
        elif op == "launch" and live:
            a = live[i % len(live)]
            be.feed.take_events()
            be.deaths_before(1 << 62)
            be.launch(info(k, be, a, fa.allocs[a]["size"]))
            k += 1
        elif op == "discard":
            be.feed.take_events()
            be.deaths_before(1 << 62)
            be.mover.before_check = (lambda s=size: fa.alloc(s)) if i % 3 == 0 else None
            dead = np.flatnonzero(be.ticket)  # (mostly a block the allocator reported dead: the case that matters)
            run_discard(be, int(dead[i % dead.size]) if dead.size and i % 4 else i % max(be.res.n_ids, 1), k)
            k += 1
            be.mover.before_check = None
        elif op == "drop" and fa.queue:
            be.feed.lib.drop = {i % len(fa.queue)}
            be.feed.take_events()
        elif op == "quiescent":
            be.feed.quiescent(fa.snapshot)
        elif op == "end":  # an iteration ends: the batch goes (the allocator may hand memory out meanwhile)
            be.mover.before_check = (lambda s=size: fa.alloc(s)) if i % 2 else None
            be.discards_iteration_end()
            be.mover.before_check = None
        elif op == "empty":  # a segment used, freed and given back to the driver (empty_cache)
            spare = fa.segment(2 * BS)
            x = fa.alloc(size, seg=spare)
            if x is not None:
                be.feed.take_events()
                be.deaths_before(1 << 62)
                be.launch(info(k, be, x, min(size, 2 * BS)))
                k += 1
                fa.free(x)
            fa.release(spare)
        live = [a for a in live if a in fa.allocs]  # (an ALLOC in before_check is not ours to free)
    be.discards_iteration_end()
    assert not truth.bad, f"blocks discarded while an allocation held a byte of them: {truth.bad}"


class RingLib:
    """The observer library's op ring and counters at its C boundary: hands the planner the op records it is
    given (``kernels/uvmobs.h`` layout), nothing else."""

    def __init__(self, ops):
        from uvmprefetch.runtime import native_observer as no
        self.no, self.ops = no, ops

    def drain_ops(self):
        ops, self.ops = self.ops, self.ops[:0]
        return ops

    def drain_allocs(self):
        return np.zeros(0, dtype=self.no.ALLOC_DTYPE)

    def state(self):
        return self.no.STATE_ACTIVE

    def counters(self):
        return {"dropped": 0}

    def alloc_stats(self):
        return {"dropped": 0}

    def op_name(self, op_id):
        return f"aten::op{op_id}"

    def parked(self):
        return 0, 0  # (how often and how long the training thread waited for the planner's turns)


def op_records(seq, op_id, ranges):
    """One op's run of records: HEAD, HEAD2, a RANGE per (address, length) read."""
    from uvmprefetch.runtime import native_observer as no
    recs = np.zeros(2 + len(ranges), dtype=no.OP_DTYPE)
    recs[0] = (seq, 1000 + op_id, op_id | no.HEAD << 56, len(ranges))
    recs[1] = (0, 0, no.HEAD2 << 56, 0)
    for k, (addr, n) in enumerate(ranges):
        recs[2 + k] = (addr, 0, n | 1 << 48 | no.RANGE << 56, n)
    return recs


def test_the_planner_hands_each_death_to_the_policy_before_the_next_op_and_not_before_its_own():
    """The planner merges the allocator's events with the ops by sequence number: a death reaches the policy
    (``on_free``) after the launches numbered before it and before the first launch numbered after it."""
    from uvmprefetch.config import RuntimeConfig
    from uvmprefetch.runtime.planner import Planner
    from uvmprefetch.runtime.session import Session
    be, fa = setup()
    a, b = fa.alloc(BS), fa.alloc(BS)  # events 1..3
    fa.seq = 10
    fa.free(a)  # 11, 12: A dies after op 1 (seq 10), before op 2 (seq 20)
    fa.seq = 20
    fa.free(b)  # 21, 22: B dies after op 2, before no op yet
    ops = np.concatenate([op_records(10, 1, [(a, BS), (b, BS)]), op_records(20, 2, [(b, BS)])])
    s = Session(RuntimeConfig(enabled=True, backend="dryrun"), backend=be)
    s.active = True
    p = Planner(s, RingLib(ops), 0)
    assert p._batch()
    ia, ib = be._ids[a // BS], be._ids[b // BS]
    events = [e for e in be.policy.events if e[0] in ("launch", "free")]
    assert events == [("launch", 0), ("free", [ia]), ("launch", 1)]
    assert be.ticket[ia] and not be.ticket[ib]  # B's death waits for the next op
    # WHEN the next op arrives (a new tensor in block 0: the allocator's ALLOC before it), B's death goes first
    c = fa.alloc(BS)
    assert c == a
    p.lib.ops = op_records(fa.seq + 5, 3, [(c, BS)])
    p._batch()
    events = [e for e in be.policy.events if e[0] in ("launch", "free")]
    assert events[3:] == [("free", [ib]), ("launch", 2)]
    assert not be.ticket[ia] and be.ticket[ib]  # block 0 handed out again: its ticket is gone


def test_deaths_do_not_pile_up_while_the_planner_is_dormant():
    """While the model fits, the planner is dormant and no op is recorded: deaths have no op to wait for and are
    handed out as they come (else a run that never wakes would hold every death of the run)."""
    from uvmprefetch.config import RuntimeConfig
    from uvmprefetch.runtime.planner import Planner
    from uvmprefetch.runtime.session import Session
    be, fa = setup()
    s = Session(RuntimeConfig(enabled=True, backend="dryrun"), backend=be)
    s.active = True
    p = Planner(s, RingLib(op_records(1, 1, [])[:0]), 1 << 40)
    assert p.dormant
    for _ in range(50):
        fa.free(fa.alloc(BS))
        p._batch()
    assert not be.feed._dead_blk and be.feed.stats()["deaths"] == 50


def test_the_planner_hands_the_copy_paths_book_each_allocator_event_once_in_order_up_to_its_ops():
    """The copy path's book (``CudaBackend.allocator_events``) gets the allocator's events in sequence order, each
    once, those older than the ops being planned first (it applies them up to the op it plans itself)."""
    import types
    from uvmprefetch.config import RuntimeConfig
    from uvmprefetch.runtime.copyout import ObservedAllocations
    from uvmprefetch.runtime.planner import Planner
    from uvmprefetch.runtime.session import Session
    be, fa = setup()
    forgotten = []
    be.copy = types.SimpleNamespace(book=ObservedAllocations(observed=lambda addr: True), forget=forgotten.append)
    be._copy_books = True
    a, b = fa.alloc(BS), fa.alloc(BS)
    fa.seq = 10
    fa.free(a)
    fa.seq = 20
    fa.free(b)  # newer than every op of the first batch
    ops = np.concatenate([op_records(10, 1, [(a, BS), (b, BS)]), op_records(20, 2, [(b, BS)])])
    s = Session(RuntimeConfig(enabled=True, backend="dryrun"), backend=be)
    s.active = True
    p = Planner(s, RingLib(ops), 0)
    assert p._batch()
    handed = np.concatenate(be.copy.book._pending)["seq"].tolist()
    assert handed == sorted(handed) and len(set(handed)) == len(handed) and max(handed) < 20
    # WHEN the next op comes, the events before it follow, none twice
    c = fa.alloc(BS)
    p.lib.ops = op_records(fa.seq + 5, 3, [(c, BS)])
    p._batch()
    handed = np.concatenate(be.copy.book._pending)["seq"].tolist()
    assert handed == sorted(handed) and len(set(handed)) == len(handed) and max(handed) > 20
    assert forgotten  # the dead blocks' mirrors are dropped with their deaths
