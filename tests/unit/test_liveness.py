"""Liveness from the caching allocator's events (``uvmprefetch.runtime.liveness``), against a fake allocator.

GIVEN a fake caching allocator (``alloc_model.FakeAllocator``: the event source, and the byte-level truth)
WHEN its events are fed to a ``Liveness`` in the sequences that lost data or could (a workspace no op touches,
a free completed long after it was requested, a block shared by a dead and a live allocation, memory reused
before a discard was issued, ``empty_cache``, a ring overflow, a late attach)
THEN no block it calls dead holds a live byte, and (with complete knowledge) every block that held data and
holds none any more is called dead; a Hypothesis property checks both over random event streams.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alloc_model import FakeAllocator
from uvmprefetch.runtime.liveness import (ALLOC, ANNOTATE, EVENT_DTYPE, OOM, SNAPSHOT, UNKNOWN, Liveness,
                                          snapshot_events)

BS = 4096  # a small block: the truth is checked byte by byte


def _tracker(**kw) -> Liveness:
    return Liveness(block_size=BS, device=0, complete_from_start=kw.pop("complete_from_start", True), **kw)


def _feed(tr: Liveness, fa: FakeAllocator, drop=None):
    ev, dropped = fa.deliver(drop)
    if dropped:
        tr.overflow()
    return tr.feed(ev)


def _blocks(addr: int, size: int) -> list[int]:
    return list(range(addr // BS, (addr + size - 1) // BS + 1))


def _assert_no_live_byte_dead(tr: Liveness, fa: FakeAllocator, blocks) -> None:
    blocks = np.asarray(sorted(set(blocks)), dtype=np.int64)
    live, ok = fa.live_bytes(), fa.discardable_bytes()
    for b, d in zip(blocks.tolist(), tr.dead_mask(blocks).tolist()):
        if d:
            assert fa.dead(b, BS, live, ok), f"block {b} called dead but holds a live byte or foreign memory"


def test_workspace_no_op_touches_keeps_its_block_live():
    """The cuBLAS case: a workspace allocated once from the caching allocator and never used by an observed op
    sits in a block with activations. The op-level view (the activations died) called the block dead; the
    allocator's events keep it live for the whole run."""
    fa, tr = FakeAllocator(), _tracker()
    seg = fa.segment(4 * BS)
    act1 = fa.alloc(BS + 1024)  # blocks 0-1 of the segment
    ws = fa.alloc(1536)  # the workspace, right after it, in block 1
    act2 = fa.alloc(2 * BS)  # blocks 1-3
    _feed(tr, fa)
    for it in range(3):  # iterations: activations die and come back around the workspace
        fa.free(act1)
        fa.free(act2)
        d = _feed(tr, fa)
        ws_block = ws // BS
        observed_dead = set(_blocks(act1, BS + 1024)) | set(_blocks(act2, 2 * BS))
        assert ws_block in observed_dead  # what the op-level inference would have discarded
        assert ws_block not in d.blocks.tolist() and not tr.dead_mask(np.array([ws_block]))[0]
        # every block of the segment but the workspace's: nothing else is allocated there
        assert set(d.blocks.tolist()) == set(_blocks(seg, 4 * BS)) - {ws_block}
        _assert_no_live_byte_dead(tr, fa, observed_dead)
        act1, act2 = fa.alloc(BS + 1024), fa.alloc(2 * BS)
        _feed(tr, fa)
    assert ws_block in tr.live_blocks().tolist()


def test_free_requested_is_not_dead_until_completed():
    """record_stream: the free is requested, other streams still use the memory; only FREE_COMPLETED kills."""
    fa, tr = FakeAllocator(), _tracker()
    fa.segment(2 * BS)
    x = fa.alloc(2 * BS)
    fa.free(x, deferred=True)
    d = _feed(tr, fa)
    assert not d.blocks.size and not tr.dead_mask(np.array(_blocks(x, 2 * BS))).any()
    assert tr.stats()["pending_frees"] == 1
    for _ in range(50):  # much later: other memory churns, x's free is still pending
        fa.segment(BS)
        y = fa.alloc(100)
        fa.free(y)
        _feed(tr, fa)
        assert not tr.dead_mask(np.array(_blocks(x, 2 * BS))).any()
    fa.complete(x)
    d = _feed(tr, fa)
    assert sorted(set(d.blocks.tolist()) & set(_blocks(x, 2 * BS))) == _blocks(x, 2 * BS)
    assert tr.stats()["pending_frees"] == 0


