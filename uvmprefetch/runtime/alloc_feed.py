"""observe (live, cuda): the caching allocator's own events feed block liveness, for the policy and for discards.

``kernels/alloc_tracker.cpp`` (compiled into the C++ observer's library where a CUDA torch is installed) pushes
every change of the caching allocator's books into a ring, numbered from the same sequence as the observer's op
records. ``AllocatorFeed`` drains that ring into a ``liveness.Liveness`` as soon as it is drained (so its books
are never behind what the ring has delivered), and holds the deaths it finds until the planner, which merges
allocator events and ops by sequence number, reaches them: a death reaches the backend (its per-block ticket,
``policy.on_free``) right before the first op that follows it, the hook order of a replay.

Two threads use it: the planner (``take_events``, ``deaths_before``, ``quiescent``) and the mover, which checks
discard candidates right before it issues them (``check``: every allocator event numbered before the check is
fed first, so an ALLOC that reused a candidate is seen). A lock serialises them.

A ring overflow makes every block live (``Liveness.overflow``) until a quiescent point rebuilds the books from
``torch.cuda.memory_snapshot()``: never a discard on incomplete knowledge.
"""

from __future__ import annotations

import threading

import numpy as np

from .liveness import EVENT_DTYPE, Liveness

_NONE = np.zeros(0, dtype=np.int64)


