"""The cuda backend's logic on the CPU: the CUDA calls are replaced at the boundary (the Mover and the shim,
the caching allocator's event source), everything else is the real ``CudaBackend``: address -> block ids, ranges
clipped to managed allocations, the order of moves (discard, evict, advise, prefetch), budget evictions that
spare queued launches, hook calls, deaths from the allocator's events (the real ``AllocatorFeed`` and
``Liveness``). The real calls are covered by tests/gpu."""

import numpy as np
from alloc_model import FakeAllocator

from uvmprefetch.gpus import PROFILES
from uvmprefetch.policy.base import Advice, Decision, LaunchInfo, Policy, PolicyContext
from uvmprefetch.runtime.cuda_backend import BLOCK_SIZE, CudaBackend, HostTime, profile_for
from uvmprefetch.runtime.observe import GpuProgress
from uvmprefetch.runtime.residency import Residency

BS = BLOCK_SIZE
BASE = 0x7F0000000000  # 2 MiB aligned, like cudaMallocManaged's large allocations


class FakeShim:
    def __init__(self, segments):
        self.segs = segments

    def stats(self):
        return {"n_alloc": len(self.segs), "n_free": 0, "managed_bytes": sum(s for _, s in self.segs),
                "peak_managed_bytes": 0, "limit_bytes": 0}

    def segments(self):
        return sorted(self.segs)

    def read_launches(self):
        return []


class FakeMover:
    """The Mover's interface, logging each call; marks are numbered as the real one numbers them (1, 2, ...
    for the moves' and the discards' apart), and the ``after`` a call was given is logged last."""

    batch = can_discard = True
    calls = 0

    def __init__(self):
        self.log = []
        self.n_moves = self.n_discards = 0

    before_check = None  # called where the real mover has gated the compute stream, before ``check``

    def discard(self, items, after=0, check=None):
        """As ``Mover.discard``: ``check()`` decides, then the kept blocks are discarded, the refused evicted."""
        if not items:
            return 0
        if self.before_check is not None:
            self.before_check()
        keep = check() if check is not None else [True] * len(items)
        self.n_discards += 1
        kept = [r for it, k in zip(items, keep) if k for r in it]
        refused = [r for it, k in zip(items, keep) if not k for r in it]
        if kept:
            self.log.append(("discard", kept, after))
        if refused:
            self.log.append(("to_host", refused, 0))
        return self.n_discards

    def prefetch(self, ranges, to_device, after=0):
        if ranges:
            self.log.append(("to_gpu" if to_device else "to_host", ranges, after))

    def populate(self, ranges, after=0):
        """As ``Mover.populate``: a prefetch to the GPU on the discard stream, numbered as a discard."""
        if not ranges:
            return 0
        self.n_discards += 1
        self.log.append(("populate", ranges, after))
        return self.n_discards

    def mark_moves(self):
        self.n_moves += 1
        self.log.append(("mark", self.n_moves))
        return self.n_moves

    def advise(self, ranges, advice):
        self.log.append(("advise", ranges, advice))

    def synchronize(self):
        pass


class Event:
    done = -1
    n = 0

    def record(self):
        Event.n += 1
        self.at = Event.n - 1

    def query(self):
        return self.at <= Event.done


class Scripted(Policy):
    """Returns the Decisions it is given, records the hooks it gets."""

    name = "scripted"

    def __init__(self, decisions):
        super().__init__()
        self.decisions = list(decisions)
        self.events = []

    def on_launch(self, info, state):
        self.events.append(("launch", info.index))
        return self.decisions.pop(0) if self.decisions else None

    def on_fault(self, info, blocks):
        self.events.append(("fault", info.index, blocks.tolist()))

    def on_evict(self, blocks):
        self.events.append(("evict", sorted(blocks.tolist())))

    def on_free(self, blocks):
        self.events.append(("free", blocks.tolist()))


class FakeTracker:
    """The allocator tracker's entry points (``ObserverLib.tracker_*``) over a fake caching allocator: the event
    source, the one fake here (there is no CUDA caching allocator on a CPU). ``drop`` drops the next delivery's
    events at those indices (a ring overflow)."""

    def __init__(self, alloc):
        self.a, self.dropped, self.drop = alloc, 0, set()

    def tracker_dropped(self):
        return self.dropped

    def drain_cuda_allocs(self):
        ev, n = self.a.deliver(self.drop)
        self.drop = set()
        self.dropped += n
        return ev

    def tracker_quiesce(self, timeout_us=0):
        return 0

    def tracker_next_seq(self):
        self.a.seq += 1
        return self.a.seq

    def tracker_built_for(self):
        return "fake"


def backend(policy, cap_blocks, segments, discard=True, batch=1, max_blocks=256):
    """A ``CudaBackend`` without CUDA; with ``discard`` (UVMPREFETCH_DISCARD=1 unless told) its deaths come from a
    fake caching allocator (``be.feed.lib.a``) through the real ``AllocatorFeed``; ``batch``: discarding launches
    per gate closure (UVMPREFETCH_DISCARD_BATCH; 1 unless told: each launch's discards go at once)."""
    from uvmprefetch.runtime.alloc_feed import AllocatorFeed
    be = object.__new__(CudaBackend)  # no CUDA: fill in what __init__ would have found
    be.block_size, be.max_blocks, be.device = BS, max_blocks, 0
    be.feed = AllocatorFeed(FakeTracker(FakeAllocator()), 0, BS, complete_from_start=True) if discard else None
    be.discard_on, be.audit, be.liveness_why = discard, False, "off"
    be._init_discards()
    be.discard_batch = batch
    be.res = Residency(cap_blocks, be.max_blocks, BS)
    be.res.n_ids = 0  # as __init__: block_ids numbers blocks densely and keeps this up to date
    be.mover, be.shim, be.policy = FakeMover(), FakeShim(segments), policy
    be._ids, be._addr = {}, np.zeros(be.max_blocks, dtype=np.int64)
    be._segments, be._seg_starts, be._seg_version = [], [], -1
    be._checked_swap = True
    be._capturing, be.captured_launches = (lambda: False), 0
    be._t0 = 0.0
    be.host = HostTime()
    Event.done, Event.n = -1, 0
    be.progress = GpuProgress(be.max_blocks, event_factory=Event)
    policy.on_start(PolicyContext(block_size=BS, capacity_blocks=cap_blocks, max_blocks=be.max_blocks,
                                  gpu=PROFILES["h100-pcie"], live=True))
    return be


