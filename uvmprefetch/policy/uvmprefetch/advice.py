"""Memory advice, decided once per iteration from what the iteration used.

READ_MOSTLY for blocks read in two consecutive iterations and never written (undone if a write appears): on a
driver without dirty tracking their eviction is free. PREFER_HOST for blocks read exactly once per iteration and
never written, only while the last iteration needed more link time than compute time, and only as many as balance
the two: remote reads move work from the saturated link onto the compute stream. On training traces nearly every
block is written each step (weights by the optimizer, activations by the forward pass), so advice rarely fires.
"""

from __future__ import annotations

import numpy as np

from ..base import Advice
from .parts import record
from .step import ADVICE


class AdviceState:
    """The advice part: the advice given per block, last iteration's uses, this iteration's link and compute time
    (``record``: ``link_blocks``, ``compute_s``, which the compiled hooks add to), and the advice waiting to go
    out with the next decision."""

    def __init__(self, n_blocks: int) -> None:
        self.s = record(ADVICE)
        self.r = self.s[0]
        self.advice = np.zeros(n_blocks, dtype=np.int8)
        self.prev_uses = np.zeros(n_blocks, dtype=np.int32)
        self.pending: list = []

    def end_iteration(self, uses: np.ndarray, written: np.ndarray, iters: int, costs: tuple, counts) -> None:
        """The iteration ``iters`` (counted from 1) ended with ``uses`` per block; ``costs`` is ``(t_blk, remote_s)``:
        a block's transfer time and the time a kernel takes to read one over the link. Decides the advice (with
        ``advise``; ``counts`` takes how many blocks got each), then starts the next iteration's counts."""
        t_blk, remote_s = costs
        out = []
        if iters >= 2:
            b = np.flatnonzero((self.prev_uses > 0) & (uses > 0) & ~written & (self.advice == 0))
            if b.size:
                self.advice[b] = int(Advice.READ_MOSTLY)
                out.append((b, Advice.READ_MOSTLY))
                counts["read_mostly_blocks"] += b.size
        undo = np.flatnonzero((self.advice == int(Advice.READ_MOSTLY)) & written)
        if undo.size:
            self.advice[undo] = 0
            out.append((undo, Advice.UNSET))
        # Remote access pays only when the link, not compute, bounds the iteration.
        link_s = int(self.r["link_blocks"]) * t_blk
        compute = float(self.r["compute_s"])
        if iters >= 2 and link_s > 1.1 * compute and t_blk > 0:
            k = int((link_s - compute) / (t_blk + remote_s))
            once = np.flatnonzero((uses == 1) & (self.prev_uses == 1) & ~written &
                                  (self.advice != int(Advice.PREFER_HOST)))
            if k > 0 and once.size:
                b = once[:k]
                self.advice[b] = int(Advice.PREFER_HOST)
                out.append((b, Advice.PREFER_HOST))
                counts["prefer_host_blocks"] += b.size
        self.pending.extend(out)

    def next_iteration(self, uses: np.ndarray) -> None:
        """This iteration's uses become last iteration's; the counts start over."""
        self.prev_uses[:] = uses
        uses[:] = 0
        self.r["link_blocks"] = 0
        self.r["compute_s"] = 0.0

    def nbytes(self) -> int:
        return int(self.advice.nbytes + self.prev_uses.nbytes)
