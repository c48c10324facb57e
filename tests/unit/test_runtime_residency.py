"""The cuda backend's books and budget (``Residency``), driven on the CPU like the backend drives them.

Invariants (property-tested): resident blocks never exceed the budget unless the protected blocks alone do;
protected blocks (running + queued launches) are never evicted; every evicted block was resident; victims are
the least recently migrated; byte counters add up."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmprefetch.policy.base import EMPTY, Decision
from uvmprefetch.runtime.residency import Residency

BS = 2 << 20
N = 64


def step(res, launch_blocks, queued, dec):
    """One launch, in the cuda backend's order (CudaBackend.launch without the CUDA calls)."""
    if queued.dtype == bool:  # a mask, as GpuProgress.protected_mask gives it
        protected = queued.copy()
        protected[launch_blocks] = True
    else:
        protected = np.union1d(launch_blocks, queued)
    discard, evict, pf = res.plan(dec, protected)
    res.apply(discard, evict, EMPTY)
    incoming = int((~res.resident[launch_blocks]).sum())
    victims = res.victims(incoming + pf.size, protected)
    was_resident = res.resident.copy()
    res.evict_for_budget(victims)
    res.apply(EMPTY, EMPTY, pf)
    missing = res.touch(launch_blocks)
    return discard, evict, pf, victims, missing, was_resident


blocks_st = st.lists(st.integers(0, N - 1), max_size=6, unique=True).map(lambda x: np.array(sorted(x), dtype=np.int64))


@settings(max_examples=150, deadline=None)
@given(cap=st.integers(4, 16),
       launches=st.lists(st.tuples(blocks_st, blocks_st, blocks_st, blocks_st), min_size=1, max_size=40))
def test_budget_invariants(cap, launches):
    res = Residency(cap, N, BS)
    for blocks, queued, want_pf, want_ev in launches:
        protected = np.union1d(blocks, queued)
        _, evict, pf, victims, missing, was = step(res, blocks, queued, Decision(prefetch=want_pf, evict=want_ev))
        assert not np.isin(evict, protected).any() and not np.isin(victims, protected).any()
        assert was[victims].all()  # every evicted block was resident
        assert res.resident[blocks].all()  # after the launch its blocks are on the GPU
        if protected.size + pf.size <= cap:
            assert res.n_resident <= cap, (res.n_resident, cap)
        assert res.n_resident == int(res.resident.sum())
    m = res.result()
    assert m["bytes_htod"] == m["prefetch_issued_bytes"] + m["expected_faults"] * BS
    assert m["bytes_dtoh"] == (m["budget_evictions"] + m["policy_evictions"]) * BS
    assert m["prefetch_useful_bytes"] <= m["prefetch_issued_bytes"]


def test_victims_are_least_recently_migrated():
    res = Residency(3, N, BS)
    for b in (1, 2, 3):
        step(res, np.array([b]), EMPTY, None)
    _, _, _, victims, _, _ = step(res, np.array([4]), EMPTY, None)
    assert victims.tolist() == [1]
    _, _, _, victims, _, _ = step(res, np.array([5]), np.array([2]), None)  # 2 is queued: skip it
    assert victims.tolist() == [3]


def test_prefetch_accuracy_and_coverage():
    res = Residency(8, N, BS)
    step(res, np.array([0]), EMPTY, Decision(prefetch=np.array([1, 2])))
    _, _, _, _, missing, _ = step(res, np.array([1, 3]), EMPTY, None)
    assert missing.tolist() == [3]
    m = res.result()
    assert m["prefetch_issued_bytes"] == 2 * BS and m["prefetch_useful_bytes"] == BS
    assert m["accuracy"] == 0.5 and m["coverage"] == 1 / 3  # 1 served by prefetch, 2 faulted (0 and 3)


def test_footprint_counts_blocks_launches_touched_once():
    # the replay's definition: distinct blocks any launch used (a prefetched block never used is not in it),
    # oversub = those blocks / capacity blocks
    res = Residency(2, N, BS)
    step(res, np.array([0, 1]), EMPTY, Decision(prefetch=np.array([7])))
    step(res, np.array([1, 2]), EMPTY, None)
    step(res, np.array([0]), EMPTY, None)
    m = res.result()
    assert m["footprint_bytes"] == 3 * BS and m["oversub"] == 1.5


