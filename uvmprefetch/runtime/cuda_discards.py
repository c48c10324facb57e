"""act (live, real GPU): the cuda backend's deaths and discards, from the CUDA caching allocator's own events.

``alloc_feed.py`` drains the allocator's trace tracker into ``Liveness``; the planner hands its deaths over in
sequence order (``deaths_before``); each dead block holds a ticket (the event that killed it) until a launch
touches it. With ``UVMPREFETCH_DISCARD=1`` a Decision's discards of ticketed blocks join a batch that spans up to
``UVMPREFETCH_DISCARD_BATCH`` discarding launches, and each batch goes to the mover (``Mover.discard``: the compute
stream gated once, the tickets checked again on the mover thread, then the discard);
every other discard is issued as an eviction. ``docs/runtime.md`` section 11 has the order and the report fields.
Mixed into ``CudaBackend`` (``cuda_backend.py``), whose state it reads: ``ranges``, ``_dense``, ``res``,
``policy``, ``mover``, ``copy``.
"""

from __future__ import annotations

import sys

import numpy as np

from .mover import CudaCallError
from .residency import union_ids

DISCARD_BATCH = 16  # discarding launches per gate closure unless UVMPREFETCH_DISCARD_BATCH says otherwise
DISCARD_BATCH_BLOCKS = 256  # blocks (512 MiB of 2 MiB blocks) after which a batch goes whatever its launches