def blocks_allocated(be, n, base=BASE):
    """The fake allocator holds one segment of ``n`` blocks at ``base`` and one allocation per block; returns
    their addresses."""
    fa = be.feed.lib.a
    fa.segment(n * BS, base=base)
    return [fa.alloc(BS) for _ in range(n)]


def die(be, *addrs):
    """The allocations at ``addrs`` are freed; the planner drains the events and reaches the next op."""
    for a in addrs:
        be.feed.lib.a.free(a)
    be.feed.take_events()
    be.deaths_before(1 << 62)


def info(i, be, start, length):
    b = be.block_ids(start, length)
    return LaunchInfo(index=i, exec_id=i, name=0, phase=1, iteration=0, duration=0.0, blocks=b, write_blocks=b)


def test_ranges_clipped_to_managed_allocations_and_merged():
    # two allocations: 3 MiB at BASE and 4 MiB at BASE + 4 MiB (a 1 MiB hole between them)
    be = backend(Scripted([]), 8, [(BASE, 3 << 20), (BASE + (4 << 20), 4 << 20)])
    ids = be.block_ids(BASE, 8 << 20)
    assert ids.tolist() == [0, 1, 2, 3]
    assert be.ranges(ids) == [(BASE, 3 << 20), (BASE + (4 << 20), 4 << 20)]  # the hole is never touched
    assert be.ranges(ids[:1]) == [(BASE, BS)]
    assert be.ranges(np.array([3, 2])) == [(BASE + (4 << 20), 4 << 20)]  # adjacent blocks merge


def test_ids_in_use_follow_first_sight():
    be = backend(Scripted([]), 8, [(BASE, 8 * BS)])
    assert be.res.n_ids == 0
    be.block_ids(BASE + 2 * BS, 3 * BS)
    assert be.res.n_ids == 3
    be.block_ids(BASE, BS)
    be.block_ids(BASE + 2 * BS, BS)  # seen before: no new id
    assert be.res.n_ids == 4


def test_ranges_never_span_two_allocations():
    # GIVEN two allocations that touch (the second starts where the first ends), THEN their blocks give two
    # ranges, one per allocation: the driver rejects a range across allocations (cudaErrorInvalidValue, H100)
    be = backend(Scripted([]), 8, [(BASE, 2 * BS), (BASE + 2 * BS, 2 * BS)])
    ids = be.block_ids(BASE, 4 * BS)
    assert be.ranges(ids) == [(BASE, 2 * BS), (BASE + 2 * BS, 2 * BS)]
    assert be.ranges(ids, keep_order=True) == [(BASE, 2 * BS), (BASE + 2 * BS, 2 * BS)]
    # an allocation ending mid-block and the next one starting in that block: one range each
    be = backend(Scripted([]), 8, [(BASE, 3 << 20), (BASE + (3 << 20), 5 << 20)])
    ids = be.block_ids(BASE, 8 << 20)
    assert be.ranges(ids) == [(BASE, 3 << 20), (BASE + (3 << 20), 5 << 20)]


def test_moves_in_contract_order_and_budget_spares_queued_launches():
    seg = [(BASE, 16 * BS)]
    dec_later = Decision(prefetch=np.array([5, 6]), evict=np.array([0]), discard=np.array([1]),
                         advise=((np.array([2]), Advice.READ_MOSTLY),))
    pol = Scripted([None, None, None, None, dec_later])
    be = backend(pol, 4, seg)
    addrs = blocks_allocated(be, 16)
    assert be.block_ids(BASE, 8 * BS).tolist() == list(range(8))  # ids in first-sight order = address order here
    for i in range(4):  # launches 0..3 touch blocks 0..3; the GPU finishes none of them
        be.launch(info(i, be, BASE + i * BS, BS))
    Event.done = 2  # the GPU has finished launches 0..2; launch 3 is still queued
    die(be, addrs[1])  # block 1's tensor died (the allocator says so): it may be discarded
    be.launch(info(4, be, BASE + 4 * BS, BS))
    kinds = [e[0] for e in be.mover.log if e[0] != "mark"]
    assert kinds == ["discard", "to_host", "advise", "to_gpu"]  # discard, evict, advise, prefetch
    assert be.mover.log[0][1] == [(BASE + BS, BS)]
    evicted = be.mover.log[1][1]
    # the policy's eviction (block 0) + one budget victim: block 2 (done on the GPU), not 3 (launch 3 queued)
    assert evicted == [(BASE, BS), (BASE + 2 * BS, BS)]
    assert ("evict", [2]) in pol.events  # budget evictions are reported like the driver's
    assert be.mover.log[3][1] == [(BASE + 5 * BS, 2 * BS)]  # prefetches merged, in order
    assert be.mover.log[4] == ("mark", 1)  # (with discards on: an event after the launch's moves)
    assert be.res.n_resident <= 4
    assert ("fault", 4, [4]) in pol.events  # block 4 was neither resident nor prefetched


