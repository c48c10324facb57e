"""``g10``: G10 (Zhang et al., MICRO'23): compile-time planned migrations across GPU, host and SSD (offline).

What is reproduced (docs/tiers.md):

- *Tensor vitality analysis*: from the whole trace (G10 profiles one iteration; the trace is that profile),
  every block's uses give its **inactive periods** (from the end of one use to the start of the next) and
  their length in seconds of compute (the launch durations the replay uses).
- *Smart migration scheduling*: the GPU memory pressure over the run (blocks between their first and last
  use) is brought under the capacity by choosing inactive periods to evict: first those across which the
  block dies (free to evict, zero-filled on return), then the longest; a live period only qualifies when it
  can hide ``min_gap`` x the link round trip. Each chosen live period gets a tier: host memory while the
  planned host occupancy stays under ``host_capacity_bytes`` (shortest periods first), the SSD for the rest
  when they can hide an SSD round trip. Evictions are issued right after the block's last use; prefetches
  are scheduled backwards from each next use on the H2D link and (for SSD periods) the SSD queue before it,
  list-scheduling style (``lead_s`` extra); one whose latest start falls before its eviction (the link is
  overbooked) is due one launch ahead. At run time each return is issued at its due launch at the latest,
  earlier when room is free and the link would otherwise idle before the next launch (``pace``); first uses
  are returns too; blocks the driver evicts on its own come back ``stray_lookahead`` launches ahead.

What is not: G10's UVM page-table extensions and GPU-side SSD access in hardware (here the simulator's
direct GPU<->SSD path stands in: SSD read then the link, docs/tiers.md), its host-side runtime, and its
handling of tensors at sub-block granularity (the plan is per 2 MiB / 64 KiB block, as every policy here).

Without an SSD tier in the GPU profile it plans over GPU and host only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from .base import EMPTY, Decision, LaunchInfo, Params, PolicyContext, ResidencyView
from .planned import PlannedPolicy
from .tables import group_by


@dataclass(frozen=True)
class G10Params(Params):
    min_gap: float = 2.0  # evict only inactive periods >= min_gap x the tier's round-trip time
    headroom: float = 0.0  # plan the pressure under (1 - headroom) x capacity
    lead_s: float = 0.0  # extra lead for every prefetch, seconds
    drop_last: bool = True  # evict a block after its last use in the trace (free when dead)
    pace: bool = True  # pull returns forward only while the link would otherwise idle before the next launch
    stray_lookahead: int = 4  # blocks the driver evicted come back this many launches ahead at the latest

    def __post_init__(self) -> None:
        if not self.min_gap >= 0:
            raise ConfigError(f"g10: min_gap must be >= 0, got {self.min_gap}")
        if not 0 <= self.headroom < 1:
            raise ConfigError(f"g10: headroom must be in [0, 1), got {self.headroom}")
        if self.stray_lookahead < 1:
            raise ConfigError(f"g10: stray_lookahead must be >= 1, got {self.stray_lookahead}")
        if not 0 <= self.lead_s < float("inf"):
            raise ConfigError(f"g10: lead_s must be a finite number >= 0, got {self.lead_s}")


class G10Policy(PlannedPolicy):
    """G10: vitality analysis + planned evictions to host/SSD + backward-scheduled prefetches (offline)."""

    name: ClassVar[str] = "g10"
    Params: ClassVar[type] = G10Params
    description: ClassVar[str] = "G10 (MICRO'23): planned GPU/host/SSD migrations from tensor inactive periods"

    def _plan(self, ctx: PolicyContext) -> None:
        from ..sim.replay import launch_durations  # lazy: sim imports policy
        p = self.params
        lay, gpu, bs = ctx.layout, ctx.gpu, ctx.block_size
        L = lay.n_launches
        dur = np.asarray(launch_durations(ctx.trace, gpu), dtype=np.float64)
        cum = np.concatenate([[0.0], np.cumsum(dur)])
        launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(lay.ptr))
        nxt = lay.next_use()
        blk = lay.blocks
        t_h2d, t_d2h = gpu.transfer_time(bs, "htod"), gpu.transfer_time(bs, "dtoh")
        tier = getattr(gpu, "ssd_bw", 0) > 0
        hc = int(getattr(gpu, "host_capacity_bytes", 0)) // bs if tier else 0
        host_cap = hc if tier and gpu.host_capacity_bytes > 0 else None
        if tier:
            t_rd = bs / gpu.ssd_bw
            t_wr = bs / (gpu.ssd_write_bw or gpu.ssd_bw)
            rt_ssd = t_d2h + t_wr + t_rd + t_h2d + 2 * gpu.ssd_latency_s
        else:
            t_rd = rt_ssd = 0.0
        rt_host = t_h2d + t_d2h
        # Memory pressure without migrations: a block holds room from its first to its last use.
        first = lay.first_use()
        used = first < L
        press = lay.pressure()
        cap = ctx.capacity_blocks * (1.0 - p.headroom)
        self.peak_pressure = int(press.max()) if L else 0
        # Inactive periods: entry e = (launch u, block b) whose next use v is at least two launches later.
        gap = cum[nxt] - cum[np.minimum(launch_of + 1, L)]
        cand = np.flatnonzero((nxt < L) & (nxt - launch_of >= 2) & (gap >= p.min_gap * rt_host))
        # A period across which the block dies (its allocation freed; the block is reused later) holds no data:
        # evicting it is free and it comes back zero-filled. Those go first, then the longest live periods.
        dead = self._dies_within(lay, blk, launch_of, nxt, L)
        self.n_dead_periods = int(dead[cand].sum())
        order = cand[np.lexsort((-gap[cand], ~dead[cand]))]
        chosen = []
        over = press > cap
        if over.any():
            for k, e in enumerate(order.tolist()):
                a, b = int(launch_of[e]) + 1, int(nxt[e])
                seg = press[a:b]
                if seg.max() > cap:
                    seg -= 1
                    chosen.append(e)
                if k % 512 == 511 and press.max() <= cap:
                    break
        chosen = np.asarray(chosen, dtype=np.int64)
        # Tiers: shortest chosen periods take host room first; the rest go to the SSD if they can hide it.
        to_ssd = np.zeros(chosen.shape[0], dtype=bool)
        if tier and host_cap is not None and chosen.size:
            hocc = np.zeros(L, dtype=np.int64)
            for j in np.argsort(gap[chosen], kind="stable").tolist():
                e = chosen[j]
                if dead[e]:
                    continue
                a, b = int(launch_of[e]) + 1, int(nxt[e])
                if hocc[a:b].max() < host_cap or gap[e] < p.min_gap * rt_ssd:
                    hocc[a:b] += 1
                else:
                    to_ssd[j] = True
        # Prefetches, scheduled backwards from their deadlines on the link (and the SSD queue before it).
        issue = np.zeros(chosen.shape[0], dtype=np.int64)
        if chosen.size:
            dl = cum[nxt[chosen]] - p.lead_s
            cur_link = cur_ssd = np.inf
            t_issue = np.zeros(chosen.shape[0])
            lat = gpu.ssd_latency_s if tier else 0.0
            for j in np.argsort(-dl, kind="stable").tolist():
                fin = min(dl[j], cur_link)
                st = fin - t_h2d
                cur_link = st
                if to_ssd[j]:
                    sf = min(st, cur_ssd)
                    ss = sf - t_rd
                    cur_ssd = ss
                    st = ss - lat
                t_issue[j] = st
            issue = np.searchsorted(cum[:L], t_issue, side="right") - 1
        u = launch_of[chosen]
        v = nxt[chosen]
        late = issue <= u + 1  # the link is overbooked: the prefetch cannot start after the eviction in time
        due = np.where(late, np.maximum(u + 2, v - 1), issue)  # last resort for those: one launch ahead
        self.n_periods = int(cand.shape[0])
        self.n_chosen = int(chosen.shape[0])
        self.n_late = int(late.sum())
        self.n_ssd = int(to_ssd.sum())
        ch, ssd = chosen, to_ssd
        # Per-launch evictions (CSR), right after the last use (launch u + 1).
        ev_at = launch_of[ch] + 1
        self.evh_ptr, self.evh = group_by(ev_at[~ssd], blk[ch[~ssd]], L + 1, order=blk[ch[~ssd]])
        self.evs_ptr, self.evs = group_by(ev_at[ssd], blk[ch[ssd]], L + 1, order=blk[ch[ssd]])
        if p.drop_last:  # a block is evicted right after its last use (free when dead by then)
            lastu = np.flatnonzero((nxt >= L) & (launch_of + 1 < L))
            self.dl_ptr, self.dl = group_by(launch_of[lastu] + 1, blk[lastu], L + 1, order=blk[lastu])
        else:
            self.dl_ptr, self.dl = np.zeros(L + 2, dtype=np.int64), EMPTY
        # Returns in deadline order; each is issued at its due launch at the latest, earlier when room is free.
        # First uses are returns too (from wherever the data starts: G10 places tensors before their first use):
        # no eviction before them, due one launch ahead, earlier when room is free.
        fb = np.flatnonzero(used)
        rb = np.concatenate([blk[ch], fb])
        rv = np.concatenate([v, first[fb]])
        rev = np.concatenate([ev_at, np.full(fb.shape[0], -1, dtype=np.int64)])
        rdue = np.concatenate([due, np.maximum(first[fb] - 1, 0)])
        o = np.lexsort((rb, rv))
        self.r_blk, self.r_v, self.r_ev, self.r_due = rb[o], rv[o], rev[o], rdue[o]
        self.r_done = np.zeros(o.shape[0], dtype=bool)
        self.due_ptr, self.due_idx = group_by(self.r_due, np.arange(o.shape[0]), L + 1, order=self.r_v)
        self.head = 0
        self.q_end = 0.0  # estimated end of the H2D queue
        self.t_blk = t_h2d
        # Blocks the driver evicted on its own (the plan's headroom was short): brought back before their next use.
        self.follow_uses(lay)
        self.n_planned = len(self.due_ptr) - 1
        self.issued = dict(prefetch=0, prefetch_early=0, prefetch_stray=0, evict_host=0, evict_ssd=0, drop_last=0)

    @staticmethod
    def _dies_within(lay, blk: np.ndarray, launch_of: np.ndarray, nxt: np.ndarray, L: int) -> np.ndarray:
        """Per entry (launch u, block b, next use v): does b become wholly dead at a free point in (u, v]?"""
        dpt = np.repeat(np.arange(L + 1, dtype=np.int64), np.diff(lay.dptr))
        key = np.sort(lay.dead_blocks.astype(np.int64) * (L + 2) + dpt)
        lo = np.searchsorted(key, blk * (L + 2) + launch_of + 1, side="left")
        hi = np.searchsorted(key, blk * (L + 2) + np.minimum(nxt, L), side="right")
        return hi > lo

    def _decide(self, i: int, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        evh = self.evh[self.evh_ptr[i]:self.evh_ptr[i + 1]]
        evs = self.evs[self.evs_ptr[i]:self.evs_ptr[i + 1]]
        dl = self.dl[self.dl_ptr[i]:self.dl_ptr[i + 1]]
        if dl.size:
            evh = np.concatenate([evh, dl]) if evh.size else dl
        # Due returns.
        d = self.due_idx[self.due_ptr[i]:self.due_ptr[i + 1]]
        d = d[~self.r_done[d]]
        self.r_done[d] = True
        pf = [self.r_blk[d]]
        n_pf = d.shape[0]
        # Early returns into free room (never the room launch i still needs), soonest deadline first.
        present = state.resident | state.in_flight
        need = info.blocks
        free = state.capacity_blocks - state.used_blocks - int((~present[need]).sum()) - n_pf
        while self.head < self.r_v.shape[0] and (self.r_done[self.head] or self.r_v[self.head] <= i):
            self.head += 1
        # Paced: the link queue is kept busy up to the end of this launch (+ lead_s), no further: blocks pulled in
        # earlier would only hold room that the next launches' returns need.
        q = max(self.q_end, state.now) + n_pf * self.t_blk
        if self.params.pace:
            free = min(free, int((state.now + info.duration + self.params.lead_s - q) / self.t_blk) + 1)
        if free > 0 and self.head < self.r_v.shape[0]:
            h = self.head
            w = slice(h, min(self.r_v.shape[0], h + free + 256))
            ok = np.flatnonzero(~self.r_done[w] & (self.r_ev[w] < i) & (self.r_v[w] > i))[:free] + h
            q += ok.shape[0] * self.t_blk
            if ok.size:
                self.r_done[ok] = True
                pf.append(self.r_blk[ok])
                self.issued["prefetch_early"] += ok.shape[0]
                n_pf += ok.shape[0]
        if self.stray.any():
            st = np.flatnonzero(self.stray)
            st = st[~present[st]]
            nu = self.nu[st]
            st, nu = st[nu > i], nu[nu > i]
            o = np.argsort(nu, kind="stable")
            st, nu = st[o], nu[o]
            k = max(free - (n_pf - d.shape[0]), 0)
            take = st[(np.arange(st.shape[0]) < k) | (nu <= i + self.params.stray_lookahead)]
            self.stray[:] = False
            self.stray[st] = True
            if take.size:
                self.stray[take] = False
                pf.append(take)
                n_pf += take.shape[0]
                self.issued["prefetch_stray"] += take.shape[0]
        self.q_end = q
        if not (n_pf or evh.size or evs.size):
            return None
        pf = np.concatenate(pf) if len(pf) > 1 else pf[0]
        self.issued["prefetch"] += n_pf
        self.issued["evict_host"] += evh.shape[0] - dl.shape[0]
        self.issued["evict_ssd"] += evs.shape[0]
        self.issued["drop_last"] += dl.shape[0]
        return Decision(prefetch=pf, evict=evh, evict_ssd=evs)

    def report(self) -> dict:
        return {"planning_s": self.planning_s, "peak_pressure_blocks": self.peak_pressure,
                "inactive_periods": self.n_periods, "dead_periods": self.n_dead_periods,
                "periods_chosen": self.n_chosen,
                "periods_link_bound": self.n_late, "periods_to_ssd": self.n_ssd, **self.issued}
