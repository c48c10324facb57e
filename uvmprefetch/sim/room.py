"""Room on the simulated GPU: the driver's choice of victims (least recently *migrated*, never a block of the running
launch) and the reservation of room for incoming blocks, evicting when the policy left none. ``Room`` holds this part
of ``GpuModel`` (``sim/engine.py``), which has the blocks' state, the queues and ``_evict`` these use.
"""

from __future__ import annotations

import numpy as np

from ..policy.base import EMPTY, Advice

_PREFER_HOST = int(Advice.PREFER_HOST)


class Room:
    """Victims and room, as part of ``GpuModel``."""

    def _lrm_victims(self, k: int) -> np.ndarray:
        """Up to ``k`` least-recently-migrated resident blocks that are not protected (driver's choice)."""
        q = self._lrm
        out = []
        got = 0
        pos = q.head
        while got < k and pos < q.tail:
            stop = min(q.tail, pos + max(4 * (k - got), 256))
            blk = q.blk[pos:stop]
            valid = self.resident[blk] & (self.mig_seq[blk] == q.val[pos:stop])
            if pos == q.head:  # drop stale entries at the front for good
                lead = int(np.argmax(valid)) if valid.any() else blk.shape[0]
                q.head += lead
            cand = blk[valid & ~self._protect[blk]]
            if cand.size:
                cand = cand[: k - got]
                out.append(cand)
                got += cand.shape[0]
            pos = stop
        return np.concatenate(out) if out else EMPTY

    def _make_room(self, n: int, now: float, can_wait: bool, pending: int = 0) -> np.ndarray:
        """Reserve room for ``n`` incoming blocks; returns the sorted times each slot is free (may be fewer
        than ``n`` when ``can_wait`` is False and nothing more can be evicted). ``pending`` blocks already have
        room reserved but are not counted in ``used_blocks`` yet."""
        free = self.capacity_blocks - self.used_blocks - pending
        rooms = [np.full(min(max(free, 0), n), now)]
        r = n - rooms[0].shape[0]
        if r > 0 and len(self._wb):  # slots of pre-evicted blocks still being written back
            _, rel = self._wb.view()
            k = min(r, rel.shape[0])
            rooms.append(rel[:k].copy())
            self._wb.head += k
            r -= k
        if r > 0:
            victims = self._lrm_victims(r)
            if victims.size:
                rooms.append(self._evict(victims, now, copy=self._copy_default))
                self.policy.on_evict(victims)
                r -= victims.shape[0]
        while r > 0 and can_wait and len(self._inflight):
            # Only in-flight or protected blocks hold the room: wait for the next arrival, then evict it.
            blk, arr = self._inflight.view()
            t = float(arr[0])
            self._advance(t)
            victims = self._lrm_victims(r)
            if victims.size:
                rooms.append(np.maximum(self._evict(victims, t, copy=self._copy_default), t))
                self.policy.on_evict(victims)
                r -= victims.shape[0]
        return np.sort(np.concatenate(rooms))

    def _to_bring(self, b: np.ndarray) -> np.ndarray:
        """``b`` unique, in the order given, without those on the GPU or on their way and the host-preferred."""
        _, first = np.unique(b, return_index=True)
        b = b[np.sort(first)]
        return b[~self.resident[b] & ~self.in_flight[b] & (self.advice[b] != _PREFER_HOST)]

    def _room_for(self, b: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Room for the blocks ``b`` bring in, without waiting: ``(b cut to the room, when each slot is free)``."""
        if not b.size:
            return b, np.zeros(0)
        rooms = self._make_room(b.shape[0], now, can_wait=False)
        if rooms.shape[0] < b.shape[0]:
            self.m["prefetch_dropped_blocks"] += b.shape[0] - rooms.shape[0]
            b = b[: rooms.shape[0]]
        return b, rooms
