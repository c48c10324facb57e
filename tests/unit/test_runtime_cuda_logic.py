"""The cuda backend's logic on the CPU: the CUDA calls are replaced at the boundary (the Mover and the shim),
everything else is the real ``CudaBackend``: address -> block ids, ranges clipped to managed allocations,
the order of moves (discard, evict, advise, prefetch), budget evictions that spare queued launches, hook
calls. The real calls are covered by tests/gpu."""

import numpy as np

from uvmprefetch.gpus import PROFILES
from uvmprefetch.policy.base import Advice, Decision, LaunchInfo, Policy, PolicyContext
from uvmprefetch.runtime.cuda_backend import BLOCK_SIZE, CudaBackend, profile_for
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
    batch = can_discard = True
    calls = 0

    def __init__(self):
        self.log = []

    def discard(self, ranges):
        if ranges:
            self.log.append(("discard", ranges))

    def prefetch(self, ranges, to_device):
        if ranges:
            self.log.append(("to_gpu" if to_device else "to_host", ranges))

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


def backend(policy, cap_blocks, segments):
    be = object.__new__(CudaBackend)  # no CUDA: fill in what __init__ would have found
    be.block_size, be.max_blocks = BS, 256
    be.res = Residency(cap_blocks, be.max_blocks, BS)
    be.mover, be.shim, be.policy = FakeMover(), FakeShim(segments), policy
    be._ids, be._addr = {}, np.zeros(be.max_blocks, dtype=np.int64)
    be._segments, be._seg_starts, be._seg_version = [], [], -1
    be._checked_swap = True
    Event.done, Event.n = -1, 0
    be.progress = GpuProgress(be.max_blocks, event_factory=Event)
    policy.on_start(PolicyContext(block_size=BS, capacity_blocks=cap_blocks, max_blocks=be.max_blocks,
                                  gpu=PROFILES["h100-pcie"], live=True))
    return be


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


def test_moves_in_contract_order_and_budget_spares_queued_launches():
    seg = [(BASE, 16 * BS)]
    dec_later = Decision(prefetch=np.array([5, 6]), evict=np.array([0]), discard=np.array([1]),
                         advise=((np.array([2]), Advice.READ_MOSTLY),))
    pol = Scripted([None, None, None, None, dec_later])
    be = backend(pol, 4, seg)
    assert be.block_ids(BASE, 8 * BS).tolist() == list(range(8))  # ids in first-sight order = address order here
    for i in range(4):  # launches 0..3 touch blocks 0..3; the GPU finishes none of them
        be.launch(info(i, be, BASE + i * BS, BS))
    Event.done = 2  # the GPU has finished launches 0..2; launch 3 is still queued
    be.launch(info(4, be, BASE + 4 * BS, BS))
    kinds = [e[0] for e in be.mover.log]
    assert kinds == ["discard", "to_host", "advise", "to_gpu"]  # discard, evict, advise, prefetch
    assert be.mover.log[0][1] == [(BASE + BS, BS)]
    evicted = be.mover.log[1][1]
    # the policy's eviction (block 0) + one budget victim: block 2 (done on the GPU), not 3 (launch 3 queued)
    assert evicted == [(BASE, BS), (BASE + 2 * BS, BS)]
    assert ("evict", [2]) in pol.events  # budget evictions are reported like the driver's
    assert be.mover.log[3][1] == [(BASE + 5 * BS, 2 * BS)]  # prefetches merged, in order
    assert be.res.n_resident <= 4
    assert ("fault", 4, [4]) in pol.events  # block 4 was neither resident nor prefetched


def test_free_reaches_policy():
    pol = Scripted([])
    be = backend(pol, 4, [(BASE, 4 * BS)])
    be.free(np.array([1, 2]))
    assert ("free", [1, 2]) in pol.events


def test_profile_for_device_names():
    assert profile_for("NVIDIA H100 80GB HBM3", 80 << 30).name.startswith("h100")
    assert profile_for("NVIDIA H200", 141 << 30).memory_bytes == 141 << 30
    assert profile_for("Tesla T4", 16 << 30).name.startswith("generic")


def test_prefetch_ranges_keep_the_policy_order():
    be = backend(Scripted([]), 8, [(BASE, 8 * BS)])
    be.block_ids(BASE, 8 * BS)
    assert be.ranges(np.array([6, 2, 3]), keep_order=True) == [(BASE + 6 * BS, BS), (BASE + 2 * BS, 2 * BS)]
    assert be.ranges(np.array([6, 2, 3])) == [(BASE + 2 * BS, 2 * BS), (BASE + 6 * BS, BS)]