class AllocatorFeed:
    """One device's allocator events -> ``Liveness`` -> deaths in sequence order (see the module docstring).

    Parameters
    ----------
    lib
        The loaded ``ObserverLib`` with the tracker attached (``tracker_*`` calls).
    device, block_size
        The CUDA device whose events count, and the block size of the backend's books.
    complete_from_start
        The tracker was attached before the allocator's first allocation (``torch.cuda.memory_reserved() == 0``);
        otherwise every block is live until the first quiescent point.
    """

    def __init__(self, lib, device: int, block_size: int, complete_from_start: bool) -> None:
        self.lib = lib
        self.device = int(device)
        self.liveness = Liveness(block_size, self.device, complete_from_start=complete_from_start)
        self._lock = threading.RLock()
        self._dropped = lib.tracker_dropped()
        self._events: list[np.ndarray] = []  # drained, for the planner's merge (storage deaths, the trace)
        self._dead_blk: list[np.ndarray] = []  # deaths found, not yet handed out (in sequence order)
        self._dead_seq: list[np.ndarray] = []
        self._released: list[np.ndarray] = []
        self.checks = 0
        self.drained = 0

    def pump(self) -> None:
        """Drain the ring and feed what came (an overflow first marks the books incomplete)."""
        with self._lock:
            n = self.lib.tracker_dropped()
            if n != self._dropped:
                self._dropped = n
                self.liveness.overflow()
            ev = self.lib.drain_cuda_allocs()
            if not len(ev):
                return
            self.drained += len(ev)
            self._events.append(ev)
            # (another device's events come under another lock: their numbers may interleave with ours)
            mine = ev[ev["device"] == self.device]
            if len(mine):
                self._hold(self.liveness.feed(mine.view(EVENT_DTYPE)))

    def _hold(self, d) -> None:
        if d.blocks.size:
            self._dead_blk.append(d.blocks)
            self._dead_seq.append(d.seqs)
        if d.released.size:
            self._released.append(d.released)

    def take_events(self) -> np.ndarray:
        """The events drained since the last call (ring order), after feeding them: the planner merges them with
        the op records."""
        self.pump()
        with self._lock:
            ev, self._events = self._events, []
        if not ev:
            return np.zeros(0, dtype=EVENT_DTYPE)
        return ev[0] if len(ev) == 1 else np.concatenate(ev)

    def deaths_before(self, seq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(blocks, seqs, released)``: the deaths numbered before ``seq`` (block numbers, address // block size,
        with the number of the event that killed each: the ticket a discard is checked against), and the blocks
        given back to the driver since the last call; handed out once."""
        ds = self._dead_seq  # (read without the lock, once per op: a death held meanwhile goes out at the next op,
        if not self._released and (not ds or int(ds[0][0]) >= seq):  # never early; the lists are only appended to
            return _NONE, _NONE, _NONE
        with self._lock:
            blk = np.concatenate(self._dead_blk) if self._dead_blk else _NONE
            sq = np.concatenate(self._dead_seq) if self._dead_seq else _NONE
            cut = int(np.searchsorted(sq, seq))  # (deaths are found in sequence order)
            self._dead_blk, self._dead_seq = ([blk[cut:]], [sq[cut:]]) if cut < blk.size else ([], [])
            rel = np.concatenate(self._released) if self._released else _NONE
            self._released = []
            return blk[:cut], sq[:cut], rel

    def check(self, blocks: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, str | None]:
        """Right before a discard: which of ``blocks`` are still dead from the death ``seqs`` named, with every
        allocator event numbered before this call fed (``uvm_alloc_tracker_quiesce``: without the allocator's
        lock, which a thread may hold while it waits for the gated GPU). Returns the mask and, when none may be
        discarded for want of knowledge (incomplete books, events still in flight), why."""
        with self._lock:
            self.checks += 1
            if self.lib.tracker_quiesce(2000) != 0:
                return np.zeros(len(blocks), dtype=bool), "allocator events still in flight after 2 ms"
            self.pump()
            why = self.liveness.unknown
            if why is not None:
                return np.zeros(len(blocks), dtype=bool), why
            return self.liveness.still_dead(np.asarray(blocks, dtype=np.int64), np.asarray(seqs, dtype=np.int64)), None

    def quiescent(self, snapshot) -> None:
        """An iteration end: with incomplete books, rebuild them from ``snapshot()`` (``torch.cuda.memory_snapshot``)
        and hold every dead block as a death numbered after everything fed.

        The training thread may allocate meanwhile. An event numbered before the call to ``snapshot`` is in it
        (the callback numbers its event under the allocator's lock, which the snapshot takes too); one numbered
        after it returned is not; one numbered in between may or may not be: then the rebuild is not trusted and
        the books stay incomplete until the next iteration end."""
        with self._lock:
            self.pump()
            if self.liveness.unknown is None:
                return
            s0 = self.lib.tracker_next_seq()
            snap = snapshot()
            s1 = self.lib.tracker_next_seq()
            dropped = self.lib.tracker_dropped()
            ev = self.lib.drain_cuda_allocs()
            self.drained += len(ev)
            self._events.append(ev)
            mine = ev[ev["device"] == self.device].view(EVENT_DTYPE)
            sq = mine["seq"]
            if dropped != self._dropped or ((sq > s0) & (sq < s1)).any():
                self._dropped = dropped
                self._hold(self.liveness.feed(mine))  # (still incomplete: nothing dies)
                return
            self.liveness.feed(mine[sq < s0])  # (in the snapshot already: the rebuild replaces them)
            self._hold(self.liveness.quiescent(lambda: snap))
            self._hold(self.liveness.feed(mine[sq > s1]))

    def stats(self) -> dict:
        with self._lock:
            out = self.liveness.stats()
            out.update(ring_dropped=int(self._dropped), drained=self.drained, checks=self.checks)
            return out


def attach(cfg, device: int, block_size: int, say=None) -> tuple[AllocatorFeed | None, str]:
    """The allocator feed for the cuda backend, or ``(None, why not)``: the C++ observer's library must load and
    hold the tracker (built where a CUDA torch's headers, ``libc10_cuda.so`` and the CUDA runtime headers exist),
    and the tracker must attach (the caching allocator, a known ``TraceEntry``)."""
    if getattr(cfg, "observer", "auto") == "python":
        return None, "UVMPREFETCH_OBSERVER=python (the allocator tracker lives in the C++ observer's library)"
    from . import native_observer
    from .native import NativeBuildError
    try:
        lib = native_observer.load(say=say)
    except NativeBuildError as e:
        return None, f"the C++ observer's library is unavailable: {e}"
    if not lib.has_tracker:
        return None, ("the observer library was built without the allocator tracker (no CUDA torch headers, "
                      "libc10_cuda.so or CUDA runtime headers when it was built)")
    err = lib.tracker_attach()
    if err:
        return None, f"the allocator tracker did not attach: {err}"
    import torch
    return AllocatorFeed(lib, device, block_size, complete_from_start=torch.cuda.memory_reserved(device) == 0), ""


__all__ = ["AllocatorFeed", "attach"]
