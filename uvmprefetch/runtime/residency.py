"""The live runtime's own view of GPU residency, and the budget that keeps it under a byte limit.

The cuda backend cannot ask the driver which 2 MB blocks are resident, so it keeps books: a block becomes
resident when a launch touches it (the driver faults it in) or when we prefetch it, and leaves when we evict
or discard it. This view is what the policy reads (``ResidencyView``) and what the budget enforces: before a
launch, if resident + incoming blocks would exceed the capacity, the least recently *migrated* blocks are
evicted to the host (the driver's own rule), never a block of the running launch or of launches still
queued on the GPU. It is pure NumPy: the unit tests drive it on the CPU with a recording mover.
"""

from __future__ import annotations

import numpy as np

from ..policy.base import EMPTY, Decision


SMALL = 64  # below this many ids, Python sets beat NumPy's set operations (~1 us against ~4-8 us per call)


def unique_ids(ids) -> np.ndarray:
    """``np.unique(ids)`` as int64: sorted, each id once."""
    n = len(ids)
    if n == 0:
        return EMPTY
    if n == 1:
        return np.asarray(ids, dtype=np.int64).reshape(1)
    if n < SMALL:
        return np.array(sorted(set(np.asarray(ids).tolist())), dtype=np.int64)
    return np.unique(np.asarray(ids, dtype=np.int64))


def first_seen(ids) -> np.ndarray:
    """Each id once, where it first occurs (a policy's prefetches: soonest-needed first), as int64."""
    a = np.asarray(ids, dtype=np.int64)
    if a.size < 2:
        return a.reshape(-1)
    if a.size < SMALL:
        return np.fromiter(dict.fromkeys(a.tolist()), dtype=np.int64)
    _, first = np.unique(a, return_index=True)
    return a[np.sort(first)]