def test_policy_cannot_evict_queued_blocks():
    res = Residency(8, N, BS)
    step(res, np.array([1, 2]), EMPTY, None)
    _, evict, _, _, _, _ = step(res, np.array([3]), np.array([1]), Decision(evict=np.array([1, 2])))
    assert evict.tolist() == [2] and res.m["dropped_evictions"] == 1 and res.resident[1]


class FakeEvent:
    """Completes when the test says the GPU got there."""

    gpu_done = -1
    n = 0

    def __init__(self):
        self.at = None

    def record(self):
        FakeEvent.n += 1
        self.at = FakeEvent.n - 1

    def query(self):
        return self.at <= FakeEvent.gpu_done


def test_blocks_of_queued_launches_are_never_evicted():
    from uvmprefetch.runtime.observe import GpuProgress
    FakeEvent.gpu_done, FakeEvent.n = -1, 0
    prog = GpuProgress(N, event_factory=FakeEvent)
    res = Residency(4, N, BS)
    # the CPU queues launches 0..3 (blocks 0..3) while the GPU has finished none of them
    for i in range(4):
        prot = prog.protected_mask(np.array([i]))
        step(res, np.array([i]), prot, None)
        prog.record(i, np.array([i]))
    assert prog.depth() == 4
    # launch 4 needs room: every resident block belongs to a queued launch -> nothing may go
    prot = prog.protected_mask(np.array([4]))
    _, _, _, victims, _, _ = step(res, np.array([4]), prot, None)
    assert victims.size == 0 and res.m["over_budget_launches"] == 1
    prog.record(4, np.array([4]))
    # the GPU finishes launches 0 and 1: their blocks become evictable, oldest first
    FakeEvent.gpu_done = 1
    prot = prog.protected_mask(np.array([5]))
    assert prog.completed == 1 and not prot[[0, 1]].any() and prot[[2, 3, 4, 5]].all()
    _, _, _, victims, _, _ = step(res, np.array([5]), prot, None)
    assert set(victims.tolist()) <= {0, 1} and victims.size >= 1


def test_mask_and_ids_agree():
    a, b = Residency(3, N, BS), Residency(3, N, BS)
    for blk in range(6):
        ids = np.array([blk, (blk + 1) % N])
        mask = np.zeros(N, dtype=bool)
        mask[ids] = True
        ra = step(a, np.array([blk]), ids, Decision(evict=np.array([blk - 1, blk - 2])))
        rb = step(b, np.array([blk]), mask, Decision(evict=np.array([blk - 1, blk - 2])))
        assert all(np.array_equal(x, y) for x, y in zip(ra[:5], rb[:5]))


# The books' set operations on a few ids (the sizes a launch sees: 1-9 ids) run per id in Python below SMALL ids and
# by NumPy above; both must give exactly what NumPy's own operations give (values, order, dtype).
ids_lists = st.lists(st.integers(min_value=0, max_value=200), max_size=150)


@settings(max_examples=300, deadline=None)
@given(ids_lists, ids_lists)
def test_small_set_operations_equal_numpy_on_either_side_of_small(a, b):
    from uvmprefetch.runtime.residency import count, first_seen, union_ids, union_size, unique_ids
    x, y = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    for got, want in ((unique_ids(x), np.unique(x)), (union_ids(x, y), np.union1d(x, y)),
                      (first_seen(x), x[np.sort(np.unique(x, return_index=True)[1])])):
        assert got.dtype == np.int64 and got.tolist() == want.tolist()
    assert union_size(x, y) == np.union1d(x, y).size
    flags = np.zeros(201, dtype=bool)
    flags[y] = True
    assert count(flags, x) == int(flags[x].sum())
    assert unique_ids(list(a)).tolist() == np.unique(x).tolist()  # (a Decision's fields may be lists)
