"""``tmof``: TMOF (HPCA'23), swapping for data-parallel GPUs that share the host link.

TMOF's observation: swapping schemes designed for one GPU (vDNN, Capuchin, ...) lose most of their benefit
in data-parallel training, because every GPU runs the same step and so swaps the same tensors at the same
moment, and the GPUs behind one PCIe switch or root port then contend for its bandwidth. TMOF keeps a
Capuchin-like selection (measured iteration, tensors with a long reuse distance are swapped out and
prefetched back in time) and adds two contention-avoidance techniques, reproduced here on top of
``capuchin``'s planner (``_swapplan.py``):

- **Disjoint swapping** (``disjoint``): GPU ``r`` swaps, as far as it can, other data than GPUs ``0..r-1``
  (the gaps they chose go last in its ranking), and prefers gaps whose copies fall where the others'
  copies do not: every rank knows what the lower ranks plan, because data parallelism runs the same step
  everywhere (SPMD) and each rank replays the lower ranks' planning itself. No communication is needed.
- **Bidirectional overlapping** (``bidirectional``): the link load the ranking avoids is kept per direction:
  a swap-out is steered to where the other GPUs' swap-*ins* are (device-to-host is idle then) and a swap-in
  to where their swap-outs are, so the two directions of the PCIe link work at once instead of one.
  Without it both directions count as one load.

How the load is estimated: the lower ranks' plans give, per launch position, the copy time queued in each
direction (swap-outs at the position after the last use, swap-ins at their trigger); a FIFO link fed with
the profile's launch durations turns that into the backlog a copy issued at each position waits behind. A
gap is ranked by Capuchin's free time ``FT`` less those waits at its swap-out and its swap-in positions,
less one more swap-out + swap-in time for each lower rank that swaps the very same gap.

With one GPU (``world == 1``, every single-GPU replay) TMOF is ``capuchin`` exactly; its effect shows in
``uvmprefetch.sim.multigpu.replay_multi`` (``uvmprefetch replay --gpus N``, ``uvmprefetch bench --gpus N``).

Not reproduced: TMOF's offline dynamic-programming planner over the computation graph (the online
Capuchin-like half is what is here), the all-reduce traffic that shares the link in TMOF's setting (not
modelled by the multi-GPU simulator), and TMOF's tensor granularity (the unit here is the 2 MiB block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._swapplan import Gaps, Profile, plan
from .capuchin import CapuchinParams, CapuchinPolicy


@dataclass(frozen=True)
class TmofParams(CapuchinParams):
    disjoint: bool = True  # avoid the gaps and link time the lower ranks use
    bidirectional: bool = True  # ... per direction (swap-out where others swap in, and the reverse)
    weight: float = 0.1  # share of the lower ranks' backlog counted against a gap's free time (measured, docs)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.weight, (int, float)) and 0 <= self.weight <= 10):
            from ..errors import ConfigError
            raise ConfigError(f"tmof: weight must be in [0, 10], got {self.weight!r}")


def _backlog(t0: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Seconds of queued copies ahead of a copy issued at each position, on a FIFO link fed ``load[x]``
    seconds of copies at position ``x``'s start (positions start at ``t0[x]``; two laps of the iteration, so a
    backlog at its end carries over to its start)."""
    P = load.shape[0]
    out = np.zeros(P)
    until = 0.0
    for _ in range(2):
        for x in range(P):
            a = t0[x]
            out[x] = max(0.0, until - a)
            until = max(until, a) + load[x]
        until -= t0[P]
    return out


class TmofPolicy(CapuchinPolicy):
    """Capuchin-style swapping with TMOF's disjoint swapping and bidirectional overlapping across GPUs."""

    name: ClassVar[str] = "tmof"
    Params: ClassVar[type] = TmofParams
    description: ClassVar[str] = ("TMOF (HPCA'23): Capuchin-like swaps, disjoint across data-parallel GPUs, "
                                  "both link directions (use replay/bench --gpus N)")

    def _priority(self, g: Gaps, prof: Profile) -> tuple[np.ndarray, np.ndarray]:
        base, elig = super()._priority(g, prof)
        if self.world <= 1 or self.rank == 0 or not self.params.disjoint:
            return base, elig
        P = prof.P
        t0 = g.t0[:P + 1]
        dead = g.dead_at >= 0
        out_pos = (g.p + 1) % P
        lead = self.t_blk * self.params.lead_blocks + self.params.lead_s
        in_pos = np.searchsorted(g.t0, g.t0[g.q] - lead, side="right") - 1
        in_pos = np.minimum(np.maximum(in_pos, g.p + 1), g.q) % P
        taken = np.zeros(g.blk.shape[0], dtype=np.int64)
        load_out, load_in = np.zeros(P), np.zeros(P)
        pri = base
        for _ in range(self.rank):  # the lower ranks' plans, each made the way that rank makes it
            pl = plan(prof, g, self.ctx.capacity_blocks, self.t_blk, pri, elig, lead_s=self.params.lead_s,
                      headroom=self.params.headroom, alap=self.params.alap, lead_blocks=self.params.lead_blocks)
            load_out += np.diff(pl.ev_ptr) * self.t_blk
            load_in += np.diff(pl.pf_ptr) * self.t_blk
            taken += self._chosen(g, pl, P)
            pri = self._contended(base, dead, taken, out_pos, in_pos, t0, load_out, load_in)
        return pri, elig

    def _contended(self, base, dead, taken, out_pos, in_pos, t0, load_out, load_in) -> np.ndarray:
        """Capuchin's free time less the waits the lower ranks' copies impose on this gap's two copies (and one
        more swap-out + swap-in per lower rank that swaps the very same gap: disjoint sets first)."""
        if self.params.bidirectional:
            wait = _backlog(t0, load_out)[out_pos] + _backlog(t0, load_in)[in_pos]
        else:
            both = _backlog(t0, load_out + load_in)
            wait = both[out_pos] + both[in_pos]
        pri = base - self.params.weight * wait - taken * 2.0 * self.t_blk
        return np.where(dead, base, pri)  # freed data moves no bytes: no contention to avoid

    @staticmethod
    def _chosen(g: Gaps, pl, P: int) -> np.ndarray:
        """Which live gaps a plan swaps out: its evictions, matched to gaps by (block, position after the use).
        (Discarded gaps are not needed: freed data is never penalised.)"""
        K = 2 * P + 2
        pos_e = np.repeat(np.arange(P), np.diff(pl.ev_ptr))
        return np.isin(g.blk * K + (g.p + 1) % P, pl.ev * K + pos_e)

    def report(self) -> dict:
        out = super().report()
        out.update(rank=self.rank, world=self.world)
        return out