def test_discards_are_evictions_unless_on_and_the_allocator_saw_the_block_die():
    seg = [(BASE, 16 * BS)]

    def run(discard, free_first, touch_again=False, reuse=False):
        # GIVEN blocks 0..2 used by launches 0..2 (finished on the GPU), then a policy that discards block 1
        pol = Scripted([None, None, None, None, Decision(discard=np.array([1]))])
        be = backend(pol, 8, seg, discard=discard)
        addrs = blocks_allocated(be, 16) if discard else None
        for i in range(3):
            be.launch(info(i, be, BASE + i * BS, BS))
        Event.done = 10
        if free_first:
            if discard:
                die(be, addrs[1])
            else:
                be.free(np.array([BASE // BS + 1]))  # (the Python observer's finalizers)
        if reuse:
            be.feed.lib.a.alloc(BS)  # the allocator hands block 1 out again (first fit) ...
            be.feed.take_events()  # ... and the planner drains it, but no launch has touched it yet
        # (launch 3 touches block 1 again when told: the allocator handed its memory to a new tensor)
        be.launch(info(3, be, BASE + (1 if touch_again else 3) * BS, BS))
        be.launch(info(4, be, BASE + 4 * BS, BS))
        return be, [(k, r) for k, r, *_ in be.mover.log if k != "mark"]

    # WHEN discards are off (the default): the discard is issued as an eviction (the data kept)
    be, log = run(discard=False, free_first=True)
    assert log == [("to_host", [(BASE + BS, BS)])] and be.discards_as_evictions == 1
    assert not be.res.resident[1]
    # WHEN on and the allocator reported block 1 dead: it is discarded
    be, log = run(discard=True, free_first=True)
    assert log == [("discard", [(BASE + BS, BS)])] and sum(be.refused.values()) == 0 and be.discarded_blocks == 1
    # WHEN on but the allocator never freed block 1 (a policy's wrong dead flag): evicted, never discarded
    be, log = run(discard=True, free_first=False)
    assert log == [("to_host", [(BASE + BS, BS)])] and be.refused["not_dead"] == 1
    # WHEN on, block 1 died and a launch used it again before the decision: evicted
    be, log = run(discard=True, free_first=True, touch_again=True)
    assert ("discard", [(BASE + BS, BS)]) not in log and be.refused["not_dead"] == 1
    # WHEN on, block 1 died and the allocator handed it out again before the decision (no launch saw it yet):
    # the check right before the discard refuses it
    be, log = run(discard=True, free_first=True, reuse=True)
    assert log == [("to_host", [(BASE + BS, BS)])] and be.refused["reused_before_issue"] == 1


def test_protection_mask_is_built_only_when_something_leaves():
    # GIVEN a backend with room to spare, whose GPU finishes every launch at once
    pol = Scripted([None, None, None, Decision(evict=np.array([0]))])
    be = backend(pol, 8, [(BASE, 16 * BS)])
    built = []
    real = be._protected_mask
    be._protected_mask = lambda running: built.append(1) or real(running)
    Event.done = 100
    # WHEN launches need no eviction, discard or budget victim
    for i in range(3):
        be.launch(info(i, be, BASE + i * BS, BS))
    # THEN no mask is built (a pass over every block), yet the GPU's progress is still polled
    assert not built and be.progress.depth() <= 1
    # AND a Decision that evicts builds it once
    be.launch(info(3, be, BASE + 3 * BS, BS))
    assert len(built) == 1 and ("to_host", [(BASE, BS)]) in [(k, r) for k, r, *_ in be.mover.log]


def test_host_time_charges_a_blocking_call_to_its_stage():
    """The launch hook runs on the training thread: a CUDA call that blocks (here an eviction that sleeps)
    must show up under its own stage of the report's ``host_time``, not be spread over the others."""
    import time

    class SlowEvict(FakeMover):
        def prefetch(self, ranges, to_device, after=0):
            super().prefetch(ranges, to_device, after)
            if ranges and not to_device:
                time.sleep(0.03)

    pol = Scripted([None, None, Decision(evict=np.array([0]))])
    be = backend(pol, 4, [(BASE, 16 * BS)])
    be.mover = SlowEvict()
    for i in range(3):
        Event.done = i - 1  # launches before this one are done on the GPU: block 0 may leave at launch 2
        be.launch(info(i, be, BASE + i * BS, BS))
    assert ("to_host", [(BASE, BS)], 0) in be.mover.log
    r = be.host.result()
    assert r["launches"] == 3
    assert r["total_s"]["evict"] >= 0.03 and r["max_ms"]["evict"] >= 30
    others = sum(v for k, v in r["total_s"].items() if k != "evict")
    assert others < 0.03 and abs(r["hook_s"] - (others + r["total_s"]["evict"])) < 1e-9


def test_free_reaches_policy_as_dense_ids():
    # GIVEN the session's tracker numbering freed blocks address // block_size (real addresses: ~6.7e7),
    # THEN the backend maps them to its dense ids before the books and the policy see them; a block no
    # launch touched has no id and is skipped. (On the H100 raw numbers reached the books: IndexError.)
    from uvmprefetch.runtime.observe import StorageTracker
    pol = Scripted([])
    be = backend(pol, 4, [(BASE, 4 * BS)], discard=False)  # (deaths from the Python observer's tracker)
    assert be.block_ids(BASE + 2 * BS, 2 * BS).tolist() == [0, 1]  # first seen: blocks 2 and 3 of the segment
    raw = list(StorageTracker(BS, virtual=False).blocks_of(BASE + BS, 3 * BS))  # blocks 1, 2, 3 of the segment
    assert raw[0] == BASE // BS + 1
    be.free(np.array(raw))
    assert ("free", [0, 1]) in pol.events
    # AND the allocator's deaths (block numbers too) reach it the same way; the tracker's are then ignored
    pol = Scripted([])
    be = backend(pol, 4, [(BASE, 4 * BS)])
    addrs = blocks_allocated(be, 4)
    be.block_ids(BASE + 2 * BS, 2 * BS)
    be.free(np.array(raw))
    assert pol.events == []
    die(be, addrs[1], addrs[2], addrs[3])
    assert pol.events == [("free", [0, 1])] and be.ticket[[0, 1]].all()


def test_profile_for_device_names():
    assert profile_for("NVIDIA H100 80GB HBM3", 80 << 30).name.startswith("h100")
    assert profile_for("NVIDIA H200", 141 << 30).memory_bytes == 141 << 30
    assert profile_for("Tesla T4", 16 << 30).name.startswith("generic")


def test_prefetch_ranges_keep_the_policy_order():
    be = backend(Scripted([]), 8, [(BASE, 8 * BS)])
    be.block_ids(BASE, 8 * BS)
    assert be.ranges(np.array([6, 2, 3]), keep_order=True) == [(BASE + 6 * BS, BS), (BASE + 2 * BS, 2 * BS)]
    assert be.ranges(np.array([6, 2, 3])) == [(BASE + 2 * BS, 2 * BS), (BASE + 6 * BS, BS)]


class FakeCudart:
    """Stands in for cuda.bindings.runtime: records calls; argument order is checked against the CUDA 13 C
    signatures quoted in cuda_backend.py."""

    class cudaError_t:
        cudaSuccess = 0
        cudaErrorInvalidValue = 1

    class cudaMemLocationType:
        cudaMemLocationTypeDevice = 1
        cudaMemLocationTypeHost = 2

    class cudaMemoryAdvise:
        cudaMemAdviseSetReadMostly = 1
        cudaMemAdviseUnsetReadMostly = 2
        cudaMemAdviseSetPreferredLocation = 3
        cudaMemAdviseUnsetPreferredLocation = 4
        cudaMemAdviseSetAccessedBy = 5
        cudaMemAdviseUnsetAccessedBy = 6

    class cudaMemLocation:
        type = 0
        id = 0

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def _ret(self, name, *args):
        self.calls.append((name, args))
        return (1 if name == self.fail else 0,)

    def cudaMemPrefetchAsync(self, ptr, count, location, flags, stream):
        return self._ret("prefetch", ptr, count, location.type, location.id, flags, stream)

    def cudaMemPrefetchBatchAsync(self, dptrs, sizes, count, locs, loc_idxs, num_locs, flags, stream):
        assert len(dptrs) == len(sizes) == count and len(locs) == len(loc_idxs) == num_locs
        return self._ret("prefetch_batch", tuple(dptrs), tuple(sizes), locs[0].type, flags, stream)

    def cudaMemDiscardBatchAsync(self, dptrs, sizes, count, flags, stream):
        assert len(dptrs) == len(sizes) == count
        return self._ret("discard_batch", tuple(dptrs), tuple(sizes), flags, stream)

    def cudaMemAdvise(self, ptr, count, advice, location):
        return self._ret("advise", ptr, count, advice, location.type)

    def cudaSetDevice(self, dev):
        return self._ret("set_device", dev)

    def cudaGetErrorName(self, err):
        return (0, b"cudaErrorInvalidValue")


class FakeStream:
    def __init__(self, handle, log):
        self.cuda_stream, self.log = handle, log

    def wait_stream(self, other):
        self.log.append(("wait", self.cuda_stream, other.cuda_stream))

    def wait_event(self, ev):
        self.log.append(("wait_event", self.cuda_stream, ev.name))

    def synchronize(self):
        pass


class FakeCudaEvent:
    """torch.cuda.Event at the boundary: logs its record; ``done`` says whether the GPU passed it (an event
    never recorded reports itself complete, as CUDA's does)."""

    def __init__(self, log, name):
        self.log, self.name, self.recorded, self.done = log, name, False, False

    def record(self, stream):
        self.recorded = True
        self.log.append(("record", stream.cuda_stream, self.name))

    def query(self):
        return not self.recorded or self.done


class FakeGate:
    """The discards' gate at the driver boundary (cuStreamWaitValue32 / cuStreamWriteValue32 / a host write)."""

    def __init__(self, log):
        self.log, self.k = log, 0

    def close(self, stream):
        self.k += 1
        self.log.append(("gate", stream, self.k))
        return self.k

    def open_after(self, stream, k):
        self.log.append(("open", stream, k))

    def open_now(self, k):
        self.log.append(("open_host", k))


def mover(batch, fail=None):
    import types

    from uvmprefetch.runtime.cuda_backend import Mover, StreamMarks
    m = object.__new__(Mover)
    m.rt, m.device, m.calls, m.thread = FakeCudart(fail), 0, 0, None
    log = []
    m.stream, m.discard_stream = FakeStream(11, log), FakeStream(12, log)
    compute = FakeStream(0, log)
    m.events = []

    def event():  # named by creation order: ev0, ev1, ...
        m.events.append(FakeCudaEvent(log, f"ev{len(m.events)}"))
        return m.events[-1]
    m.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=lambda dev: compute, Event=event))
    m.moves, m.discards = StreamMarks(), StreamMarks()
    m.dev_loc = m._loc(m.rt.cudaMemLocationType.cudaMemLocationTypeDevice, 0)
    m.host_loc = m._loc(m.rt.cudaMemLocationType.cudaMemLocationTypeHost, 0)
    m.batch = m.can_discard = batch
    m.gate_word, m.gate = FakeGate(log), None
    return m, log


def test_mover_calls_match_the_cuda13_signatures():
    m, log = mover(batch=True)
    m.prefetch([(BASE, BS), (BASE + 4 * BS, 2 * BS)], to_device=True)
    m.prefetch([(BASE, BS)], to_device=False)
    m.discard([[(BASE + BS, BS)]])
    m.advise([(BASE, BS)], Advice.PREFER_HOST)
    names = [c[0] for c in m.rt.calls]
    assert names == ["prefetch_batch", "prefetch_batch", "discard_batch", "advise", "advise"]
    assert m.rt.calls[0][1] == ((BASE, BASE + 4 * BS), (BS, 2 * BS), 1, 0, 11)  # device location, prefetch stream
    assert m.rt.calls[1][1][2] == 2  # host location for an eviction
    assert m.rt.calls[2][1][3] == 12  # discards on their own stream ...
    # ... after the kernels queued so far (event ev1 on the compute stream, 0), which is gated first: the later
    # kernels wait until the discard stream opens the gate, after the discard; no move was marked, none waits
    assert log == [("record", 0, "ev1"), ("gate", 0, 1), ("wait_event", 12, "ev1"), ("record", 12, "ev0"),
                   ("open", 12, 1)]
    assert m.rt.calls[3][1][2:] == (3, 2) and m.rt.calls[4][1][2:] == (5, 1)  # preferred=host, accessed_by=gpu
    s, _ = mover(batch=False)
    s.prefetch([(BASE, BS), (BASE + 2 * BS, BS)], to_device=True)
    s.discard([[(BASE, BS)]])  # no batch API: no discards
    assert [c[0] for c in s.rt.calls] == ["prefetch", "prefetch"]
    assert s.rt.calls[0][1] == (BASE, BS, 1, 0, 0, 11)


def test_mover_errors_raise_cuda_call_error():
    import pytest

    from uvmprefetch.runtime.cuda_backend import CudaCallError
    m, _ = mover(batch=True, fail="prefetch_batch")
    with pytest.raises(CudaCallError, match="cudaMemPrefetchBatchAsync to GPU failed: cudaErrorInvalidValue"):
        m.prefetch([(BASE, BS)], to_device=True)


def test_discard_waits_for_the_moves_of_its_blocks_only():
    """CUDA makes a prefetch of a range during its discard undefined behaviour. The discard must wait for the
    moves of its own blocks already issued, and a later move of them must wait for it; but a discard must not
    make the kernels wait for every queued prefetch (on the H100 that kept a run at 1.5x from finishing)."""
    m, log = mover(batch=True)
    a, b = [(BASE, BS)], [(BASE + BS, BS)]
    # GIVEN a move of A, then of B, each followed by a move mark
    m.prefetch(a, to_device=True)
    ma = m.mark_moves()
    m.prefetch(b, to_device=True)
    mb = m.mark_moves()
    assert (ma, mb) == (1, 2) and log == [("record", 11, "ev0"), ("record", 11, "ev1")]
    # WHEN A is discarded after its move (mark ma)
    del log[:]
    d = m.discard([a], after=ma)
    # THEN it waits for the queued kernels (ev3 on the compute stream, then the gate) and for A's mark (not B's,
    # not the whole move stream); its own mark ev2 is recorded before the gate opens
    assert d == 1
    assert log == [("record", 0, "ev3"), ("gate", 0, 1), ("wait_event", 12, "ev3"), ("wait_event", 12, "ev0"),
                   ("record", 12, "ev2"), ("open", 12, 1)]
    # AND a later move of B is not held by the discard; a later move of A waits for it
    del log[:]
    m.prefetch(b, to_device=False)
    assert log == []
    m.prefetch(a, to_device=True, after=d)
    assert log == [("wait_event", 11, "ev2")] and m.rt.calls[-1][1][0] == (BASE,)
    # WHEN the GPU has passed A's move mark and the discard: neither is waited for any more
    m.events[0].done = m.events[2].done = True
    del log[:]
    m.discard([a], after=ma)
    m.prefetch(a, to_device=True, after=d)
    assert log == [("record", 0, "ev5"), ("gate", 0, 2), ("wait_event", 12, "ev5"), ("record", 12, "ev4"),
                   ("open", 12, 2)]
    assert len(m.moves.q) == 1 and len(m.discards.q) == 1  # completed marks are dropped, pending ones kept


def test_discard_checks_after_the_gate_and_evicts_what_it_refuses():
    """The check that decides runs after the compute stream is gated (an allocation made before the gate may
    belong to a kernel queued before it); refused blocks are evicted instead; a failed call still opens the
    gate (from the host, once the discard stream is idle): the kernels never wait forever."""
    import pytest

    from uvmprefetch.runtime.cuda_backend import CudaCallError
    m, log = mover(batch=True)
    a, b = [(BASE, BS)], [(BASE + 4 * BS, BS), (BASE + 6 * BS, 4096)]
    seen = []

    def check():
        seen.append(list(log))  # what had been issued when the check ran
        return [False, True]
    m.discard([a, b], check=check)
    assert seen[0] == [("record", 0, "ev1"), ("gate", 0, 1)]
    assert [c[0] for c in m.rt.calls] == ["discard_batch", "prefetch_batch"]
    assert m.rt.calls[0][1][0] == (BASE + 4 * BS, BASE + 6 * BS)  # B's ranges discarded
    assert m.rt.calls[1][1][0] == (BASE,) and m.rt.calls[1][1][2] == 2  # A evicted to the host
    assert log[-1] == ("open", 12, 1)
    # WHEN the discard call fails: the error surfaces, and the gate is opened from the host
    m, log = mover(batch=True, fail="discard_batch")
    with pytest.raises(CudaCallError, match="cudaMemDiscardBatchAsync"):
        m.discard([a])
    assert log[-1] == ("open_host", 1) and m.discards.q[-1][1]  # (and the mark reads as passed)


def test_stream_marks_never_take_an_unrecorded_event_for_completed():
    """With the mover thread a move mark's event is recorded in the thread, later than it is numbered; CUDA
    reports an event never recorded as complete, so such a mark must stay pending."""
    from uvmprefetch.runtime.cuda_backend import StreamMarks
    marks, log = StreamMarks(), []
    e1, e2 = FakeCudaEvent(log, "e1"), FakeCudaEvent(log, "e2")
    entry1 = marks.add(e1, recorded=False)
    marks.add(e2)
    e2.record(FakeStream(11, log))
    e2.done = True
    assert marks.pending(1) is entry1 and marks.pending(2) is not None  # (e2 waits behind e1)
    assert marks.pending(0) is None
    e1.record(FakeStream(11, log))
    entry1[1] = True
    assert marks.pending(1) is not None  # recorded, not yet passed
    e1.done = True
    assert marks.pending(1) is None and marks.pending(2) is None and not marks.q
    # AND a run of marks the GPU keeps up with holds no events: each new mark drops those completed before it
    for i in range(100):
        ev = FakeCudaEvent(log, f"m{i}")
        ev.record(FakeStream(11, log))
        marks.add(ev)
        ev.done = True
    assert len(marks.q) == 1 and marks.n == 102 and marks.pending(102) is None


def test_discard_with_the_mover_thread_waits_until_the_move_mark_is_recorded():
    """The move mark is recorded by the mover thread after the moves queued before it; a discard that must
    wait for it drains the thread first (a wait on an unrecorded event would be a no-op: the race again)."""
    import threading
    m, log = mover(batch=True)
    m.start_thread(max_pending=64 * BS)
    gate = threading.Event()
    m.thread.submit(0, gate.wait, 5)  # holds the thread
    m.prefetch([(BASE, BS)], to_device=True)
    ma = m.mark_moves()
    threading.Timer(0.2, gate.set).start()
    d = m.discard([[(BASE, BS)]], after=ma)
    m.thread.drain()
    assert log.index(("record", 11, "ev0")) < log.index(("wait_event", 12, "ev0"))
    # AND a move of the discarded block goes through the thread, behind a wait for the discard
    m.prefetch([(BASE, BS)], to_device=True, after=d)
    m.synchronize()
    assert log[-1] == ("wait_event", 11, "ev1") and [c[0] for c in m.rt.calls][-1] == "prefetch_batch"
    m.thread.close()


def test_backend_orders_each_discard_with_the_moves_of_its_blocks():
    # GIVEN discards on, a policy that prefetches block 5 (launch 0), discards block 2, never moved (launch 2),
    # discards block 5 (launch 3), then prefetches blocks 5 and 6 (launch 4: the allocator reused block 5)
    seg = [(BASE, 16 * BS)]
    decisions = [Decision(prefetch=np.array([5])), None, Decision(discard=np.array([2])),
                 Decision(discard=np.array([5])), Decision(prefetch=np.array([5, 6]))]
    log = {}
    for on in (True, False):
        be = backend(Scripted(list(decisions)), 8, seg, discard=on)
        addrs = blocks_allocated(be, 16) if on else None
        be.block_ids(BASE, 8 * BS)
        Event.done = 100
        for i in range(5):
            if i == 2:  # their tensors died
                die(be, addrs[2], addrs[5]) if on else be.free(np.array([BASE // BS + 2, BASE // BS + 5]))
            be.launch(info(i, be, BASE + (i % 2) * BS, BS))
        log[on] = be.mover.log
    # THEN each call carries the last mark of its blocks: the discard of 5 the move of launch 0 (mark 1), the
    # prefetch of 5 the discard of launch 3 (discard mark 2); block 2 never moved
    assert log[True] == [("to_gpu", [(BASE + 5 * BS, BS)], 0), ("mark", 1),
                         ("discard", [(BASE + 2 * BS, BS)], 0),
                         ("discard", [(BASE + 5 * BS, BS)], 1),
                         ("to_gpu", [(BASE + 5 * BS, 2 * BS)], 2), ("mark", 2)]
    # AND with discards off: evictions, no marks, nothing to wait for
    assert log[False] == [("to_gpu", [(BASE + 5 * BS, BS)], 0), ("to_host", [(BASE + 5 * BS, BS)], 0),
                          ("to_gpu", [(BASE + 5 * BS, 2 * BS)], 0)]


def test_live_clock_advances_for_pacing_policies():
    pol = Scripted([])
    be = backend(pol, 8, [(BASE, 8 * BS)])
    be.block_ids(BASE, 8 * BS)
    be.launch(info(0, be, BASE, BS))
    t1 = be.res.now
    be.launch(info(1, be, BASE + BS, BS))
    assert 0 < t1 <= be.res.now  # a policy that paces against state.now sees time pass


def test_uvmprefetch_policy_prefetches_through_the_live_backend():
    # GIVEN the real default policy behind the cuda backend's books (CUDA calls faked), a loop of 3 iterations
    # of 24 launches over 24 blocks with room for 12, launches ~0.5 ms apart as on a GPU
    import time

    from uvmprefetch.policy import make_policy
    pol = make_policy("uvmprefetch")
    be = backend(pol, 12, [(BASE, 24 * BS)])
    be.block_ids(BASE, 24 * BS)
    per_iter = []
    for k in range(3):
        before = sum(len(e[1]) for e in be.mover.log if e[0] == "to_gpu")
        for i in range(24):
            b = be.block_ids(BASE + i * BS, BS)
            be.launch(LaunchInfo(index=k * 24 + i, exec_id=1000 + i, name=i, phase=1, iteration=k, duration=5e-4,
                                 blocks=b, write_blocks=b))
            Event.done = k * 24 + i  # the GPU keeps up
            time.sleep(5e-4)
        pol.on_iteration(k)
        per_iter.append(sum(len(e[1]) for e in be.mover.log if e[0] == "to_gpu") - before)
    # THEN once it has seen the loop it prefetches ahead, and the books never exceed the budget
    assert per_iter[2] > 0, per_iter
    assert be.res.m["peak_resident_blocks"] <= 12
    assert be.res.result()["prefetch_useful_bytes"] > 0


def test_mover_thread_keeps_order_and_reports_errors_on_the_training_thread():
    """Prefetches and evictions leave the training thread (the driver holds the caller of an eviction for the
    migration); they must still reach CUDA in the submitted order, and a failed call must surface as a
    CudaCallError on the training thread (the session then degrades), not vanish in the thread."""
    import pytest

    from uvmprefetch.runtime.cuda_backend import CudaCallError
    m, _ = mover(batch=False)
    m.start_thread(max_pending=4 * BS)
    m.prefetch([(BASE, BS)], to_device=False)
    m.prefetch([(BASE + BS, 2 * BS)], to_device=True)
    m.prefetch([(BASE + 3 * BS, BS)], to_device=False)
    m.synchronize()
    calls = [c for c in m.rt.calls if c[0] == "prefetch"]
    assert [(c[1][0], c[1][2]) for c in calls] == [(BASE, 2), (BASE + BS, 1), (BASE + 3 * BS, 2)]
    assert m.rt.calls[0][0] == "set_device"  # the thread binds the backend's device before any move
    m.rt.fail = "prefetch"
    m.prefetch([(BASE, BS)], to_device=True)
    with pytest.raises(CudaCallError, match="mover thread.*cudaErrorInvalidValue"):
        m.synchronize()
    with pytest.raises(CudaCallError):
        m.prefetch([(BASE, BS)], to_device=True)
    m.thread.close()


def test_mover_thread_backpressure_blocks_the_submitter():
    """No more than ``max_pending`` bytes wait: the books' budget cannot run far ahead of the device."""
    import threading
    import time

    from uvmprefetch.runtime.cuda_backend import MoveThread
    gate = threading.Event()
    done = []
    t = MoveThread(0, max_pending=2 * BS)
    t.submit(2 * BS, lambda: (gate.wait(5), done.append(1)))  # holds the thread
    t0 = time.perf_counter()
    threading.Timer(0.2, gate.set).start()
    t.submit(BS, done.append, 2)  # over the limit: waits for the first call to finish
    assert time.perf_counter() - t0 >= 0.15 and t.waited_s >= 0.15
    t.drain()
    assert done == [1, 2]
    t.close()
    import pytest

    from uvmprefetch.runtime.cuda_backend import CudaCallError
    with pytest.raises(CudaCallError, match="after close"):  # never queued silently with nobody to issue it
        t.submit(BS, done.append, 3)


def test_the_gates_observations_reach_the_policy_instead_of_the_books_guess():
    """With the C++ observer the gate says, per op, which blocks were still in flight (late) and which faulted;
    the policy sees the late ones in flight during ``on_launch`` and gets the faulted ones in ``on_fault``, even
    where the books believed otherwise (they count a prefetch resident as soon as it is issued)."""
    seen = {}

    class Watch(Scripted):
        def on_launch(self, info, state):
            seen.setdefault("in_flight", []).append(np.flatnonzero(state.in_flight).tolist())
            return super().on_launch(info, state)

        def on_fault(self, info, blocks):
            seen.setdefault("faults", []).append(blocks.tolist())
    be = backend(Watch([]), 8, [(BASE, 8 * BS)])
    be.launch(info(0, be, BASE, 3 * BS))  # blocks 0..2: first touch, the books say they fault
    assert seen["faults"] == [[0, 1, 2]] and seen["in_flight"] == [[]]
    be.note_gate(late=[(BASE >> 21) + 1], fault=[(BASE >> 21) + 2, 0x7777])  # block 0x7777: never seen, ignored
    be.launch(info(1, be, BASE, 3 * BS))  # the books say resident; the gate saw 1 in flight and 2 faulting
    assert seen["in_flight"][1] == [1] and seen["faults"][1] == [2]
    assert not be.res.in_flight.any()  # the view was the gate's for that launch only


def test_a_gap_in_the_observers_records_forgets_every_death():
    # a full op ring dropped records: the policy's view has a hole, so no block counted dead before the gap is
    # discarded after it
    be = backend(Scripted([]), 8, [(BASE, 8 * BS)])
    addrs = blocks_allocated(be, 8)
    be.launch(info(0, be, BASE, 4 * BS))
    die(be, addrs[1], addrs[2])
    assert (be.ticket[[1, 2]] > 0).all()
    be.gap()
    assert not be.ticket.any()


def test_books_never_hold_a_prefetch_that_was_not_moved():
    """The cuda backend numbers blocks densely on first sight, while a policy predicts ids from what it learned
    (the `uvmprefetch` policy's layer stride extrapolates ids an iteration has not reached yet). A prefetch of an
    id not numbered yet has no address: the mover moves nothing, so the books must not call it resident (they
    did: 39 such decisions on gpt2-small in the GPU replay, and those ids later went to real blocks that the
    books believed on the GPU). Neither may a numbered block outside every live managed allocation."""
    # GIVEN blocks 0..3 numbered (one allocation of 4 blocks) and a second allocation whose blocks 4, 5 are
    # numbered, then freed (the shim no longer lists it)
    seg = [(BASE, 4 * BS)]
    pol = Scripted([None, Decision(prefetch=np.array([2, 9, 3, 5]))])
    be = backend(pol, 16, seg + [(BASE + 8 * BS, 2 * BS)])
    be.launch(info(0, be, BASE, BS))
    be.block_ids(BASE + BS, 3 * BS)
    be.block_ids(BASE + 8 * BS, 2 * BS)
    be.shim.segs = seg
    assert be.res.n_ids == 6
    # WHEN the policy prefetches 2, an id not numbered yet (9), 3 and the freed block 5
    be.launch(info(1, be, BASE + BS, BS))
    # THEN only 2 and 3 are moved and held resident; 9 and 5 are dropped and counted
    moved = [r for k, r, *_ in be.mover.log if k == "to_gpu"]
    assert moved == [[(BASE + 2 * BS, 2 * BS)]]
    assert be.res.resident[[2, 3]].all() and not be.res.resident[[5, 9]].any()
    r = be.res.result()
    assert r["unnumbered_prefetches"] == 1 and r["unmapped_prefetches"] == 1
    # AND when id 9 is later given to a real block, the books do not think it is on the GPU
    for k in range(6, 10):
        be.block_ids(BASE + 64 * BS + k * BS, BS)
    assert be.res.n_ids == 10 and not be.res.resident[9]


def test_stream_gate_calls_match_the_cuda13_signatures():
    """The discards' gate at the driver boundary: a mapped pinned word, cuStreamWaitValue32 (GEQ) to close,
    cuStreamWriteValue32 to open on another stream, a host write as the last resort."""
    import ctypes
    import types

    from uvmprefetch.runtime.mover import StreamGate
    word = ctypes.c_uint32(99)
    calls = []
    rt = types.SimpleNamespace(cudaHostAllocMapped=2, cudaError_t=FakeCudart.cudaError_t,
                               cudaHostAlloc=lambda size, flags: calls.append(("alloc", size, flags))
                               or (0, ctypes.addressof(word)),
                               cudaHostGetDevicePointer=lambda host, flags: (0, host + 0x1000))
    drv = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0), CUstream=lambda h: ("stream", h),
        CUdeviceptr=lambda p: ("dptr", p),
        CUstreamWaitValue_flags=types.SimpleNamespace(CU_STREAM_WAIT_VALUE_GEQ=0),
        cuStreamWaitValue32=lambda s, a, v, f: calls.append(("wait", s, a, v, f)) or (0,),
        cuStreamWriteValue32=lambda s, a, v, f: calls.append(("write", s, a, v, f)) or (0,))
    g = StreamGate(rt, drv)
    assert word.value == 0 and calls == [("alloc", 4, 2)]
    dev = ("dptr", ctypes.addressof(word) + 0x1000)
    assert g.close(7) == 1 and g.close(7) == 2
    g.open_after(12, 1)
    assert calls[1:] == [("wait", ("stream", 7), dev, 1, 0), ("wait", ("stream", 7), dev, 2, 0),
                         ("write", ("stream", 12), dev, 1, 0)]
    g.open_now(2)
    assert word.value == 2
    g.open_now(1)  # never backwards
    assert word.value == 2


def test_a_populate_is_a_prefetch_on_the_discard_stream_behind_the_blocks_discard():
    """A prefetch of a discarded range maps it without data: issued on the discard stream it runs after the block's
    discard (stream order) and the block's last move, and not behind the move stream's queue; a later move of the
    block waits for it as for a discard. A prefetch never drops data, so no check is needed."""
    m, log = mover(batch=True)
    a, b = [(BASE, BS)], [(BASE + BS, BS)]
    # GIVEN a move of A and its mark, then a discard of B
    m.prefetch(a, to_device=True)
    ma = m.mark_moves()
    d = m.discard([b])
    del log[:]
    # WHEN A and B are populated, after A's move mark
    p = m.populate(a + b, after=ma)
    # THEN one batch prefetch to the GPU on the discard stream (12), after A's mark, its own mark recorded there
    assert p == d + 1
    assert m.rt.calls[-1] == ("prefetch_batch", ((BASE, BASE + BS), (BS, BS), 1, 0, 12))
    assert log == [("wait_event", 12, "ev0"), ("record", 12, "ev3")]
    # AND a later eviction of A waits for it
    del log[:]
    m.prefetch(a, to_device=False, after=p)
    assert log == [("wait_event", 11, "ev3")]
    # AND without the batch API (no discards) nothing is issued: the caller prefetches instead
    s, _ = mover(batch=False)
    assert s.populate(a) == 0 and s.rt.calls == []


def test_the_backend_populates_only_with_discards_on_else_prefetches():
    seg = [(BASE, 16 * BS)]

    def run(discard):
        # GIVEN block 1 used by launch 0, then a policy that asks to populate blocks 2 and 3 before launch 1
        pol = Scripted([None, Decision(populate=np.array([2, 3]), prefetch=np.array([5]))])
        be = backend(pol, 8, seg, discard=discard)
        if discard:
            blocks_allocated(be, 16)
        be.launch(info(0, be, BASE + BS, BS))
        be.block_ids(BASE, 8 * BS)
        be.launch(info(1, be, BASE + 2 * BS, 2 * BS))
        return be, [(k, r) for k, r, *_ in be.mover.log if k != "mark"]

    # WHEN discards are on: the populates go to the discard stream, the prefetch to the move stream
    be, log = run(discard=True)
    assert log == [("populate", [(BASE + 2 * BS, 2 * BS)]), ("to_gpu", [(BASE + 5 * BS, BS)])]
    assert be.liveness_result()["populates_issued"] == 2 and be.res.resident[[2, 3, 5]].all()
    # WHEN they are off (the default): the populates are prefetches, first, in the move stream's queue
    be, log = run(discard=False)
    assert log == [("to_gpu", [(BASE + 2 * BS, 2 * BS), (BASE + 5 * BS, BS)])]
