"""Where each iteration's host-to-device bytes go: data brought to the GPU for the first time in the iteration, or
brought back after an eviction in the same iteration, for ``uvmprefetch`` and the ``oracle`` side by side.

``python bench/refetch.py t5-base --oversub 3`` replays a standard trace (or a ``.uvmt`` file) under each policy of
``--policies`` (default ``uvmprefetch,oracle``) with the command line's default GPU profile and host model, and
splits every block that crosses the link with data (a prefetch, a copy-in or a fault) by

- ``first``: the block's data crosses for the first time in the iteration (it was off the GPU when the iteration
  began, or it was on the GPU then and left during the iteration); ``again``: its data already crossed in this
  iteration, left again and comes back (the traffic an iteration that moves each block at most once does not
  have), by who evicted it (``policy``: the Decision's evictions and refused discards,
  ``driver``: the caller's own victims when the policy left no room), whether a launch used it between its arrival
  and that eviction (``used`` / ``unused``), and, for ``uvmprefetch``, the victim's class at its eviction as
  ``victims.py`` ranks it (``dead``, ``clean``/``dirty`` with the predicted use ``passed`` or ``none``, ``ahead``:
  its predicted use lies ahead of the pointer) and whether a learned move involves it (``moved``: a recorded block
  whose tensor the moves placed elsewhere, ``translated``: the block a move sends a recorded one to);
- ``not needed``: data that moved although every allocation in the block was freed since a launch last touched it
  (only where dead data is not dropped: ``--no-discard``).

Beside the bytes: how far (in launches) the eviction lay before the fetch that undid it (median). Blocks brought in
without data (populates, zero-fills) are counted apart. Each table's rows add up to the replay's
``iteration_bytes_htod`` (the script checks it, and that the tracked replays took the same time as untracked ones;
it exits 1 otherwise).
"""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvmprefetch.sim.replay  # noqa: E402,F401
from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.policy.uvmprefetch import UvmPrefetchPolicy  # noqa: E402
from uvmprefetch.policy.uvmprefetch.history import INF  # noqa: E402
from uvmprefetch.sim.engine import GpuModel  # noqa: E402

from bench.wasted_prefetch import parse_iterations, replay_arguments  # noqa: E402

replay_mod = sys.modules["uvmprefetch.sim.replay"]  # (the package's ``replay`` names the function)

WHO = ("policy", "driver", "discard")


def victim_class(pol, x: int, target: np.ndarray) -> str:
    """Block ``x``'s class as ``uvmprefetch``'s victim ranking (``victims._vkey``) sees it now, with its move role
    (``target``: the blocks a learned move sends a recorded one to)."""
    h, bs = pol.history, pol.blocks
    p = h.p if h.p is not None else -1
    v = int(h.nu[x])
    unpred = v >= INF or v <= p
    why = "none" if v >= INF else "passed"
    if bs.dead[x] and (unpred or not pol.params.dead_reuse):
        cls = "dead"
    elif unpred:
        cls = f"{'dirty' if bs.dirty[x] else 'clean'}, {why}"
    else:
        cls = "ahead"
    remap = pol.moves.remap
    if remap[x] != x:
        cls += ", moved"
    elif target[x]:
        cls += ", translated"
    return cls