def test_block_split_between_dead_and_live_allocation():
    fa, tr = FakeAllocator(), _tracker()
    base = fa.segment(BS)
    a = fa.alloc(1024)
    b = fa.alloc(2048)
    fa.free(a)
    d = _feed(tr, fa)
    assert not d.blocks.size and tr.live_blocks().tolist() == [base // BS]
    fa.free(b)
    d = _feed(tr, fa)
    assert d.blocks.tolist() == [base // BS]


def test_reuse_before_the_discard_was_issued_invalidates_it():
    """A death is a ticket (block, seq): an ALLOC that reuses any byte before the discard is ordered voids it,
    and a later death of the same block is a new ticket."""
    fa, tr = FakeAllocator(), _tracker()
    base = fa.segment(2 * BS)
    x = fa.alloc(2 * BS)
    fa.free(x)
    d = _feed(tr, fa)
    blocks, seqs = d.blocks, d.seqs
    assert blocks.tolist() == [base // BS, base // BS + 1] and tr.still_dead(blocks, seqs).all()
    y = fa.alloc(512)  # the allocator hands part of the first block out again
    _feed(tr, fa)
    ok = tr.still_dead(blocks, seqs)
    assert ok.tolist() == [False, True]  # discard only the second block
    _assert_no_live_byte_dead(tr, fa, blocks)
    fa.free(y)
    d2 = _feed(tr, fa)
    assert d2.blocks.tolist() == [base // BS] and d2.seqs[0] > seqs[0]
    assert not tr.still_dead(blocks[:1], seqs[:1])[0]  # the old ticket stays void
    assert tr.still_dead(d2.blocks, d2.seqs).all()


def test_empty_cache_releases_the_segment_blocks():
    fa, tr = FakeAllocator(), _tracker()
    base = fa.segment(3 * BS)
    x = fa.alloc(3 * BS - 100)
    fa.free(x)
    d = _feed(tr, fa)
    assert d.blocks.size == 3
    freed = fa.empty_cache()
    d = _feed(tr, fa)
    assert freed == [base] and sorted(d.released.tolist()) == _blocks(base, 3 * BS) and not d.blocks.size
    assert not tr.dead_mask(np.array(_blocks(base, 3 * BS))).any()  # gone: nothing to discard
    # the driver hands the same addresses out again
    fa.segment(3 * BS, base=base)
    y = fa.alloc(BS)
    d = _feed(tr, fa)
    assert not d.blocks.size and tr.live_blocks().tolist() == [base // BS]
    _assert_no_live_byte_dead(tr, fa, _blocks(base, 3 * BS))


def test_segment_free_drops_allocations_whose_free_was_lost():
    """SEGMENT_FREE is authoritative: allocations the books still hold there lost their free in a gap."""
    fa, tr = FakeAllocator(), _tracker()
    base = fa.segment(2 * BS)
    x = fa.alloc(BS)
    _feed(tr, fa)
    fa.free(x)
    _feed(tr, fa, drop={0, 1})  # FREE_REQUESTED and FREE_COMPLETED lost
    assert tr.unknown == "allocator event ring overflowed"
    fa.empty_cache()
    d = _feed(tr, fa)
    assert sorted(d.released.tolist()) == [base // BS] and tr.stats()["purged_by_segment_free"] == 1
    assert tr.live_blocks().size == 0


def test_ring_gap_keeps_everything_live_until_a_snapshot():
    fa, tr = FakeAllocator(), _tracker()
    seg = fa.segment(4 * BS)
    kept = fa.alloc(BS)  # lives on
    a = fa.alloc(BS)
    _feed(tr, fa)
    lost = fa.alloc(BS)  # its ALLOC is dropped by the ring: the tracker never learns of it...
    fa.free(a)
    _feed(tr, fa, drop={0})
    assert tr.unknown is not None
    b = fa.alloc(BS)
    fa.free(b)
    d = _feed(tr, fa)
    assert not d.blocks.size and not tr.dead_mask(np.arange(0, 1 << 12)).any()
    assert not tr.quiescent().blocks.size and tr.unknown is not None  # no snapshot: still unknown
    d = tr.quiescent(fa.snapshot)
    assert tr.unknown is None and tr.resyncs == 1
    dead = set(d.blocks.tolist())
    assert lost // BS not in dead and kept // BS not in dead  # ...but the snapshot knows it is live
    # every other block of the segment, once (what each did in the gap is not known)
    assert dead == set(_blocks(seg, 4 * BS)) - {lost // BS, kept // BS}
    _assert_no_live_byte_dead(tr, fa, range(fa.next_base // BS + 1))
    fa.free(lost)  # after the rebuild the books know it
    d = _feed(tr, fa)
    assert d.blocks.tolist() == [lost // BS]


def test_not_attached_from_the_start_knows_nothing_until_a_snapshot():
    fa = FakeAllocator()
    fa.segment(2 * BS)
    params = fa.alloc(BS)  # allocated before the tracker attached: never seen
    fa.deliver()
    tr = _tracker(complete_from_start=False)
    x = fa.alloc(BS)
    fa.free(x)
    assert not _feed(tr, fa).blocks.size and tr.unknown == "not attached before the first allocation"
    d = tr.quiescent(lambda: snapshot_events(fa.snapshot(), 0))
    assert d.blocks.tolist() == [x // BS] and params // BS in tr.live_blocks().tolist()


def test_a_free_of_an_unseen_allocation_makes_the_books_incomplete():
    fa = FakeAllocator()
    fa.segment(2 * BS)
    old = fa.alloc(BS)
    fa.deliver()
    tr = _tracker()  # wrongly claims it saw everything
    fa.free(old)
    _feed(tr, fa)
    assert tr.unknown == "a free of an allocation never seen allocated" and tr.stats()["unknown_frees"] == 1


def test_private_pools_and_expandable_segments_are_never_dead():
    """CUDA graph / MemPool memory and driver-mapped expandable segments are not the allocator's managed
    pool: tracked, never discardable."""
    fa, tr = FakeAllocator(), _tracker()
    g = fa.segment(2 * BS, private=True)
    e = fa.segment(2 * BS, expandable=True)
    for seg in (g, e):
        x = fa.alloc(2 * BS, seg=seg)
        fa.free(x)
    d = _feed(tr, fa)
    assert not d.blocks.size
    s = tr.stats()
    assert s["private_pool_events"] == 4 and s["expandable_events"] == 1
    assert set(tr.live_blocks().tolist()) == set(_blocks(g, 2 * BS)) | set(_blocks(e, 2 * BS))
    fa.release(e)
    d = _feed(tr, fa)
    assert set(d.released.tolist()) == set(_blocks(e, 2 * BS))


def test_no_change_actions_unknown_action_and_other_devices():
    tr = _tracker()
    ev = np.zeros(6, dtype=EVENT_DTYPE)
    ev["seq"] = [1, 2, 3, 4, 5, 6]
    ev["action"] = [ALLOC, ALLOC, OOM, SNAPSHOT, ANNOTATE, UNKNOWN]
    ev["addr"], ev["size"] = 1 << 20, 512
    ev["addr"][2], ev["size"][2] = 80 << 30, 1 << 40  # OOM: the address is the free byte count
    ev["device"] = [1, 1, 0, 0, 0, 0]
    assert not tr.feed(ev).blocks.size
    s = tr.stats()
    assert s["other_device_events"] == 2 and s["no_change_events"] == 3 and s["unknown_actions"] == 1
    assert s["blocks_seen"] == 0 and tr.live_blocks().size == 0
    assert tr.unknown == "an allocator action this build does not know"


def test_bad_input_names_the_problem():
    tr = _tracker()
    with pytest.raises(ValueError, match="EVENT_DTYPE"):
        tr.feed(np.zeros(3, dtype=np.int64))
    ev = np.zeros(3, dtype=EVENT_DTYPE)
    ev["seq"] = [5, 7, 6]
    with pytest.raises(ValueError, match="event 2 has seq 6, not after 7"):
        tr.feed(ev)
    ev["seq"] = [5, 6, 7]
    tr.feed(ev)
    with pytest.raises(ValueError, match="event 0 has seq 7, not after 7"):
        tr.feed(ev[2:])
    with pytest.raises(ValueError, match="power of two"):
        Liveness(block_size=3000)


# ------------------------------------------------------------------------------------------- property test

OPS = st.lists(st.tuples(st.sampled_from(["seg", "alloc", "alloc", "alloc", "free", "free", "defer", "complete",
                                          "empty", "deliver", "drop", "quiescent", "discard"]),
                         st.integers(0, 10**6)), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.booleans())
def test_random_streams_never_call_a_live_byte_dead(ops, late_attach):
    """Over random allocator histories (unaligned segments of 1-3 blocks, private and expandable ones, splits,
    deferred frees, empty_cache, ring drops, late attach, quiescent snapshots, discards issued later):
    - safety: every block the tracker calls dead is dead in the byte-level truth; a discard ticket still valid
      when issued covers no live byte;
    - completeness, with complete knowledge: every block that held data since it last left the allocator, and
      is dead in the truth, is called dead."""
    fa = FakeAllocator()
    held: set[int] = set()  # blocks that held an allocation since their segment last went back
    if late_attach:
        fa.segment(2 * BS + 512)
        fa.alloc(3000)
        fa.deliver()
    tr = _tracker(complete_from_start=not late_attach)
    tickets: list[tuple[np.ndarray, np.ndarray]] = []
    for op, r in ops:
        if op == "seg":
            fa.segment(BS * (1 + r % 3) + 512 * (r % 2), base=fa.next_base + 512 * (r % 5),
                       private=r % 7 == 0, expandable=r % 11 == 0)
        elif op == "alloc" and fa.segments:
            a = fa.alloc(1 + r % (2 * BS))
            if a is not None:
                held.update(_blocks(a, fa.allocs[a]["size"]))
        elif op in ("free", "defer") and fa.allocs:
            a = sorted(fa.allocs)[r % len(fa.allocs)]
            if not fa.allocs[a]["pending"]:
                fa.free(a, deferred=op == "defer")
        elif op == "complete":
            pend = sorted(a for a, x in fa.allocs.items() if x["pending"])
            if pend:
                fa.complete(pend[r % len(pend)])
        elif op == "empty":
            sizes = {b: g["size"] for b, g in fa.segments.items()}
            for base in fa.empty_cache():  # blocks wholly inside memory that left the allocator start over
                held -= {b for b in held if base <= b * BS and (b + 1) * BS <= base + sizes[base]}
        elif op in ("deliver", "drop"):
            drop = {i for i in range(len(fa.queue)) if (r >> (i % 20)) & 1} if op == "drop" else None
            d = _feed(tr, fa, drop)
            if d.blocks.size:
                tickets.append((d.blocks, d.seqs))
        elif op == "quiescent":
            _feed(tr, fa)
            d = tr.quiescent(fa.snapshot)
            if d.blocks.size:
                tickets.append((d.blocks, d.seqs))
        elif op == "discard" and tickets:
            _feed(tr, fa)  # the planner has fed everything before it orders a discard
            blocks, seqs = tickets.pop(r % len(tickets))
            live, ok = fa.live_bytes(), fa.discardable_bytes()
            for b in blocks[tr.still_dead(blocks, seqs)].tolist():
                assert fa.dead(b, BS, live, ok), f"a discard of block {b} would lose live data"
        if fa.queue:
            continue
        # everything emitted has been delivered: the tracker is up to date; check it against the truth
        live, ok = fa.live_bytes(), fa.discardable_bytes()
        seen = list(range((1 << 20) // BS, fa.next_base // BS + 2))
        mask = tr.dead_mask(np.asarray(seen, dtype=np.int64))
        for b, d in zip(seen, mask.tolist()):
            truth = fa.dead(b, BS, live, ok)
            assert not d or truth, f"block {b} called dead but is not (after {op})"
            if tr.unknown is None and truth and b in held:
                assert d, f"block {b} held data, holds none now, and is not called dead (after {op})"
