"""Where a replay's prefetched data goes: each prefetched block that moves data, by iteration, by kind of guess, and
by what became of it.

``python bench/wasted_prefetch.py t5-base --oversub 3`` replays a standard trace (or a ``.uvmt`` file) under
``uvmprefetch`` (``--policy`` for its parameters) with the command line's default GPU profile and host model and
prints, for each iteration, the prefetched blocks that cross the link, split by

- the guess: ``translated`` (the block a learned move maps a recorded block to), ``as recorded, moved`` (a
  recorded block whose tensor a learned move placed elsewhere: the "both" candidates), ``as recorded`` (no move
  involved), each also split by how the running launch matched (``exact`` / ``soft``);
- the outcome: ``used`` (a launch touched it while resident), ``evicted unused`` (of which ``used later``: a later
  launch of the same iteration touched it after), ``discarded unused``, ``never used`` (still resident and unused
  at the end); the evicted-unused data also by who evicted it (the plan, with the block's predicted use passed or
  none, or ahead of the pointer; the driver).

The policy is the product's, unchanged: a subclass reads its parts after each decision (``moves.remap``,
``history`` ``soft``, ``blocks`` ``dead``/``fresh``) and follows the blocks through the hooks. A block counts as
moving data when it was neither dead nor fresh at its decision (``blocks.moves_data``). A block counts once the
simulator issues its prefetch (``GpuModel._prefetch``, cut to the room and without the blocks already there or on
their way), in the iteration of the decision that listed it: with the live host model a decision waits in the
planner's queue, and by the time the mover applies it some of its blocks were faulted in or find no room (without
discards and with UVM's eviction, most of them: T5 base at 2x, iteration 4 listed 92 GiB, 5 GiB of it was issued).
The script replays once more untracked and exits 1 if the two runs' times differ (the tracking changed a decision)
or if it counted more prefetched bytes than the replay issued.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.policy.uvmprefetch import UvmPrefetchPolicy  # noqa: E402
from uvmprefetch.policy.uvmprefetch.history import INF  # noqa: E402
from uvmprefetch.sim.engine import GpuModel  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402

GUESSES = ("translated", "as recorded, moved", "as recorded")
MATCH = ("exact", "soft")
OUTCOMES = ("used", "evicted unused", "discarded unused", "never used")
# (how an evicted-unused block left: the policy evicted it with its predicted use passed or none, the policy evicted
# it with a use predicted ahead of the pointer, the driver evicted it)
EVICTED = ("policy, use passed or none", "policy, use ahead", "driver")


@contextmanager
def issued_prefetches(report):
    """While it lasts, ``report(blocks)`` receives the blocks each ``GpuModel._prefetch`` call issues (the decision's
    prefetch cut to the room, without those on the GPU or on their way)."""
    prefetch = GpuModel._prefetch

    def tracked(gm, b, now):
        room_for = gm._room_for
        got = []

        def cut(b2, now2):
            r = room_for(b2, now2)
            got.append(r[0])
            return r

        gm._room_for = cut
        try:
            prefetch(gm, b, now)
        finally:
            del gm._room_for
        if got and got[0].size:
            report(got[0])

    GpuModel._prefetch = tracked
    try:
        yield
    finally:
        GpuModel._prefetch = prefetch


class Tracked(UvmPrefetchPolicy):
    """``uvmprefetch`` with its prefetched blocks followed to their first use or their leaving."""

    def on_start(self, ctx) -> None:
        super().on_start(ctx)
        n = ctx.max_blocks
        self.it = 0
        self.pending = np.full(n, -1, dtype=np.int64)  # row in ``rows`` of a block prefetched and not used yet
        # the last decision that listed a block for prefetch and moved data: [iteration, guess, soft] (-1: none)
        self.intent = np.full((n, 3), -1, dtype=np.int64)
        self.listed: dict[int, int] = {}  # iteration -> blocks its decisions listed for prefetch (moving data)
        self.rows: list[list[int]] = []  # [iteration, guess, soft, outcome, used later, how evicted]
        self.left_unused: dict[int, int] = {}  # row -> iteration it left in (evicted unused)
        self.later = 0

    def _settle(self, blocks: np.ndarray, outcome: int, how: int = 0) -> None:
        b = blocks[self.pending[blocks] >= 0]
        if outcome == 1 and how == 0:
            p = self.history.p
            ahead = (self.history.nu[b] > p) & (self.history.nu[b] < INF) if p is not None else np.zeros(b.size, bool)
        for i, x in enumerate(b):
            r = self.rows[self.pending[x]]
            r[3] = outcome
            if outcome == 1:
                r[5] = 2 if how else int(ahead[i])
            if outcome == 1:
                self.left_unused[int(x)] = self.pending[x]
        self.pending[b] = -1

    def on_launch(self, info, state):
        blk = np.asarray(info.blocks, dtype=np.int64)
        if blk.size:
            self._settle(blk, 0)
            # an evicted-unused block touched again in the same iteration: its prefetch was early, not wrong
            for x in blk:
                row = self.left_unused.pop(int(x), None)
                if row is not None and self.rows[row][0] == self.it:
                    self.rows[row][4] = 1
        bs = self.blocks
        moving = ~(bs.dead | bs.fresh)  # (before the decision: mark_prefetched changes them)
        moving = moving.copy()
        dec = super().on_launch(info, state)
        if dec is not None:
            for arr, outcome in ((dec.evict, 1), (dec.discard, 2)):
                if len(arr):
                    self._settle(np.asarray(arr, dtype=np.int64), outcome)
            pf = np.asarray(dec.prefetch, dtype=np.int64)
            self.intent[pf] = -1  # (listed last by this decision: counted only where it moves data)
            pf = pf[moving[pf]] if pf.size else pf
            if pf.size:
                remap = self.moves.remap
                src = np.flatnonzero(remap != np.arange(remap.shape[0]))
                target = np.zeros(remap.shape[0], dtype=bool)
                target[remap[src]] = True
                moved = np.zeros(remap.shape[0], dtype=bool)
                moved[src] = True
                soft = int(self.history.r["soft"] > 0)
                self.intent[pf, 0] = self.it
                self.intent[pf, 1] = np.where(target[pf], 0, np.where(moved[pf], 1, 2))
                self.intent[pf, 2] = soft
                self.listed[self.it] = self.listed.get(self.it, 0) + pf.size
        return dec

    def issued(self, blocks: np.ndarray) -> None:
        """The simulator issued these blocks' prefetch: a row for each a decision listed (moving data)."""
        for x in blocks[self.intent[blocks, 0] >= 0]:
            it, g, soft = self.intent[x]
            self.pending[x] = len(self.rows)
            self.rows.append([int(it), int(g), int(soft), 3, 0, 0])
        self.intent[blocks] = -1

    def on_evict(self, blocks) -> None:
        self._settle(np.asarray(blocks, dtype=np.int64), 1, how=1)
        super().on_evict(blocks)

    def on_iteration(self, k: int) -> None:
        self.it += 1
        super().on_iteration(k)