def union_ids(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.union1d(a, b)`` (sorted, each id once) for int64 id arrays."""
    if not b.size:
        return unique_ids(a)
    if not a.size:
        return unique_ids(b)
    if a.size + b.size < SMALL:
        return np.array(sorted(set(a.tolist()).union(b.tolist())), dtype=np.int64)
    return np.union1d(a, b)


def union_size(a: np.ndarray, b: np.ndarray) -> int:
    """``np.union1d(a, b).size``: how many ids are in ``a`` or ``b``."""
    if a.size + b.size < SMALL:
        return len(set(a.tolist()).union(b.tolist()))
    return int(np.union1d(a, b).size)


def count(flags: np.ndarray, ids: np.ndarray) -> int:
    """``int(flags[ids].sum())``: how many of ``ids`` are set in the bool array ``flags``."""
    if ids.size < SMALL:
        return sum(1 for b in ids.tolist() if flags[b])
    return int(np.count_nonzero(flags[ids]))


class Residency:
    """Bookkeeping of resident blocks with LRM order; implements ``ResidencyView``.

    Parameters
    ----------
    capacity_blocks
        Most blocks allowed resident (the budget).
    max_blocks
        Block ids are ``0 <= b < max_blocks``.
    block_size
        Bytes per block (for byte counters).
    """

    def __init__(self, capacity_blocks: int, max_blocks: int, block_size: int) -> None:
        self.capacity_blocks = int(capacity_blocks)
        self.max_blocks = int(max_blocks)
        self.block_size = int(block_size)
        self.resident = np.zeros(self.max_blocks, dtype=bool)
        self.in_flight = np.zeros(self.max_blocks, dtype=bool)  # prefetches count as resident at once
        self.pf_pending = np.zeros(self.max_blocks, dtype=bool)  # prefetched, not yet used
        self.mig_seq = np.zeros(self.max_blocks, dtype=np.int64)
        self.touched = np.zeros(self.max_blocks, dtype=bool)  # used by a launch at least once: the footprint
        # Ids in use are below ``n_ids`` (the cuda backend numbers blocks densely as it first sees them and keeps
        # this up to date): a policy's scans over all blocks may stop there (``ResidencyView``).
        self.n_ids = self.max_blocks
        self._seq = 0
        self.n_resident = 0
        self.now = 0.0
        self.m = dict(expected_faults=0, bytes_htod=0, bytes_dtoh=0, prefetch_issued_bytes=0,
                      prefetch_useful_bytes=0, budget_evictions=0, policy_evictions=0, discards=0,
                      dropped_evictions=0, peak_resident_blocks=0, over_budget_launches=0, evicted_unused=0,
                      unnumbered_prefetches=0, unmapped_prefetches=0)

    @property
    def used_blocks(self) -> int:
        return self.n_resident

    def _set(self, blocks: np.ndarray, value: bool) -> None:
        resident = self.resident
        if blocks.size < SMALL:
            changed = [b for b in blocks.tolist() if resident[b] != value]
            n = len(changed)
        else:
            changed = blocks[resident[blocks] != value]
            n = changed.size
        if n:
            resident[changed] = value
            self.n_resident += n if value else -n
            if value:
                self._seq += 1
                self.mig_seq[changed] = self._seq
                self.m["peak_resident_blocks"] = max(self.m["peak_resident_blocks"], self.n_resident)

    def plan(self, dec: Decision | None, protected, movable=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Filter a policy's Decision: ``(discard, evict, prefetch)`` block arrays to act on.

        ``protected`` (here and in ``victims``): block ids, or a bool mask over all blocks, or a callable that
        returns either (called only if the Decision evicts or discards: building the mask costs a pass over
        every block).

        Evictions and discards of ``protected`` blocks (the running and queued launches) are dropped, as the
        hook contract says; evictions of non-resident blocks and prefetches of resident ones are skipped;
        prefetches are cut where they would exceed the capacity (the budget wins over the policy).

        A prefetch the mover cannot make never enters the books (they would hold a block on the GPU that is not,
        and later give its id to a real block): ids not numbered yet (``>= n_ids``: a policy may extrapolate ids
        the backend has not assigned, the ``uvmprefetch`` policy's layer stride does) and, with ``movable`` (a
        callable: bool per block), blocks outside every live managed allocation. Both are counted
        (``unnumbered_prefetches``, ``unmapped_prefetches``).
        """
        if dec is None or dec.is_empty():
            return EMPTY, EMPTY, EMPTY
        discard = unique_ids(dec.discard)
        ev_all = evict = unique_ids(dec.evict)
        if discard.size or ev_all.size:
            prot = self._mask(protected)
            if discard.size:
                discard = discard[~prot[discard]]
            if SMALL > ev_all.size > 0:
                resident = self.resident
                kept = [b for b in ev_all.tolist() if not prot[b]]
                self.m["dropped_evictions"] += ev_all.size - len(kept)
                evict = np.array([b for b in kept if resident[b]], dtype=np.int64)
            elif ev_all.size:
                evict = ev_all[~prot[ev_all]]
                self.m["dropped_evictions"] += int(ev_all.size - evict.size)
                evict = evict[self.resident[evict]]
        pf = dec.prefetch
        if dec.populate.size:  # (populates are prefetches to the books; the backend says how each is issued)
            pf = np.concatenate((np.asarray(dec.populate, dtype=np.int64), np.asarray(pf, dtype=np.int64)))
        if not len(pf):
            return discard, evict, EMPTY
        pf = self._new_prefetches(pf)
        if movable is not None and pf.size:
            ok = movable(pf)
            if not ok.all():
                self.m["unmapped_prefetches"] += int(pf.size - np.count_nonzero(ok))
                pf = pf[ok]
        # blocks the Decision takes off the GPU (``evict`` holds each id once)
        gone = union_size(discard[self.resident[discard]], evict) if discard.size else evict.size
        room = self.capacity_blocks - (self.n_resident - gone)
        return discard, evict, pf[:max(room, 0)]

    def _new_prefetches(self, pf) -> np.ndarray:
        """A Decision's prefetches, each once in the order given (soonest-needed first), those numbered
        (``< n_ids``; the others counted) and not resident."""
        n, resident = self.n_ids, self.resident
        if len(pf) < SMALL:  # (per id in Python: ~0.1 us each, against ~1-2 us per NumPy call on a few ids)
            ids = list(dict.fromkeys(np.asarray(pf).tolist()))
            known = [b for b in ids if b < n]
            if len(known) < len(ids):
                self.m["unnumbered_prefetches"] += len(ids) - len(known)
            return np.array([b for b in known if not resident[b]], dtype=np.int64)
        pf = first_seen(pf)
        known = pf < n
        if not known.all():
            self.m["unnumbered_prefetches"] += int(pf.size - np.count_nonzero(known))
            pf = pf[known]
        return pf[~resident[pf]]

    def _mask(self, protected) -> np.ndarray:
        """``protected`` as a bool mask over all blocks (it may be given as ids, as a mask already, or as a
        callable returning either)."""
        if callable(protected):
            protected = protected()
        if protected.dtype == bool and protected.shape == (self.max_blocks,):
            return protected
        m = np.zeros(self.max_blocks, dtype=bool)
        m[protected] = True
        return m

    def apply(self, discard: np.ndarray, evict: np.ndarray, prefetch: np.ndarray) -> None:
        """Record that these moves were issued."""
        bs = self.block_size
        if discard.size:
            self.m["discards"] += count(self.resident, discard)
            self._set(discard, False)
            self.pf_pending[discard] = False
        if evict.size:
            self.m["evicted_unused"] += count(self.pf_pending, evict)  # prefetched, evicted before any use
            self.m["policy_evictions"] += int(evict.size)
            self.m["bytes_dtoh"] += int(evict.size) * bs
            self._set(evict, False)
            self.pf_pending[evict] = False
        if prefetch.size:
            self.m["prefetch_issued_bytes"] += int(prefetch.size) * bs
            self.m["bytes_htod"] += int(prefetch.size) * bs
            self._set(prefetch, True)
            self.pf_pending[prefetch] = True

    def victims(self, incoming: int, protected) -> np.ndarray:
        """Blocks to evict (least recently migrated first) so that ``incoming`` more blocks fit the budget
        (``protected`` is read only if some must go)."""
        over = self.n_resident + incoming - self.capacity_blocks
        if over <= 0:
            return EMPTY
        n = self.n_ids  # (no id at or above it was ever resident: ``plan`` drops unnumbered prefetches)
        cand = np.flatnonzero(self.resident[:n] & ~self._mask(protected)[:n])
        if cand.size < over:
            self.m["over_budget_launches"] += 1  # the running + queued launches alone exceed the budget
        order = np.argsort(self.mig_seq[cand], kind="stable")
        return cand[order[:over]]

    def evict_for_budget(self, victims: np.ndarray) -> None:
        if victims.size:
            self.m["evicted_unused"] += count(self.pf_pending, victims)
            self.m["budget_evictions"] += int(victims.size)
            self.m["bytes_dtoh"] += int(victims.size) * self.block_size
            self._set(victims, False)
            self.pf_pending[victims] = False

    def touch(self, blocks: np.ndarray) -> np.ndarray:
        """A launch uses ``blocks``: returns those that were not resident (they fault), marks all resident."""
        if not blocks.size:
            return EMPTY
        self.touched[blocks] = True
        resident, pending = self.resident, self.pf_pending
        if blocks.size < SMALL:
            ids = blocks.tolist()
            missing = [b for b in ids if not resident[b]]
            missing = np.array(missing, dtype=np.int64) if missing else EMPTY
            used = [b for b in ids if pending[b]]
            n_used = len(used)
        else:
            missing = blocks[~resident[blocks]]
            used = blocks[pending[blocks]]
            n_used = used.size
        if n_used:
            self.m["prefetch_useful_bytes"] += n_used * self.block_size
            pending[used] = False
        if missing.size:
            self.m["expected_faults"] += int(missing.size)
            self.m["bytes_htod"] += int(missing.size) * self.block_size
            self._set(missing, True)
        return missing

    def kept(self, blocks: np.ndarray) -> None:
        """Blocks ``apply`` counted discarded whose discard was never made (the allocator handed them out first):
        those were on the GPU all along, resident again; no move is counted."""
        back = blocks[~self.resident[blocks]]
        self.m["discards"] -= int(back.size)
        self._set(back, True)

    def free(self, blocks: np.ndarray) -> None:
        """Blocks no live tensor uses: their residency is kept (the driver only drops them when discarded)."""
        self.pf_pending[blocks] = False

    def release(self, blocks: np.ndarray) -> None:
        """Blocks whose memory went back to the driver (``empty_cache``): nothing of them is resident any more."""
        self._set(blocks, False)
        self.pf_pending[blocks] = False

    def result(self) -> dict:
        m = dict(self.m)
        issued, useful = m["prefetch_issued_bytes"], m["prefetch_useful_bytes"]
        m["accuracy"] = useful / issued if issued else None
        served = useful // self.block_size
        m["coverage"] = served / (served + m["expected_faults"]) if served + m["expected_faults"] else None
        m["peak_resident_bytes"] = m["peak_resident_blocks"] * self.block_size
        m["capacity_blocks"] = self.capacity_blocks
        # the simulator's footprint definition (docs/simulator.md "Footprint"): distinct blocks launches touched
        fp = int(np.count_nonzero(self.touched))
        m["footprint_bytes"] = fp * self.block_size
        m["oversub"] = fp / self.capacity_blocks if self.capacity_blocks > 0 else None
        return m
