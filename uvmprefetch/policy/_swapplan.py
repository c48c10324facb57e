"""Shared machinery of the swap planners (``capuchin``, ``sentinel``, ``autotm``, ``swapadvisor``); not a policy.

1. ``IterationProfiler`` records one training iteration *online*, from the hooks only: per launch position
   ``p`` (launches counted from the iteration's first) the blocks it touches (``info.blocks``), its
   duration (``info.duration``: the measured kernel time, stalls excluded), and the blocks freed before it
   (``on_free``). ``profile()`` freezes it into a ``Profile`` (CSR arrays).
2. ``gaps(profile)`` cuts every block's uses into *gaps*: use at ``p``, next use at ``q`` (unwrapped:
   ``p < q <= p + P``; a block's last use of the iteration wraps to its first use of the next one, because
   the iteration repeats), the idle time between them, the earliest free inside the gap (the block is
   dead from there: dropping it costs nothing), and per-block figures (uses per iteration, live span).
3. ``plan(...)`` picks gaps to swap, in the caller's priority order, until the modelled GPU occupancy fits
   the capacity at every position: a swapped gap is evicted (or discarded, if dead) right after its use and
   prefetched back at a *trigger* launch: the last launch that starts ``lead_blocks`` block copy times
   (+ ``lead_s``) before the use, on the profile's durations, and never before the launch after the
   eviction. (``alap=True`` instead back-traces every swap-in as late as a FIFO link model lets it finish
   in time; measured worse, see docs/reference-systems.md.) The occupancy model: every block the
   iteration touches holds room at every position except over swapped intervals ``[evict, trigger)``.
4. ``ProfiledSwapPolicy`` (online: profile, plan, replay the plan by position; swap-ins are cut to the
   room the evictions leave and the rest wait, soonest need first) and ``OfflineSwapPolicy`` (the same
   execution, plans computed at ``on_start`` from the trace and layout, one per distinct iteration).

The plan is a list of actions per position (evict / discard / prefetch in order of need), applied from the
next iteration on by position, so it relies on iterations repeating launch for launch and block for block
(true of training under a deterministic caching allocator; a mismatch only costs faults).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .base import EMPTY, Decision, LaunchInfo, Policy, PolicyContext, ResidencyView
from .planned import require_trace
from .tables import group_by


@dataclass
class Profile:
    P: int  # launches in the iteration
    dur: np.ndarray  # (P,) seconds
    ptr: np.ndarray  # (P+1,) CSR into blocks
    blocks: np.ndarray  # int64, sorted unique per position
    free_pos: np.ndarray  # position before which blocks were freed
    free_blk: np.ndarray

    @property
    def n_blocks(self) -> int:
        return int(np.unique(self.blocks).shape[0]) if self.blocks.size else 0


class IterationProfiler:
    """Collects one iteration's launches and frees from the hooks."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._blocks: list[np.ndarray] = []
        self._dur: list[float] = []
        self._free_pos: list[np.ndarray] = []
        self._free_blk: list[np.ndarray] = []

    @property
    def n(self) -> int:
        return len(self._blocks)

    def launch(self, blocks: np.ndarray, duration: float) -> None:
        self._blocks.append(np.asarray(blocks, dtype=np.int64))
        self._dur.append(float(duration))

    def free(self, blocks: np.ndarray) -> None:
        if blocks.size:
            self._free_pos.append(np.full(blocks.shape[0], len(self._blocks), dtype=np.int64))
            self._free_blk.append(np.asarray(blocks, dtype=np.int64))

    def profile(self) -> Profile:
        P = len(self._blocks)
        sizes = np.fromiter((b.shape[0] for b in self._blocks), dtype=np.int64, count=P)
        ptr = np.zeros(P + 1, dtype=np.int64)
        np.cumsum(sizes, out=ptr[1:])
        blocks = np.concatenate(self._blocks) if P else EMPTY
        fp = np.concatenate(self._free_pos) if self._free_pos else EMPTY
        fb = np.concatenate(self._free_blk) if self._free_blk else EMPTY
        return Profile(P, np.asarray(self._dur, dtype=np.float64), ptr, blocks, np.minimum(fp, max(P - 1, 0)), fb)