def replay_arguments(description: str, iterations: str) -> argparse.ArgumentParser:
    """A parser with the replay settings this script, ``bench/refetch.py`` and ``bench/link_idle.py`` take
    (``iterations``: the default of ``--iterations``)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("trace", help="a standard trace's name (recorded if missing) or a .uvmt file")
    ap.add_argument("--oversub", type=float, default=3.0)
    ap.add_argument("--gpu", default="h100-pcie")
    ap.add_argument("--host", default="live", help="the host model (the preset's decision cost is fixed, so the "
                    "tracking's own time does not count)")
    ap.add_argument("--evict", default="auto")
    ap.add_argument("--no-discard", dest="discards", action="store_false")
    ap.add_argument("--iterations", default=iterations,
                    help=f"comma-separated iterations to print (default {iterations})")
    return ap


def parse_iterations(text: str) -> list[int]:
    """``--iterations``' value as integers; a ConfigError naming it otherwise."""
    from uvmprefetch.errors import ConfigError
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--iterations {text!r}: comma-separated integers expected") from None


def trace_and_policy(args, verb: str):
    """``(iterations, trace, policy)`` of the command line; ``ConfigError`` naming what is wrong (``verb``: what the
    script does to the policy, for the message)."""
    from uvmprefetch.errors import ConfigError
    its = parse_iterations(args.iterations)
    from bench.policy_cost import get_trace
    _, trace = get_trace(args.trace, "gpt2")
    spec = make_policy(args.policy)
    if not isinstance(spec, UvmPrefetchPolicy):
        raise ConfigError(f"--policy {args.policy!r}: only uvmprefetch is {verb}")
    n_it = len(set(trace.launch_iter[trace.launch_iter >= 0].tolist()))
    if any(not 0 <= i < n_it for i in its):
        raise ConfigError(f"--iterations {args.iterations!r}: the trace has iterations 0..{n_it - 1}")
    return its, trace, spec


