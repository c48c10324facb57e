"""``oracle``: the limit with perfect knowledge of the future (offline; needs the trace's layout).

- Eviction is Belady's: the resident block whose next use is farthest away goes first, and only for a
  block that is needed *before* it (never-used-again blocks are the farthest of all).
- Prefetch is scheduled as early as capacity and the link allow: at every launch the planner walks
  forward from the first launch not yet covered (the *horizon*) and queues each upcoming launch's missing
  blocks, in order of need, while free room or a Belady victim used later than that launch exists.
  The H2D queue is FIFO, so queueing in order of need is what keeps the earliest needs first.
  A victim the walk evicts is missing for the launches it reaches later: at its next use it is queued
  again (``refetch``; the horizon moves back when a victim for the running launch is used behind it).
- Pacing (``pace``): evictions for later launches only while the link would idle before the next decision
  point, the end of the running launch; with ``stall_aware`` that launch starts only once its blocks in
  flight have arrived (FIFO estimate), so the point is later when it waits.
  ``refetch=false,stall_aware=false`` is the oracle before both (weaker: launches whose blocks were evicted
  in a walk that had already passed them got them only when they ran, late).
- Eviction path: every eviction takes the copy path where the caller has it (``--evict auto``: the base
  ``Policy.evict_path``, COPY) and the block is eligible; the others, and every eviction under ``--evict uvm``,
  are UVM's. The pacing's link estimate stays UVM's per-block H2D time: a copy-in of a run of blocks costs about
  the same per block (2 us + 2 MiB / 55 GB/s on the calibrated profiles, against 42 us).

It is the reference every real policy is compared with. It is not a proof of optimality: Belady
minimises misses, not write-backs, and the simulator's timing adds queueing effects, but it is the best
schedule a prefetcher with perfect knowledge and the driver's mechanisms could reasonably reach.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from .base import EMPTY, Decision, LaunchInfo, Params, Policy, PolicyContext, ResidencyView


@dataclass(frozen=True)
class OracleParams(Params):
    lookahead: int = 0  # launches ahead the planner may prefetch for (0 = as far as capacity allows)
    prefetch: bool = True  # False: Belady eviction only (faults bring the data in)
    pace: bool = True  # evict for later launches only while the link would idle before the next launch (+ lead_s)
    lead_s: float = 0.0  # extra link time queued beyond the next decision point
    # Blocks evicted in a decision are missing for the launches the same walk reaches later (their next
    # use): True queues them again there; False (the old behaviour) still counts them present, so they come
    # back only when their own launch runs, late.
    refetch: bool = True
    # The next decision point is when launch i ends: True counts launch i's own wait for its blocks still in
    # flight (their estimated arrival on the FIFO link), False assumes it starts now.
    stall_aware: bool = True

    def __post_init__(self) -> None:
        if self.lookahead < 0:
            raise ConfigError(f"oracle: lookahead must be >= 0, got {self.lookahead}")
        if not self.lead_s >= 0:
            raise ConfigError(f"oracle: lead_s must be >= 0, got {self.lead_s}")


class OraclePolicy(Policy):
    """Belady eviction + perfect-knowledge prefetch (offline)."""

    name: ClassVar[str] = "oracle"
    offline: ClassVar[bool] = True
    Params: ClassVar[type] = OracleParams
    description: ClassVar[str] = "perfect knowledge: Belady eviction + prefetch as early as capacity allows"

    def on_start(self, ctx: PolicyContext) -> None:
        super().on_start(ctx)
        lay = ctx.layout
        if lay is None:
            raise ConfigError("oracle is an offline policy: it needs the whole trace (use it with replay/bench)")
        self.lay = lay
        self.L = lay.n_launches
        self.ptr = lay.ptr
        self.nu = lay.first_use()  # per block: the next launch (from now) that touches it
        self.horizon = 0
        self.scheduled = np.zeros(lay.max_blocks, dtype=bool)
        self.n_prefetched = 0
        self.n_evicted = 0
        self.q_end = 0.0  # estimated end of the H2D queue
        self.t_blk = ctx.gpu.transfer_time(ctx.block_size)
        self.eta = np.zeros(lay.max_blocks)  # estimated arrival of each block queued (FIFO link model)

    def on_launch(self, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        i = info.index
        lay, ptr = self.lay, self.ptr
        if i > 0:
            lay.ran(self.nu, i - 1)
        present = state.resident | state.in_flight
        free = state.capacity_blocks - state.used_blocks
        victims = _Victims(state.resident, self.nu, i)
        if not self.params.prefetch:  # Belady alone: make room for launch i's faults, bring nothing in
            blk = lay.blocks[ptr[i]:ptr[i + 1]]
            rem = int((~present[blk]).sum()) - max(free, 0)
            if rem <= 0:
                return None
            ev = victims.take_any(rem)
            self.n_evicted += ev.shape[0]
            return Decision(evict=ev)
        pf, ev = [], []
        h = i
        q = max(self.q_end, state.now)
        until = None  # the next decision point (+ lead_s): set once launch i's own blocks are queued
        while h < self.L:
            if h > i and self.params.lookahead and h - i > self.params.lookahead:
                break
            blk = lay.blocks[ptr[h]:ptr[h + 1]]
            need = blk[~present[blk] & ~self.scheduled[blk]]
            k = need.shape[0]
            take = min(max(free, 0), k)
            rem = k - take
            if rem and h > i and self.params.pace and until is None:
                until = self._until(info, state)
            if rem and h > i and self.params.pace and q >= until:
                # Evicting now for a later need only risks evicting the wrong block; the link is busy past
                # the next decision point anyway, so issuing later loses nothing. Free room is used greedily.
                break
            if rem:
                v = victims.take(rem, later_than=h)
                if v is None:
                    if h > i:
                        break
                    v = victims.take_any(rem)  # launch i: as much as possible; the engine faults the rest
                    need = need[: take + v.shape[0]]
                ev.append(v)
                if self.params.refetch:
                    present[v] = False  # the walk may reach their next use: they must be queued again
                    if h == i and v.size:  # ... and for launch i, their use may lie behind the horizon
                        self.horizon = min(self.horizon, int(self.nu[v].min()))
            free -= take
            if need.size:
                pf.append(need)
                self.scheduled[need] = True
                self.eta[need] = q + self.t_blk * np.arange(1, need.shape[0] + 1)
                q += need.shape[0] * self.t_blk
            h = max(h + 1, self.horizon) if h == i else h + 1
        self.horizon = h if self.params.refetch else max(self.horizon, h)
        self.q_end = q
        prefetch = np.concatenate(pf) if pf else EMPTY
        evict = np.concatenate(ev) if ev else EMPTY
        self.scheduled[prefetch] = False
        self.n_prefetched += prefetch.shape[0]
        self.n_evicted += evict.shape[0]
        return Decision(prefetch=prefetch, evict=evict)

    def _until(self, info: LaunchInfo, state: ResidencyView) -> float:
        """When launch ``info.index`` ends (the next decision point), plus ``lead_s``. With ``stall_aware``
        it starts once its blocks in flight (queued earlier or just now) have arrived, by the FIFO estimate."""
        start = state.now
        if self.params.stall_aware:
            cur = self.lay.blocks[self.ptr[info.index]:self.ptr[info.index + 1]]
            fl = cur[state.in_flight[cur] | self.scheduled[cur]]
            if fl.size:
                start = max(start, float(self.eta[fl].max()))
        return start + info.duration + self.params.lead_s

    def report(self) -> dict:
        return {"prefetched_blocks": self.n_prefetched, "evicted_blocks": self.n_evicted, "horizon": self.horizon}


class _Victims:
    """Resident blocks in Belady order (farthest next use first), sorted lazily."""

    def __init__(self, resident: np.ndarray, nu: np.ndarray, now: int) -> None:
        self.resident, self.nu, self.now = resident, nu, now
        self.order: np.ndarray | None = None
        self.pos = 0

    def _ensure(self, n: int) -> None:
        # One full sort per launch, only when room is needed. (A partial selection is no faster here:
        # next-use keys have many ties, on which argpartition degrades badly: measured 15x slower.)
        if self.order is None:
            cand = np.flatnonzero(self.resident)
            cand = cand[self.nu[cand] > self.now]  # blocks of the running launch are never victims
            self.order = cand[np.argsort(-self.nu[cand], kind="stable")]

    def take(self, k: int, later_than: int) -> np.ndarray | None:
        """``k`` victims all used after launch ``later_than``, or None (nothing is taken)."""
        self._ensure(k)
        if self.pos + k > self.order.shape[0]:
            return None
        v = self.order[self.pos:self.pos + k]
        if self.nu[v[-1]] <= later_than:
            return None
        self.pos += k
        return v

    def take_any(self, k: int) -> np.ndarray:
        self._ensure(k)
        v = self.order[self.pos:self.pos + k]
        self.pos += v.shape[0]
        return v