@dataclass
class Gaps:
    blk: np.ndarray  # block of the gap
    p: np.ndarray  # position of the use that opens it
    q: np.ndarray  # unwrapped position of the next use (p < q <= p + P)
    gap_s: np.ndarray  # idle seconds between the end of launch p and the start of launch q
    dead_at: np.ndarray  # unwrapped position of the earliest free inside the gap (-1: none)
    uses: np.ndarray  # uses of the block per iteration
    span_s: np.ndarray  # the block's live span in the iteration: first use start .. last use end (seconds)
    t0: np.ndarray  # (2P+1,) unwrapped start time of each position
    t1: np.ndarray  # (2P,) unwrapped end time


def gaps(prof: Profile) -> Gaps:
    P = prof.P
    t0 = np.zeros(2 * P + 1)
    np.cumsum(np.concatenate([prof.dur, prof.dur]), out=t0[1:])
    t1 = t0[1:]
    pos_of = np.repeat(np.arange(P, dtype=np.int64), np.diff(prof.ptr))
    order = np.lexsort((pos_of, prof.blocks))
    sb, sp = prof.blocks[order], pos_of[order]
    n = sb.shape[0]
    if n == 0:
        z = EMPTY
        return Gaps(z, z, z, np.zeros(0), z, z, np.zeros(0), t0, t1)
    same = sb[1:] == sb[:-1]
    starts = np.flatnonzero(np.r_[True, ~same])
    ends = np.flatnonzero(np.r_[~same, True])
    q = np.empty(n, dtype=np.int64)
    q[:-1] = sp[1:]
    q[ends] = sp[starts] + P
    gap_s = t0[q] - t1[sp]
    cnt = ends - starts + 1
    uses = np.repeat(cnt, cnt)
    span = np.repeat(t1[sp[ends]] - t0[sp[starts]], cnt)
    dead_at = np.full(n, -1, dtype=np.int64)
    if prof.free_blk.size:
        fb, fpos = prof.free_blk, prof.free_pos
        j = np.searchsorted(sb, fb, side="left")
        e = np.searchsorted(sb, fb, side="right") - 1
        ok = j <= e
        fb, fpos, j, e = fb[ok], fpos[ok], j[ok], e[ok]
        K = 2 * P + 2
        keys = sb * K + sp
        i = np.searchsorted(keys, fb * K + fpos, side="left")
        inside = i - 1 >= j
        g = np.where(inside, i - 1, e)
        fu = np.where(inside, fpos, fpos + P)
        valid = fu < q[g]
        g, fu = g[valid], fu[valid]
        o = np.lexsort((-fu, g))  # per gap keep the earliest free (written last)
        dead_at[g[o]] = fu[o]
    return Gaps(sb, sp, q, gap_s, dead_at, uses, span, t0, t1)