def main(argv: list[str] | None = None) -> int:
    ap = replay_arguments(__doc__.split("\n\n")[0], "1")
    ap.add_argument("--policy", default="uvmprefetch", help="uvmprefetch[:k=v,...]")
    args = ap.parse_args(argv)
    from uvmprefetch.errors import UvmPrefetchError
    try:
        its, trace, spec = trace_and_policy(args, "tracked")
        pol = Tracked(spec.params)
        with issued_prefetches(pol.issued):
            res = replay(trace, pol, args.gpu, oversub=args.oversub, host=args.host,
                         evict=args.evict, discards=args.discards)
        plain = replay(trace, make_policy(args.policy), args.gpu, oversub=args.oversub, host=args.host,
                     evict=args.evict, discards=args.discards)
    except (UvmPrefetchError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if plain["time_s"] != res["time_s"]:  # (the tracking must not change a decision)
        print(f"error: the tracked replay took {res['time_s']} s, the plain one {plain['time_s']} s", file=sys.stderr)
        return 1
    block = res.get("block_size", 2 << 20)
    gib = block / 2**30
    rows = np.array(pol.rows, dtype=np.int64).reshape(-1, 6)
    if rows.shape[0] * block > res["prefetch_issued_bytes"]:  # (a block counted that the replay did not issue)
        print(f"error: {rows.shape[0] * gib:.2f} GiB counted, {res['prefetch_issued_bytes'] / 2**30:.2f} GiB "
              f"issued by the replay", file=sys.stderr)
        return 1
    print(f"{args.trace} at {args.oversub}x, {args.policy}: whole run {res['time_s']:.3f} s, "
          f"{res['prefetch_issued_bytes'] / 2**30:.2f} GiB of prefetches issued; prefetched blocks that move data "
          f"(GiB; the same decisions as an untracked replay)")
    for it in its:
        r = rows[rows[:, 0] == it]
        print(f"\niteration {it}: {r.shape[0] * gib:.2f} GiB prefetched ({pol.listed.get(it, 0) * gib:.2f} listed by "
              f"its decisions), iteration time {res['iteration_times_s'][it]:.3f} s")
        print(f"| guess | match | {' | '.join(OUTCOMES)} | (evicted unused, used later) | total |")
        print("|---|---|" + "---|" * (len(OUTCOMES) + 2))
        for g, gname in enumerate(GUESSES):
            for s, sname in enumerate(MATCH):
                q = r[(r[:, 1] == g) & (r[:, 2] == s)]
                cells = [f"{(q[:, 3] == o).sum() * gib:.2f}" for o in range(len(OUTCOMES))]
                later = ((q[:, 3] == 1) & (q[:, 4] == 1)).sum() * gib
                print(f"| {gname} | {sname} | {' | '.join(cells)} | {later:.2f} | {q.shape[0] * gib:.2f} |")
        cells = [f"{(r[:, 3] == o).sum() * gib:.2f}" for o in range(len(OUTCOMES))]
        later = ((r[:, 3] == 1) & (r[:, 4] == 1)).sum() * gib
        print(f"| all | | {' | '.join(cells)} | {later:.2f} | {r.shape[0] * gib:.2f} |")
        ev = r[r[:, 3] == 1]
        print("evicted unused, by who and why: " + ", ".join(
            f"{name} {(ev[:, 5] == k).sum() * gib:.2f}" for k, name in enumerate(EVICTED)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
