"""When the H2D link idles while a block a later launch stalls on is missing, and why the plan did not bring it then.

``python bench/link_idle.py t5-base --oversub 3 --iterations 2,3,4`` replays a standard trace (or a ``.uvmt`` file)
under ``uvmprefetch`` (``--policy`` for its parameters) twice, with the command line's default GPU profile and host
model, and the ``oracle`` once for comparison, and prints per iteration:

- the time, the compute stream's stall (all of it; that of the launches that fault; that of the optimizer step, the
  iteration's last ``--step`` launches), the H2D link's busy and idle seconds;
- the *lost* link seconds: idle time after a decision while some block that a later launch of the same iteration
  stalls on (it faults, or arrives after the launch could have started) is neither on the GPU nor in flight. The
  idle time goes to the soonest stalling launch with such a block whose predicted next use is about where it is
  needed (at most ``2 * d + 16`` positions past the pointer, ``d`` the launches to it), else to the soonest one, and
  is split evenly over those missing blocks (and how much of it went to the step's launches), each classified by
  what the policy knew at that decision (after its window pass):

  ``not predicted``: its next use is passed or unknown; ``predicted too late``: predicted farther than that;
  ``beyond window``; ``placed, gone since``: predicted before the plan's horizon (planned) yet not on the GPU (left,
  or its next use moved before the horizon since); ``beyond reach, no victim``: predicted between the horizon and
  the window's end, and every resident block but the running launch's is predicted to be used sooner; ``beyond
  reach, victims, ...``: the same with a victim of a later (or no) next use resident, split by the plan's pacing
  budget at that decision (0 after a soft match, 0 after an exact one, above 0);
- the lost link seconds by the kind of missing block: its recorded tensor moved away (a learned move's source), a
  tensor moved into it (a move's target), neither; written this iteration or older data.

A third table shows how the pointer followed the record in each iteration (the first replay): launches matched
exactly (the record's next launch, same blocks), by kernel name only (soft), unpredicted, and the jumps (a resync
through the exact-signature or n-gram tables, or a stable-signature resync) by where they land: into an older record
than the one the pointer followed, elsewhere in that record, into a later record, into this iteration's own launches,
or from no pointer.
Each jump rebuilds every block's next use from the record without the learned moves.

Link idle per launch is measured at decision points: between two launches' decisions the H2D queue works from the
first decision to its end (``t_h2d``), so idle = next decision time - max(this decision time, queue end); waits
inside the queue for room (an eviction's copy-out or write-back still running) count as busy here. The first
replay finds the stalling launches and their blocks, the second (the same decisions: the replay is deterministic,
checked) classifies them at each idle decision. The policy is the product's, unchanged: a subclass reads its parts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.policy.uvmprefetch import UvmPrefetchPolicy  # noqa: E402
from uvmprefetch.policy.uvmprefetch.history import INF  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402

from bench.wasted_prefetch import replay_arguments, trace_and_policy  # noqa: E402

CAUSES = ("not predicted", "predicted too late", "beyond window", "placed, gone since", "beyond reach, no victim",
          "beyond reach, victims, budget 0, soft", "beyond reach, victims, budget 0, exact",
          "beyond reach, victims, budget > 0")
# the missing blocks by kind: its recorded tensor moved away (a learned move's source), a tensor moved into it (a
# target), neither; written this iteration or older data
KINDS = tuple(f"{a}, {b}" for a in ("moved away", "moved into", "unmoved") for b in ("written", "older"))
# how the pointer followed the record: matched, soft, unpredicted; jumps by where they land
FOLLOW = ("exact", "soft", "unpredicted", "jump to an older record", "jump within the followed record",
          "jump to a later record", "jump into this iteration", "jump from no pointer")
_MATCHES = ("matched", "soft", "unpredicted", "resync", "stable_resync")


class Watched(UvmPrefetchPolicy):
    """``uvmprefetch`` with each decision's clock, link queue and stalling blocks noted (the first replay), and, given
    ``culprits``, the missing ones classified at each decision the link idles after (the second)."""

    def on_start(self, ctx) -> None:
        super().on_start(ctx)
        self.t: list[float] = []  # per launch: the GPU's clock at its decision
        self.q: list[float] = []  # per launch: the H2D queue's end after the previous launch (its faults included)
        self.blocks_of: list[np.ndarray] = []
        self.faulted: dict[int, np.ndarray] = {}
        self.late: dict[int, np.ndarray] = {}
        # (second replay, set before it starts) {launch: (idle after it, [(stalling launch, its blocks)...])}
        self.plan_for = getattr(self, "plan_for", None)
        self.cause_s = {}  # (second replay) launch -> {cause: seconds}
        self.kind_s = {}  # (second replay) launch -> {kind of block: seconds}
        self.step_s = {}  # (second replay) launch -> lost seconds attributed to a launch of the optimizer step
        self.step_from = getattr(self, "step_from", None)  # (set before it starts) per launch: its step's first
        self.follow: list[str] = []  # per launch: how the pointer followed the record (FOLLOW)

    def on_launch(self, info, state):
        i = int(info.index)
        now = float(state.now)
        blk = np.asarray(info.blocks, dtype=np.int64)
        if i:
            prev = self.blocks_of[-1]
            arr = state.arrive[prev]
            late = prev[arr > self.t[-1] + 1e-12]  # (arrived after the launch could have started)
            if late.size:
                self.late[i - 1] = late
        self.t.append(now)
        self.q.append(float(state.t_h2d))
        self.blocks_of.append(blk.copy())
        pr = self.plan.r
        before = (float(pr["q_end"]), int(state.capacity_blocks) - int(state.used_blocks) - int(pr["margin"]))
        r = self.history.r
        was = (int(r["p"]) if r["has_p"] else None, int(r["iter_start"]), self.history.starts[:int(r["n_starts"])].copy())
        counts = [self.stats[k] for k in _MATCHES]
        dec = super().on_launch(info, state)
        self.follow.append(self._followed(was, counts))
        self._budget = self._pacing(before, now, float(info.duration))
        if self.plan_for is not None and i in self.plan_for:
            self._classify(i, blk, state)
        return dec

    def _followed(self, was: tuple, counts: list) -> str:
        """How ``find`` placed the pointer for this launch (``was``: the pointer, the iteration's first position and
        the records' first positions before it; ``counts``: the match counts before it), one of ``FOLLOW``."""
        how = next(k for k, c in zip(_MATCHES, counts) if self.stats[k] != c)
        if how in ("matched", "soft", "unpredicted"):
            return {"matched": "exact", "soft": "soft", "unpredicted": "unpredicted"}[how]
        p, it_start, starts = was
        q = int(self.history.r["p"])
        if p is None:
            return "jump from no pointer"
        if q >= it_start:
            return "jump into this iteration"
        rec = starts[starts <= p]
        lo = int(rec[-1]) if rec.size else 0  # (the first and one past the last position of the record followed)
        hi = int(starts[starts > p][0]) if (starts > p).any() else it_start
        if q < lo:
            return "jump to an older record"
        return "jump to a later record" if q >= hi else "jump within the followed record"

    def _pacing(self, before: tuple, now: float, dur: float) -> int:
        """The plan's pacing budget at this decision (``plan.plan``'s formula, from its state before the decision)."""
        pr = self.plan.r
        q_end, free = before
        t_blk = float(pr["t_blk"])
        q = max(q_end, now)
        until = now + dur + float(pr["lead_s"])
        if pr["stall_aware"] and pr["waits"]:
            until += max(0.0, q - now)
        room = (until - (q + max(0, free) * t_blk)) / t_blk
        return max(0, int(np.ceil(room) if self.history.r["soft"] == 0 else room))

    def _classify(self, i: int, cur: np.ndarray, state) -> None:
        idle, later = self.plan_for[i]
        res, infl = state.resident, state.in_flight
        h = self.history
        p = h.p
        nu = h.nu
        first = None
        for j, cand in later:
            miss = cand[~res[cand] & ~infl[cand]]
            if not miss.size:
                continue
            if first is None:
                first = (j, miss)
            if p is None:
                break
            v = nu[miss]
            ok = (v > p) & (v < INF) & (v - p <= 2 * (j - i) + 16)
            if ok.any():  # (the soonest stalling launch with a block predicted about where it is needed)
                first = (j, miss[ok])
                break
        if first is None:
            return
        j, miss = first
        if p is not None:
            horizon = int(self.plan.r["horizon"])
            window = int(self.monitor.window)
            key = nu.copy()
            key[(key <= p) | self.blocks.dead] = INF + 1
            on = res.copy()
            on[cur] = False
            keys = key[on]
        out: dict[str, float] = {}
        kinds: dict[str, float] = {}
        share = idle / miss.size
        remap = self.moves.remap
        src = np.flatnonzero(remap != np.arange(remap.shape[0]))
        target = np.zeros(remap.shape[0], dtype=bool)
        target[remap[src]] = True
        need = j - i  # (launches from this decision to the one that stalls on it: about positions past the pointer)
        for x in miss:
            v = int(nu[x])
            if p is None or not p < v < INF:
                c = 0
            elif v - p > 2 * need + 16:
                c = 1
            elif v > p + window:
                c = 2
            elif v < horizon:
                c = 3
            else:
                c = 4 if not (keys > v).any() else 7 if self._budget else 5 if self.history.r["soft"] else 6
            out[CAUSES[c]] = out.get(CAUSES[c], 0.0) + share
            k = KINDS[(0 if remap[x] != x else 1 if target[x] else 2) * 2
                      + int(self.blocks.w_iter[x] != self.history.r["iters"])]
            kinds[k] = kinds.get(k, 0.0) + share
        self.step_s[i] = idle if j >= self.step_from[i] else 0.0
        self.cause_s[i] = out
        self.kind_s[i] = kinds

    def on_fault(self, info, blocks) -> None:
        self.faulted[int(info.index)] = np.asarray(blocks, dtype=np.int64).copy()
        super().on_fault(info, blocks)


def _idle(pol: Watched, end_s: float) -> np.ndarray:
    """Per launch: the H2D link's idle seconds between its decision and the next one."""
    t = np.asarray(pol.t + [end_s])
    q = np.asarray(pol.q[1:] + [end_s])  # (the queue's end as the next decision found it)
    return np.maximum(0.0, t[1:] - np.clip(q, t[:-1], t[1:]))


def analyse(trace, args, spec) -> tuple[dict, dict, dict]:
    """The two replays: returns (result, per-iteration figures, oracle result)."""
    kw = dict(oversub=args.oversub, host=args.host, evict=args.evict, discards=args.discards, timeline=True)
    first = Watched(spec.params)
    res = replay(trace, first, args.gpu, **kw)
    idle = _idle(first, res["time_s"])
    its = trace.launch_iter
    comp = res["timeline"]["compute"]
    start = np.array([c[0] for c in comp])
    end = np.array([c[1] for c in comp])
    stall = start - np.concatenate([[0.0], end[:-1]])
    culprits = {}
    for j in set(first.faulted) | set(first.late):
        if stall[j] > 0:
            parts = [a for a in (first.faulted.get(j), first.late.get(j)) if a is not None]
            culprits[j] = np.unique(np.concatenate(parts))
    stalled = np.array(sorted(culprits), dtype=np.int64)
    plan_for = {}
    for i in np.flatnonzero(idle > 0):
        k = np.searchsorted(stalled, i, side="right")
        later = [(int(j), culprits[int(j)]) for j in stalled[k:] if its[j] == its[i]]
        if later:
            plan_for[int(i)] = (float(idle[i]), later)
    step_from = np.zeros(its.shape[0], dtype=np.int64)
    for it in set(its.tolist()):
        sel = np.flatnonzero(its == it)
        step_from[sel] = sel[-args.step] if args.step and sel.size >= args.step else sel[-1] + 1
    second = Watched(spec.params)
    second.plan_for = plan_for
    second.step_from = step_from
    res2 = replay(trace, second, args.gpu, **kw)
    if res2["time_s"] != res["time_s"]:
        raise RuntimeError(f"the two replays differ: {res['time_s']} s and {res2['time_s']} s")
    per = {}
    for it in sorted(set(its.tolist())):
        sel = np.flatnonzero(its == it)
        step = sel[-args.step:] if args.step else sel[:0]
        causes = dict.fromkeys(CAUSES, 0.0)
        kinds = dict.fromkeys(KINDS, 0.0)
        for i in sel:
            for c, v in second.cause_s.get(int(i), {}).items():
                causes[c] += v
            for c, v in second.kind_s.get(int(i), {}).items():
                kinds[c] += v
        span = end[sel[-1]] - (end[sel[0] - 1] if sel[0] else 0.0)
        per[it] = dict(time=res["iteration_times_s"][it], stall=float(stall[sel].sum()),
                       fault=float(sum(stall[j] for j in sel if j in first.faulted)),
                       step_stall=float(stall[step].sum()),
                       step_lost=float(sum(second.step_s.get(int(i), 0.0) for i in sel)), idle=float(idle[sel].sum()),
                       busy=float(span - idle[sel].sum()), lost=sum(causes.values()), causes=causes, kinds=kinds,
                       follow={f: sum(first.follow[int(i)] == f for i in sel) for f in FOLLOW})
    orc = replay(trace, make_policy("oracle"), args.gpu, oversub=args.oversub, host=args.host, evict=args.evict,
                 discards=args.discards)
    return res, per, orc


def main(argv: list[str] | None = None) -> int:
    ap = replay_arguments(__doc__.split("\n\n")[0], "2,3,4")
    ap.add_argument("--policy", default="uvmprefetch", help="uvmprefetch[:k=v,...]")
    ap.add_argument("--step", type=int, default=16, help="the iteration's last launches counted as the optimizer "
                    "step (default 16: AdamW's foreach launches)")
    args = ap.parse_args(argv)
    from uvmprefetch.errors import ConfigError, UvmPrefetchError
    try:
        if args.step < 0:
            raise ConfigError(f"--step {args.step}: must be >= 0")
        wanted, trace, spec = trace_and_policy(args, "watched")
        res, per, orc = analyse(trace, args, spec)
    except (UvmPrefetchError, ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.trace} at {args.oversub}x, {args.policy}: whole run {res['time_s']:.3f} s, oracle "
          f"{orc['time_s']:.3f} s ({res['time_s'] / orc['time_s']:.3f}x)")
    print("lost link s: H2D idle after a decision while a block a later launch of the iteration stalls on is missing")
    print("| iteration | time s (oracle) | stall s (oracle) | stall s, faulting launches | step stall s | link busy s "
          f"| link idle s | lost s | of which for the step | {' | '.join(CAUSES)} |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * len(CAUSES))
    for it in wanted:
        r = per[it]
        cells = " | ".join(f"{r['causes'][c]:.3f}" for c in CAUSES)
        print(f"| {it} | {r['time']:.3f} ({orc['iteration_times_s'][it]:.3f}) | {r['stall']:.3f} "
              f"({orc['iteration_stall_s'][it]:.3f}) | {r['fault']:.3f} | {r['step_stall']:.3f} | {r['busy']:.3f} | "
              f"{r['idle']:.3f} | {r['lost']:.3f} | {r['step_lost']:.3f} | {cells} |")
    print("\nlost link s by the missing block's kind")
    print(f"| iteration | {' | '.join(KINDS)} |")
    print("|---|" + "---|" * len(KINDS))
    for it in wanted:
        print(f"| {it} | " + " | ".join(f"{per[it]['kinds'][k]:.3f}" for k in KINDS) + " |")
    print("\nhow the pointer followed the record: launches")
    print(f"| iteration | {' | '.join(FOLLOW)} |")
    print("|---|" + "---|" * len(FOLLOW))
    for it in wanted:
        print(f"| {it} | " + " | ".join(str(per[it]['follow'][f]) for f in FOLLOW) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