class AllocatorDiscards:
    """The part of ``CudaBackend`` that takes deaths from the allocator and issues (or refuses) discards."""

    def _attach_feed(self, cfg) -> None:
        """The caching allocator's events (``alloc_feed.py``), attached with UVMPREFETCH_DISCARD=1 (and the batch
        API) or UVMPREFETCH_EVICT=auto, and the discard state: ``feed``, ``discard_on``, the copy path's book."""
        # Discards only with UVMPREFETCH_DISCARD=1, the batch API and the caching allocator's own events
        # (alloc_feed.py); otherwise a Decision's discards are issued as evictions (same room freed, the data
        # kept). Only a block the allocator itself reported dead (every allocation in it FREE_COMPLETED: a library
        # workspace no op touches lay in blocks the ops alone made look dead, and discards of them lost data on an
        # H100 and an H200) may be discarded, and only while nothing reused it (its ticket, checked again right
        # before the call): a policy's stale dead flag never loses data.
        # The copy path (UVMPREFETCH_EVICT=auto) needs the same events: which allocations are live and fully observed.
        self._cfg = cfg
        if cfg.evict != "uvm":
            self.copy_status = "off: needs the C++ observer"
        self.feed, self.liveness_why = None, "UVMPREFETCH_DISCARD=0: discards are issued as evictions"
        if cfg.discard and not self.mover.can_discard:
            self.liveness_why = "no discards: the driver has no cudaMemDiscardBatchAsync (CUDA 13)"
        if (cfg.discard and self.mover.can_discard) or cfg.evict == "auto":
            from . import alloc_feed
            say = (lambda m: print(f"uvmprefetch: {m}", file=sys.stderr)) if cfg.log != "quiet" else None
            self.feed, self.liveness_why = alloc_feed.attach(cfg, self.device, self.block_size, say)
            if self.feed is not None and cfg.discard:
                try:  # the word the discards gate the compute stream with (Mover.discard), made now: fail early
                    self.mover.stream_gate()
                except (CudaCallError, AttributeError) as e:
                    self.feed.lib.lib.uvm_alloc_tracker_enable(0)
                    self.feed, self.liveness_why = None, f"the discard gate cannot be made: {e}"
            if self.feed is None and cfg.log != "quiet":
                print(f"uvmprefetch: {'discards stay off' if cfg.discard else 'no allocator events'}: "
                      f"{self.liveness_why}", file=sys.stderr)
        # (the copy path's book is whole only while the allocator's events have covered every allocation from start)
        self._copy_books = self.feed is not None and self.feed.liveness.unknown is None
        self._copy_books_why = ("" if self._copy_books else self.liveness_why if self.feed is None
                                else f"the allocator's events began late: {self.feed.liveness.unknown}")
        self.discard_on = self.feed is not None and bool(cfg.discard) and self.mover.can_discard
        self.audit = bool(cfg.discard_audit) and self.discard_on
        self._init_discards()

    def deaths_before(self, seq: int) -> None:
        """The planner reached the op numbered ``seq``: the allocator's deaths numbered before it reach the books,
        the tickets (the death's number, for the check before a discard) and ``policy.on_free``; blocks given back
        to the driver leave the books."""
        if self.feed is None:
            return
        blocks, seqs, released = self.feed.deaths_before(seq)
        if blocks.size:
            dense, pos = self._dense(blocks)
            if dense.size and self.copy is not None:
                self.copy.forget(dense)  # no tensor left in them: nothing to bring back
            if dense.size:
                self.ticket[dense] = seqs[pos]
                again = dense[self._queued[dense]]  # (handed out and dead again while in the batch, no launch
                if again.size:  # used it: the check at issue time holds it to its latest death)
                    self._queued_seq[again] = self.ticket[again]
                    self.ticket[again] = 0
                self.res.free(dense)
                self.policy.on_free(dense)
        if released.size:
            dense, _ = self._dense(released)
            if dense.size:
                self.ticket[dense] = 0
                self._unqueue(dense, "released")  # (memory back to the driver: nothing left to discard or move)
                self.res.release(dense)
                self.policy.on_free(dense)

    def _marks_for(self, n: int) -> None:
        """Per block id: the number of the last ``Mover.mark_moves`` after a move of it, and of the last discard
        of it (0: none); read only with discards on."""
        self._move_mark = np.zeros(n, dtype=np.int64)
        self._disc_mark = np.zeros(n, dtype=np.int64)

    def _after_discards(self, blocks: np.ndarray) -> int:
        """The last discard of any of ``blocks`` (a move of them must wait for it), 0 for none."""
        return int(self._disc_mark[blocks].max()) if blocks.size else 0

    def _init_discards(self) -> None:
        """Per block id: the death ticket (the allocator event that killed it; 0: not dead as far as the books know)
        and the marks that order discards with moves; the batch waiting for its gate; the refusal counts by
        reason; the gate's closures."""
        self.ticket = np.zeros(self.max_blocks, dtype=np.int64)
        self._marks_for(self.max_blocks)
        self.discards_as_evictions = 0
        self.discarded_blocks = 0
        self.populated_blocks = 0
        self.refused = {"not_dead": 0, "reused_before_issue": 0, "released": 0, "unknown": 0, "audit": 0}
        self.audit_cases: list[dict] = []
        cfg = getattr(self, "_cfg", None)
        self.discard_batch = int(getattr(cfg, "discard_batch", DISCARD_BATCH))
        self._queued = np.zeros(self.max_blocks, dtype=bool)  # in the batch (its ticket moved to _queued_seq)
        self._queued_seq = np.zeros(self.max_blocks, dtype=np.int64)
        self._was_resident = np.zeros(self.max_blocks, dtype=bool)  # on the GPU when it joined the batch
        self._queue: list[np.ndarray] = []
        self._queued_n = self._queued_launches = 0
        self.gate_closures = 0
        self.gate_closures_per_iteration: list[int] = []
        self._closures_before = 0

    def _safe_discards(self, discard: np.ndarray, evict: np.ndarray, launch: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """The discard candidates, and the evictions with the rest: with discards off every one becomes an
        eviction; with them on, those the allocator did not report dead (no ticket) do."""
        if self.discard_on and self._queued_n:
            discard = discard[~self._queued[discard]]  # (already in the batch)
        ok = self.ticket[discard] != 0 if self.discard_on else np.zeros(discard.shape[0], dtype=bool)
        if self.discard_on:  # (where each stays if its discard is never made: ``_reused``)
            self._was_resident[discard[ok]] = self.res.resident[discard[ok]]
        rest = discard[~ok]
        if rest.size:
            if self.discard_on:
                self.refused["not_dead"] += int(rest.size)
            else:
                self.discards_as_evictions += int(rest.size)
            evict = union_ids(evict, rest[self.res.resident[rest]])
        return discard[ok], evict

    # One gate closure per batch. The gate stalls the compute stream from the point it is enqueued until the discard
    # stream has waited for the last move of the batch's blocks and issued the discard; the candidates of up to
    # ``discard_batch`` consecutive discarding launches share it. Deferring a discard is safe as long as (a) the
    # check still runs at issue time against every allocator event so far (a block the allocator handed out
    # meanwhile is refused: ``_check``), (b) the event the discard waits for is recorded at issue time (every kernel
    # queued until then, those of the later launches included, finishes before the discard), (c) a block leaves the
    # batch when a launch uses it (the allocator reused it), when the driver gets its memory back (released), or on
    # a gap in the op records, and (d) the batch is issued before any move of one of its blocks, so that the move
    # waits for the discard's mark. A batch also goes at DISCARD_BATCH_BLOCKS blocks (the books count its room free
    # already; the GPU gets it only with the discard), at each iteration end and at settle (stop); never after a
    # failure.
    def _queue_discards(self, discard: np.ndarray, moving: tuple[np.ndarray, ...]) -> None:
        """A launch's candidates join the batch (each ticket moves with its block); the batch is issued when it
        spans ``discard_batch`` discarding launches or DISCARD_BATCH_BLOCKS blocks, or when one of ``moving`` (the
        blocks this launch is about to move) is in it."""
        if discard.size:
            self._queued_seq[discard] = self.ticket[discard]
            self.ticket[discard] = 0
            self._queued[discard] = True
            self._queue.append(discard)
            self._queued_n += int(discard.size)
            self._queued_launches += 1
        if not self._queued_n:
            return
        if (self._queued_launches >= self.discard_batch or self._queued_n >= DISCARD_BATCH_BLOCKS
                or any(m.size and self._queued[m].any() for m in moving)):
            self._issue_discards()

    def _unqueue(self, blocks: np.ndarray, why: str) -> np.ndarray:
        """Take ``blocks`` out of the batch (refused for ``why``); returns those that were in it."""
        if not self._queued_n or not blocks.size:
            return blocks[:0]
        hit = blocks[self._queued[blocks]]
        if hit.size:
            self._queued[hit] = False
            self._queued_n -= int(hit.size)
            self.refused[why] += int(hit.size)
        return hit

    def _reused(self, blocks: np.ndarray) -> None:
        """A launch uses ``blocks``: those in the batch were handed out again by the allocator; they leave it, and
        those that were on the GPU are resident in the books again (their discard was never made)."""
        hit = self._unqueue(blocks, "reused_before_issue")
        if hit.size:
            self.res.kept(hit[self._was_resident[hit]])

    def _issue_discards(self) -> None:
        """Hand the batch to the mover (``Mover.discard``: the compute stream gated once, then ``_check`` on the
        mover thread, then the discard of those still dead and the gate opened); each ticket is used up."""
        if not self._queued_n:
            self._queue, self._queued_launches = [], 0
            return
        ids = np.concatenate(self._queue)
        ids = np.unique(ids[self._queued[ids]])
        self._queue, self._queued_n, self._queued_launches = [], 0, 0
        self._queued[ids] = False
        bs = self.block_size
        items = [self.ranges(ids[k:k + 1]) for k in range(ids.size)]
        blocks, seqs = self._addr[ids] // bs, self._queued_seq[ids].copy()
        mark = self.mover.discard(items, after=int(self._move_mark[ids].max()), check=lambda: self._check(blocks, seqs))
        self._disc_mark[ids] = mark
        self.gate_closures += bool(mark)

    def _drop_batch(self, why: str) -> None:
        """The batch without a discard: its blocks are evicted instead (the books already count them gone; their
        data is kept), refused for ``why``."""
        if not self._queued_n:
            return
        ids = np.unique(np.concatenate(self._queue))
        ids = self._unqueue(ids, why)
        self._queue, self._queued_launches = [], 0
        self.mover.prefetch(self.ranges(ids), to_device=False, after=self._after_discards(ids))

    def discards_iteration_end(self) -> None:
        """An iteration ends: the batch is issued; the gate's closures in the iteration are recorded."""
        if self.discard_on:
            self._issue_discards()
        self.gate_closures_per_iteration.append(self.gate_closures - self._closures_before)
        self._closures_before = self.gate_closures

    def _populate(self, pf: np.ndarray, populate: np.ndarray) -> np.ndarray:
        """The prefetches of a Decision's ``populate`` blocks (dead to the policy, written first by the running launch)
        go to the mover's discard stream (``Mover.populate``): behind the blocks' last discard, which mapped them
        without data there, and not behind the move stream's queue. A prefetch never loses data, whatever the block
        holds. Returns the other prefetches."""
        pp = np.isin(pf, populate)
        if pp.any():
            blocks = pf[pp]
            mark = self.mover.populate(self.ranges(blocks, keep_order=True), after=int(self._move_mark[blocks].max()))
            if mark:
                self._disc_mark[blocks] = mark
            self.populated_blocks += int(blocks.size)
        return pf[~pp]

    def _check(self, blocks: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """On the mover thread, the compute stream gated: which candidates are still dead from their death (every
        allocator event numbered before now fed first); refused ones are evicted instead and counted by reason.
        With ``UVMPREFETCH_DISCARD_AUDIT=1`` a fresh rebuild from ``torch.cuda.memory_snapshot()`` must call each
        dead too (a disagreement is refused, counted and the allocation kept in ``audit_cases``)."""
        ok, why = self.feed.check(blocks, seqs)
        if why is not None:
            self.refused["unknown"] += int(blocks.size)
            return ok
        self.refused["reused_before_issue"] += int((~ok).sum())
        if self.audit and ok.any():
            ok = self._audit(blocks, ok)
        self.discarded_blocks += int(ok.sum())
        return ok

    def _audit(self, blocks: np.ndarray, ok: np.ndarray) -> np.ndarray:
        import torch

        from .liveness import Liveness
        snap = torch.cuda.memory_snapshot()
        fresh = Liveness(self.block_size, self.device)
        fresh.quiescent(lambda: snap)
        agree = fresh.dead_mask(blocks)
        bad = ok & ~agree
        if bad.any():
            self.refused["audit"] += int(bad.sum())
            bs = self.block_size
            for b in blocks[bad].tolist()[:max(0, 20 - len(self.audit_cases))]:
                held = [{"address": int(x["address"]), "size": int(x.get("requested_size", x.get("size", 0))),
                         "state": x.get("state")} for g in snap for x in g.get("blocks", ())
                        if x.get("state") != "inactive" and int(x["address"]) < (b + 1) * bs
                        and int(x["address"]) + int(x.get("requested_size", x.get("size", 0))) > b * bs]
                self.audit_cases.append({"block": int(b), "held_by": held[:4]})
                if len(self.audit_cases) <= 3:
                    print(f"uvmprefetch: discard audit: block {b * bs:#x} is dead to the allocator feed but the "
                          f"snapshot holds {held[:2]}; not discarded", file=sys.stderr)
        return ok & agree

    def liveness_result(self) -> dict:
        """``backend_result.liveness``: where deaths come from, what the allocator feed saw, the discards issued
        and refused by reason, the unknown kernels the shim counted (``bench/gpu/discards.py`` reads these)."""
        shim = getattr(self, "shim", None)
        unknown = shim.unknown_kernels() if getattr(self, "counts_unknown", False) and shim is not None else None
        out = {"source": "allocator" if self.feed is not None else self.liveness_why,
               "built_for": self.feed.lib.tracker_built_for() if self.feed is not None else None,
               "discards_issued": self.discarded_blocks,
               # closures of the compute stream's gate (one per batch of discards), in all and per iteration
               "discard_batch": self.discard_batch, "gate_closures": self.gate_closures,
               "gate_closures_per_iteration": list(self.gate_closures_per_iteration),
               "populates_issued": self.populated_blocks,
               "discards_refused": dict(self.refused, off=self.discards_as_evictions),
               # kernels no recorded op accounts for (see unknown_kernels); they do not restrict discards: what they
               # may touch is an allocation the caching allocator holds, or memory outside its segments, never a
               # block the books call dead (docs/runtime.md, "Unknown kernels")
               "unknown_kernels_seen": None if unknown is None else unknown["launches"] + unknown["graph_launches"],
               "unknown_kernels": unknown,
               "audit": {"on": self.audit, "cases": self.audit_cases} if self.audit else None}
        if self.feed is not None:
            st = self.feed.stats()
            out.update(allocations_seen=st["allocations_seen"], events=st["events"], deaths=st["deaths"],
                       released_blocks=st["released_blocks"], overflows=st["overflows"], resyncs=st["resyncs"],
                       unknown=st["unknown"], us_per_event=st["us_per_event"], stats=st)
        return out