@dataclass
class Plan:
    P: int
    ev_ptr: np.ndarray
    ev: np.ndarray
    dc_ptr: np.ndarray
    dc: np.ndarray
    pf_ptr: np.ndarray
    pf: np.ndarray
    pf_dist: np.ndarray  # launches from the trigger to the need, per prefetch entry
    blocks: np.ndarray  # every block the profile touches (sorted unique)
    stats: dict

    @property
    def empty(self) -> bool:
        return not (self.ev.size or self.dc.size or self.pf.size)

    def actions(self, pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if pos >= self.P:
            return EMPTY, EMPTY, EMPTY, EMPTY
        a, b = self.pf_ptr[pos], self.pf_ptr[pos + 1]
        return (self.ev[self.ev_ptr[pos]:self.ev_ptr[pos + 1]], self.dc[self.dc_ptr[pos]:self.dc_ptr[pos + 1]],
                self.pf[a:b], self.pf_dist[a:b])


def _slices(s: int, r: int, P: int) -> tuple[slice, ...]:
    """Positions ``[s, r)`` (unwrapped, ``0 <= s < r < s + P``) as slices of a length-P array."""
    if r <= P:
        return (slice(s, r),)
    if s >= P:
        return (slice(s - P, r - P),)
    return (slice(s, P), slice(0, r - P))


def plan(prof: Profile, g: Gaps, capacity_blocks: int, t_blk: float, priority: np.ndarray, eligible: np.ndarray,
         lead_s: float = 0.0, headroom: int = 0, interval: int = 1, rounds: int = 3, alap: bool = False,
         lead_blocks: float = 8.0) -> Plan:
    """Swap gaps in ``priority`` order (higher first) among ``eligible`` until occupancy fits.

    ``interval`` > 1 rounds every trigger down to a multiple of ``interval`` positions (prefetch at the
    start of a migration interval, Sentinel's granularity)."""
    t_start = time.perf_counter()
    P = prof.P
    allb = np.unique(prof.blocks) if prof.blocks.size else EMPTY
    nb = int(allb.shape[0])
    cap = capacity_blocks - headroom
    stats = dict(profile_launches=P, profile_blocks=nb, capacity_blocks=int(capacity_blocks), swapped_gaps=0,
                 swapped_dead_gaps=0, peak_occupancy_before=nb, peak_occupancy_after=nb, candidates=0)
    empty = Plan(P, np.zeros(P + 1, dtype=np.int64), EMPTY, np.zeros(P + 1, dtype=np.int64), EMPTY,
                 np.zeros(P + 1, dtype=np.int64), EMPTY, EMPTY, allb, stats)
    if P == 0 or nb <= cap or not g.blk.size:
        stats["planning_s"] = time.perf_counter() - t_start
        return empty
    t0 = g.t0
    dead, s, cost, r_est, ok = swap_intervals(g, t_blk, lead_s, lead_blocks, interval)
    cand = eligible & ok
    idx = np.flatnonzero(cand)
    idx = idx[np.argsort(-priority[idx], kind="stable")]
    stats["candidates"] = int(idx.shape[0])
    occ = np.full(P, nb, dtype=np.int64)
    chosen = np.zeros(g.blk.shape[0], dtype=bool)
    r_fin = r_est.copy()
    sl = s.tolist()
    for _ in range(rounds):
        over = occ.max() > cap
        if not over:
            break
        rl = r_fin.tolist()
        k = 0
        for gi in idx.tolist():
            if chosen[gi]:
                continue
            a, b = sl[gi], rl[gi]
            if b <= a:
                continue
            parts = _slices(a, b, P)
            if max(int(occ[x].max()) for x in parts) <= cap:
                continue
            for x in parts:
                occ[x] -= 1
            chosen[gi] = True
            k += 1
            if (k & 63) == 0 and occ.max() <= cap:
                break
        # ALAP triggers on a FIFO link for what was chosen, then the occupancy is recomputed and the greedy
        # pass goes on if a trigger moved earlier and some launch no longer fits.
        sel = np.flatnonzero(chosen)
        need = t0[g.q[sel]] - lead_s
        o = np.argsort(-need, kind="stable")
        c = cost[sel][o]
        c_prev = np.cumsum(c) - c
        finish = np.minimum.accumulate(need[o] + c_prev) - c_prev
        start = np.empty_like(finish)
        start[o] = finish - c
        r_alap = np.searchsorted(t0, start, side="right") - 1
        if interval > 1:
            r_alap = (r_alap // interval) * interval
        # A copy that cannot be hidden (the link is the bottleneck) starts right after the eviction: late,
        # but the occupancy model holds.
        if alap:
            r_fin[sel] = np.minimum(np.maximum(np.minimum(r_fin[sel], r_alap), s[sel] + 1), g.q[sel])
        sel = np.flatnonzero(chosen)
        occ = occupancy(P, nb, s[sel], r_fin[sel])
        idx = idx[~chosen[idx]]
    stats["peak_pos"] = int(occ.argmax())
    stats["peak_occupancy_after"] = int(occ.max())
    return build_plan(P, g, s, r_fin, chosen, allb, stats, t_start)


def swap_intervals(g: Gaps, t_blk: float, lead_s: float, lead_blocks: float, interval: int = 1):
    """Per gap: dead?, eviction position ``s``, swap-in link cost, fixed-lead trigger ``r`` (unwrapped;
    ``s < r <= q``), and whether the gap can be swapped at all (a launch between its two uses)."""
    t0 = g.t0
    dead = g.dead_at >= 0
    s = np.where(dead, np.maximum(g.p + 1, g.dead_at), g.p + 1)
    cost = np.where(dead, 0.0, t_blk)
    lead_est = lead_s + t_blk * lead_blocks
    r = np.searchsorted(t0, t0[g.q] - np.where(dead, 0.0, lead_est), side="right") - 1
    r = np.minimum(r, g.q - 1)
    if interval > 1:
        r = (r // interval) * interval
    # A swap-in that cannot be hidden is issued right after the eviction's launch (at the latest at the use
    # itself): late, but cheaper than the fault it replaces.
    r = np.minimum(np.maximum(r, s + 1), g.q)
    ok = (g.q - g.p >= 2) & (g.q > s)
    return dead, s, cost, r, ok


def occupancy(P: int, nb: int, s: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Modelled occupancy per position when the gaps ``[s, r)`` (unwrapped) are swapped out."""
    diff = np.zeros(2 * P + 1, dtype=np.int64)
    np.subtract.at(diff, s, 1)
    np.add.at(diff, r, 1)
    red = np.cumsum(diff)[:2 * P]
    return nb + red[:P] + red[P:]


def build_plan(P: int, g: Gaps, s: np.ndarray, r: np.ndarray, chosen: np.ndarray, allb: np.ndarray, stats: dict,
               t_start: float) -> "Plan":
    """Per-position actions for the chosen gaps: evict (live) / discard (dead) at ``s``, prefetch at ``r``."""
    dead = g.dead_at >= 0
    sel = np.flatnonzero(chosen)
    live = sel[~dead[sel]]
    dsel = sel[dead[sel]]
    ev_ptr, ev = group_by(s[live] % P, g.blk[live], P)
    dc_ptr, dc = group_by(s[dsel] % P, g.blk[dsel], P)
    pf_ptr, pf = group_by(r[sel] % P, g.blk[sel], P, order=g.q[sel])
    _, pf_dist = group_by(r[sel] % P, g.q[sel] - r[sel], P, order=g.q[sel])
    stats.update(swapped_gaps=int(live.shape[0]), swapped_dead_gaps=int(dsel.shape[0]),
                 planning_s=time.perf_counter() - t_start)
    return Plan(P, ev_ptr, ev, dc_ptr, dc, pf_ptr, pf, pf_dist, allb, stats)


class ProfiledSwapPolicy(Policy):
    """Hooks shared by the profile-then-swap policies: profile an iteration online, plan, replay the plan.

    Subclasses give ``_priority(g, prof)`` -> (priority, eligible) arrays over gaps, and may set
    ``interval`` / ``lead_s`` / ``headroom`` through their params. Params must have ``profile_iter``
    (the first iteration measured: 0 = the first, as the papers do) and ``reprofile``: ``"never"`` (plan
    once from ``profile_iter``), ``"changed"`` (keep measuring; re-plan when an iteration's launches or
    blocks differ from the profile's: PyTorch's first step is not like the others, it creates the
    optimizer state and warms the allocator, and the layout can settle over the next one) or
    ``"always"`` (re-plan after every iteration).
    """

    def on_start(self, ctx: PolicyContext) -> None:
        super().on_start(ctx)
        self.prof = IterationProfiler()
        self.cur_iter: int | None = None
        self.pos = 0
        self.n_launch = 0
        self.pend_b = self.pend_n = EMPTY
        self.recording = False
        self.plan: Plan | None = None
        self.first_planned = False
        self.t_blk = ctx.gpu.transfer_time(ctx.block_size)
        self.stats = dict(plans=0, evicted_blocks=0, discarded_blocks=0, prefetched_blocks=0, stale_evicted=0)
        self.planning_s = 0.0
        self.last_plan_stats: dict = {}
        self.sig: tuple | None = None
        self._between: list[np.ndarray] = []  # frees seen between iterations (before the next one's first launch)

    def on_free(self, blocks: np.ndarray) -> None:
        if self.cur_iter is None:  # between iterations: they belong to the next one's position 0, if it is recorded
            if blocks.size:
                self._between.append(np.array(blocks, dtype=np.int64))
        elif self.recording:
            self.prof.free(blocks)

    def on_iteration(self, k: int) -> None:
        if self.recording and self.prof.n:
            prof = self.prof.profile()
            sig = (prof.P, hash(prof.ptr.tobytes()), hash(prof.blocks.tobytes()))
            if self.params.reprofile == "changed" and sig == self.sig:
                self.prof.reset()
                self.recording = False
                self.pos = 0
                self.cur_iter = None
                return
            self.sig = sig
            g = gaps(prof)
            pri, elig = self._priority(g, prof)
            P = self.params
            self.plan = plan(prof, g, self.ctx.capacity_blocks, self.t_blk, pri, elig, lead_s=P.lead_s,
                             headroom=P.headroom, interval=getattr(self, "_interval", 1),
                             alap=getattr(P, "alap", False), lead_blocks=P.lead_blocks)
            self.planning_s += self.plan.stats["planning_s"]
            self.last_plan_stats = self.plan.stats
            self.stats["plans"] += 1
            self.first_planned = True
        self.prof.reset()
        self.recording = False
        self.pos = 0
        self.cur_iter = None

    def _priority(self, g: Gaps, prof: Profile) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _iteration_started(self, it: int) -> None:
        P = self.params
        self.recording = it == P.profile_iter or (P.reprofile != "never" and it > P.profile_iter)
        if self.recording:
            self.prof.reset()


    def on_launch(self, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        it = info.iteration
        between, self._between = self._between, []
        if it < 0:
            return None
        if self.cur_iter != it:
            self.cur_iter, self.pos = it, 0
            self._iteration_started(it)
            if self.recording:
                for b in between:  # freed before this iteration's first launch: dead from position 0
                    self.prof.free(b)
        pos = self.pos
        self.pos += 1
        self.n_launch += 1
        if self.recording:
            self.prof.launch(info.blocks, info.duration)
        pl = self.plan
        if pl is None or pl.empty:
            return None
        ev, dc, pf, dist = pl.actions(pos)
        g = self.n_launch
        if self.first_planned:  # blocks the iteration never touches (set-up, first-iteration-only) go first
            self.first_planned = False
            keep = np.zeros(state.resident.shape[0], dtype=bool)
            keep[pl.blocks] = True
            keep[info.blocks] = True
            stale = np.flatnonzero(state.resident & ~keep)
            self.stats["stale_evicted"] += int(stale.shape[0])
            ev = np.concatenate([stale, ev])
        ev = ev[state.resident[ev]]
        dc = dc[state.resident[dc]]
        # Swap-ins: this launch's triggers plus those still waiting for room, soonest need first, cut to the
        # room left after the swap-outs (a swap-in never makes the driver evict); the rest wait.
        pb = np.concatenate([self.pend_b, pf])
        pn = np.concatenate([self.pend_n, g + dist])
        ok = (pn >= g) & ~(state.resident[pb] | state.in_flight[pb])
        pb, pn = pb[ok], pn[ok]
        o = np.argsort(pn, kind="stable")
        pb, pn = pb[o], pn[o]
        room = max(0, state.capacity_blocks - state.used_blocks) + int(ev.shape[0]) + int(dc.shape[0])
        pf = pb[:room]
        _, first = np.unique(pf, return_index=True)
        pf = pf[np.sort(first)]
        self.pend_b, self.pend_n = pb[room:], pn[room:]
        if not (ev.size or dc.size or pf.size):
            return None
        self.stats["evicted_blocks"] += int(ev.shape[0])
        self.stats["discarded_blocks"] += int(dc.shape[0])
        self.stats["prefetched_blocks"] += int(pf.shape[0])
        return Decision(prefetch=pf, evict=ev, discard=dc)

    def report(self) -> dict:
        out = dict(self.stats)
        out["planning_s"] = self.planning_s
        out.update({f"plan_{k}": v for k, v in self.last_plan_stats.items() if k != "planning_s"})
        return out


REPROFILE = ("never", "changed", "always")


def check_common(owner: str, p) -> None:
    """Validation of the parameters every profiled swap policy has."""
    from ..errors import ConfigError
    p.check_ints(owner, ("profile_iter", "headroom"), least=0)
    if p.reprofile not in REPROFILE:
        raise ConfigError(f"{owner}: reprofile must be one of {', '.join(REPROFILE)}, got {p.reprofile!r}")
    for f in ("lead_blocks", "lead_s"):
        if not getattr(p, f) >= 0:
            raise ConfigError(f"{owner}: {f} must be >= 0, got {getattr(p, f)!r}")


def iteration_profiles(trace, layout) -> dict:
    """Offline: one ``Profile`` per training iteration, read from the trace and its layout (what an offline
    planner sees: blocks per launch, the trace's durations, the blocks dead at each free point)."""
    it = np.asarray(trace.launch_iter)
    out = {}
    for k in np.unique(it[it >= 0]).tolist():
        idx = np.flatnonzero(it == k)
        a, b = int(idx[0]), int(idx[-1]) + 1
        ptr = layout.ptr[a:b + 1] - layout.ptr[a]
        blocks = layout.blocks[layout.ptr[a]:layout.ptr[b]]
        d0, d1 = int(layout.dptr[a]), int(layout.dptr[b])
        fb = layout.dead_blocks[d0:d1]
        fpos = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(layout.dptr[a:b + 1]))
        out[k] = Profile(b - a, np.asarray(trace.launch_dur[a:b], dtype=np.float64), ptr, blocks,
                         np.minimum(fpos, max(b - a - 1, 0)), fb)
    return out


class OfflineSwapPolicy(ProfiledSwapPolicy):
    """Hooks of the offline planners: one plan per distinct iteration, computed at ``on_start`` from the
    trace and applied from that iteration's first launch (no measured iteration)."""

    offline = True

    def on_start(self, ctx: PolicyContext) -> None:
        super().on_start(ctx)
        require_trace(ctx, f"{self.name} is an offline planner")
        t = time.perf_counter()
        self.plans: dict = {}
        cache: dict = {}
        profs = iteration_profiles(ctx.trace, ctx.layout)
        budget = self.params.time_limit_s / max(1, len({self._sig(p) for p in profs.values()}))
        for k, prof in profs.items():
            sig = self._sig(prof)
            if sig not in cache:
                cache[sig] = self._plan_offline(prof, gaps(prof), budget)
                self.stats["plans"] += 1
                self.last_plan_stats = cache[sig].stats
            self.plans[k] = cache[sig]
        self.planning_s = time.perf_counter() - t

    @staticmethod
    def _sig(prof: Profile) -> tuple:
        return (prof.P, hash(prof.ptr.tobytes()), hash(prof.blocks.tobytes()))

    def _plan_offline(self, prof: Profile, g: Gaps, budget_s: float) -> Plan:
        raise NotImplementedError

    def _plan_start(self, prof: Profile, g: Gaps, **stats_fields) -> tuple:
        """What every planner starts with: ``(t_start, allb, nb, cap, stats, plan)``, where ``allb`` are the
        profile's blocks (``nb`` of them), ``cap`` the capacity less the headroom, ``stats`` the common figures
        plus ``stats_fields``, and ``plan`` the empty plan when there is nothing to plan (the iteration fits, or
        has no launch or no gap), else None."""
        t_start = time.perf_counter()
        allb = np.unique(prof.blocks) if prof.blocks.size else EMPTY
        nb = int(allb.shape[0])
        cap = self.ctx.capacity_blocks - self.params.headroom
        stats = dict(profile_launches=prof.P, profile_blocks=nb, capacity_blocks=int(self.ctx.capacity_blocks),
                     **stats_fields)
        m = g.blk.shape[0]
        if prof.P == 0 or nb <= cap or not m:
            z = np.zeros(m, dtype=np.int64)
            return t_start, allb, nb, cap, stats, build_plan(prof.P, g, z, z, np.zeros(m, dtype=bool), allb, stats,
                                                             t_start)
        return t_start, allb, nb, cap, stats, None

    def _iteration_started(self, it: int) -> None:
        self.recording = False
        self.plan = self.plans.get(it)
        self.first_planned = self.plan is not None and self.plan is not getattr(self, "_prev_plan", None)
        self._prev_plan = self.plan

    def on_iteration(self, k: int) -> None:
        self.pos = 0
        self.cur_iter = None