class Ledger(GpuModel):
    """The simulated GPU with every block that crosses the link followed: its arrivals with data and its
    evictions (who, whether used since its arrival, its class), per iteration (the count of ``end_iteration``
    calls, as ``iteration_bytes_htod`` cuts them)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        n = self.max_blocks
        self.k = 0  # iteration
        self.cur = 0  # running launch index
        self.who = "discard"  # who is evicting now (``_evict`` called outside the two wrappers: a discard's drop)
        self.cross_iter = np.full(n, -1, dtype=np.int64)  # iteration in which the block's data last crossed H2D
        self.ev_at = np.zeros(n, dtype=np.int64)  # launch index of it
        self.ev_tag = np.empty(n, dtype=object)  # (who, used, class) of it
        self.used = np.zeros(n, dtype=bool)  # a launch touched it since it last arrived
        self.bytes = defaultdict(int)  # (iteration, row) -> blocks with data
        self.dist = defaultdict(list)  # (iteration, row) -> launches from eviction to fetch
        self.nodata = defaultdict(int)  # iteration -> blocks brought in without data
        self.ev_next = np.zeros(n, dtype=np.int64)  # launches from it to the block's next use (in truth)
        self.on_at_start = np.zeros(n, dtype=bool)  # on the GPU (or on its way) when the iteration began
        self.pol = self.policy if isinstance(self.policy, UvmPrefetchPolicy) else None
        lay = kw["layout"]
        self.n_launches = L = lay.ptr.shape[0] - 1
        launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(lay.ptr))
        self.acc = np.sort(lay.blocks.astype(np.int64) * (L + 1) + launch_of)  # every access, by block then launch

    def next_use(self, x: int, i: int) -> int:
        """The first launch after ``i`` that touches block ``x`` (``n_launches``: none)."""
        L = self.n_launches
        j = int(np.searchsorted(self.acc, x * (L + 1) + i, side="right"))
        return int(self.acc[j] % (L + 1)) if j < self.acc.shape[0] and self.acc[j] // (L + 1) == x else L

    def launch(self, info):
        self.cur = info.index
        out = super().launch(info)
        self.used[np.asarray(info.blocks, dtype=np.int64)] = True
        return out

    def end_iteration(self, k: int) -> None:
        super().end_iteration(k)
        self.k += 1
        self.on_at_start = self.resident | self.in_flight

    def _arrive(self, b: np.ndarray, kind: str) -> None:
        live = ~self.dead[b]
        self.nodata[self.k] += int((~live).sum())
        for x in b[live].tolist():
            again = self.cross_iter[x] == self.k
            self.cross_iter[x] = self.k
            if self.freed[x] and self.touched[x]:
                row = ("not needed", kind, "", "")
            elif again or self.on_at_start[x]:
                who, used, cls = self.ev_tag[x]
                row = ("again" if again else "first, left", kind, f"{who}, {used}", cls)
                self.dist[(self.k, row)].append((self.cur - self.ev_at[x], self.ev_next[x]))
            else:
                row = ("first", kind, "", "")
            self.bytes[(self.k, row)] += 1
        self.used[b] = False

    def _issue(self, b, arrive) -> None:
        self._arrive(b, "prefetch")
        super()._issue(b, arrive)

    def _land(self, blocks, ends, link, now):
        self._arrive(blocks, "fault")
        return super()._land(blocks, ends, link, now)

    def _evict(self, victims, now, to_ssd=False, copy=None):
        if self.pol is not None:
            remap = self.pol.moves.remap
            target = np.zeros(remap.shape[0], dtype=bool)
            target[remap[remap != np.arange(remap.shape[0])]] = True
        for x in victims.tolist():
            cls = victim_class(self.pol, x, target) if self.pol is not None else ""
            self.ev_tag[x] = (self.who, "used" if self.used[x] else "unused", cls)
            self.ev_next[x] = self.next_use(x, self.cur) - self.cur
        self.ev_at[victims] = self.cur
        return super()._evict(victims, now, to_ssd, copy)

    def _evict_to_host(self, b, now, to_ssd=False, copy=None) -> None:
        with self._by("policy"):
            super()._evict_to_host(b, now, to_ssd, copy)

    def _make_room(self, n, now, can_wait, pending=0):
        with self._by("driver"):
            return super()._make_room(n, now, can_wait, pending)

    @contextlib.contextmanager
    def _by(self, who: str):
        old, self.who = self.who, who
        try:
            yield
        finally:
            self.who = old


def tracked_replay(trace, spec: str, **kw) -> tuple[dict, Ledger]:
    """``replay`` with the engine a ``Ledger`` (the module's ``GpuModel`` swapped for the call and put back)."""
    engines = []

    class Caught(Ledger):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            engines.append(self)

    old = replay_mod.GpuModel
    replay_mod.GpuModel = Caught
    try:
        res = replay_mod.replay(trace, make_policy(spec), **kw)
    finally:
        replay_mod.GpuModel = old
    return res, engines[0]


def main(argv: list[str] | None = None) -> int:
    ap = replay_arguments(__doc__.split("\n\n")[0], "1,2,3")
    ap.add_argument("--policies", default="uvmprefetch,oracle", help="comma-separated policy specs")
    args = ap.parse_args(argv)
    from uvmprefetch.errors import ConfigError, UvmPrefetchError
    try:
        its = parse_iterations(args.iterations)
        specs = [s for s in args.policies.split(",") if s]
        if not specs:
            raise ConfigError("--policies: at least one policy expected")
        for s in specs:
            make_policy(s)  # (an unknown name: one line)
        from bench.policy_cost import get_trace
        _, trace = get_trace(args.trace, "gpt2")
        kw = dict(gpu=args.gpu, oversub=args.oversub, host=args.host, evict=args.evict, discards=args.discards)
        runs = []
        for s in specs:
            res, eng = tracked_replay(trace, s, **kw)
            plain = replay_mod.replay(trace, make_policy(s), **kw)
            runs.append((s, res, eng, plain))
        n_it = len(runs[0][1]["iteration_times_s"])
        bad = [i for i in its if not 0 <= i < n_it]
        if bad:
            raise ConfigError(f"--iterations {args.iterations!r}: the trace has iterations 0..{n_it - 1}")
    except (UvmPrefetchError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    gb = runs[0][1].get("block_size", 2 << 20) / 1e9
    for s, res, eng, plain in runs:
        if plain["time_s"] != res["time_s"]:  # (the tracking must not change a decision)
            print(f"error: {s}: the tracked replay took {res['time_s']} s, the plain one {plain['time_s']} s",
                  file=sys.stderr)
            return 1
        for it, want in enumerate(res["iteration_bytes_htod"]):
            got = sum(v for (k, _), v in eng.bytes.items() if k == it) * eng.block_size
            if got != want:
                print(f"error: {s}: iteration {it}: the ledger has {got} bytes H2D, the replay {want}",
                      file=sys.stderr)
                return 1
    names = [s for s, *_ in runs]
    print(f"{args.trace} at {args.oversub}x ({args.gpu}, host {args.host}, evict {args.evict}"
          f"{'' if args.discards else ', no discards'}): H2D GB by why the data crossed; whole run "
          + ", ".join(f"{s} {res['time_s']:.3f} s" for s, res, _, _ in runs))
    for it in its:
        print(f"\niteration {it}: " + ", ".join(
            f"{s} {res['iteration_times_s'][it]:.3f} s, {res['iteration_bytes_htod'][it] / 1e9:.1f} GB H2D, "
            f"{eng.nodata[it] * gb:.1f} GB brought in without data" for s, res, eng, _ in runs))
        rows = sorted({r for _, _, eng, _ in runs for (k, r) in eng.bytes if k == it})
        print("| crossing | by | evicted by, used since arrival | victim class | "
              + " | ".join(f"{s} GB | (launches: eviction to fetch / to next use)" for s in names) + " |")
        print("|---|---|---|---|" + "---|---|" * len(names))
        for r in rows:
            cells = []
            for _, _, eng, _ in runs:
                cells.append(f"{eng.bytes.get((it, r), 0) * gb:.2f}")
                d = np.array(eng.dist.get((it, r), []), dtype=np.int64).reshape(-1, 2)
                cells.append(f"{int(np.median(d[:, 0]))} / {int(np.median(d[:, 1]))}" if d.size else "")
            print(f"| {' | '.join(r)} | {' | '.join(cells)} |")
        tot = [f"{res['iteration_bytes_htod'][it] / 1e9:.2f} | " for _, res, _, _ in runs]
        print(f"| all | | | | {' | '.join(tot)}|")
    return 0


if __name__ == "__main__":
    sys.exit(main())
