"""Which launches carry an iteration's stall, and what the copy engines were doing in the time before them.

``python bench/stall_queue.py T5.uvmt --oversub 1.5 --iterations 4`` replays a standard trace (or a ``.uvmt`` file)
under each policy of ``--policies`` (default ``uvmprefetch,oracle``) with the command line's default GPU profile and
host model, with the event timeline, and prints per iteration and policy:

- the iteration's time and its stall: the compute stream's idle time between one launch's end and the next one's
  start; then the ``--top`` launches with the longest wait before them (position in the iteration, kernel, wait,
  the megabytes the launch touches);
- the copy engines per ``--bucket`` milliseconds of the iteration (by the start of each event): launches started,
  D2H runs (one copy-out call where the data is not mirrored, one discard call each: a fixed
  ``copy_call_s + discard_call_s`` on the D2H engine beside the blocks' time), D2H blocks, H2D calls and blocks, and
  the engines' busy milliseconds (an event counts wholly in the bucket it starts in).

A stall that sits on one launch while the D2H engine ran back to back in the buckets before it, in runs of a few
blocks, is the copy-out queue's fixed per-run cost (docs/policies.md "What is left": T5 small at 1.5x).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uvmprefetch.errors import ConfigError  # noqa: E402
from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.sim import copypath  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402

from bench.wasted_prefetch import parse_iterations, replay_arguments  # noqa: E402


class RunLog:
    """D2H runs as ``CopyPath._copy_out`` issues them: ``(start, runs, blocks)`` per call (start: when the D2H engine
    takes it up)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int]] = []

    def __enter__(self):
        orig = copypath.CopyPath._copy_out
        log = self.rows

        def copy_out(cp, b, now):
            t0, calls = max(cp.t_d2h, now), cp.m["discard_calls"]
            rel = orig(cp, b, now)
            log.append((t0, cp.m["discard_calls"] - calls, int(b.shape[0])))
            return rel

        self._orig = orig
        copypath.CopyPath._copy_out = copy_out
        return self

    def __exit__(self, *exc) -> None:
        copypath.CopyPath._copy_out = self._orig


def iteration_tables(trace, r: dict, runs: list, it: int, top: int, bucket_s: float) -> list[str]:
    """The lines printed for one iteration of one replay (``r`` with its timeline)."""
    tl = r["timeline"]
    li = trace.launch_iter
    comp = sorted(tl["compute"])
    waits = []
    prev = None
    for start, end, idx, name in comp:
        if li[idx] == it and prev is not None:
            waits.append((start - prev, idx, name))
        prev = end
    if not waits:
        return [f"iteration {it}: no launches"]
    first = min(i for _, i, _ in waits)
    t0 = next(s for s, _, i, _ in comp if i == first)
    t1 = max(e for _, e, i, _ in comp if li[i] == it)
    names = trace.names
    lines = [f"iteration {it}: {(t1 - t0) * 1e3:.2f} ms, stall {sum(w for w, _, _ in waits) * 1e3:.2f} ms", "",
             "| position | kernel | wait ms | MB the launch touches |", "|---:|---|---:|---:|"]
    for w, idx, _ in sorted(waits, reverse=True)[:top]:
        lines.append(f"| {idx - first} | {names[trace.launch_name[idx]]} | {w * 1e3:.3f} "
                     f"| {trace.launch_bytes[idx] / 2**20:.1f} |")
    agg = defaultdict(lambda: [0, 0, 0, 0, 0, 0.0, 0.0])
    for start, _, idx, _ in comp:
        if li[idx] == it:
            agg[int((start - t0) // bucket_s)][0] += 1
    for start, n_runs, n_blk in runs:
        if t0 <= start < t1:
            a = agg[int((start - t0) // bucket_s)]
            a[1] += n_runs
            a[2] += n_blk
    for key, col, busy in (("d2h", None, 5), ("h2d", 3, 6)):
        for s, e, n, _ in tl[key]:
            if t0 <= s < t1:
                a = agg[int((s - t0) // bucket_s)]
                if col is not None:
                    a[col] += 1
                    a[col + 1] += n
                a[busy] += e - s
    lines += ["", "| ms | launches | D2H runs | D2H blocks | H2D calls | H2D blocks | D2H busy ms | H2D busy ms |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in sorted(agg):
        a = agg[k]
        lines.append(f"| {k * bucket_s * 1e3:.0f} | {a[0]} | {a[1]} | {a[2]} | {a[3]} | {a[4]} | {a[5] * 1e3:.2f} "
                     f"| {a[6] * 1e3:.2f} |")
    return lines


def main(argv=None) -> int:
    ap = replay_arguments(__doc__.split("\n\n")[0], "1")
    ap.add_argument("--policies", default="uvmprefetch,oracle")
    ap.add_argument("--top", type=int, default=5, help="launches listed per iteration (default 5)")
    ap.add_argument("--bucket", type=float, default=5.0, help="milliseconds per row of the engine table (default 5)")
    args = ap.parse_args(argv)
    try:
        its = parse_iterations(args.iterations)
        if args.top < 1:
            raise ConfigError(f"--top {args.top}: at least 1 expected")
        if not args.bucket > 0:
            raise ConfigError(f"--bucket {args.bucket}: a positive number of milliseconds expected")
        from bench.policy_cost import get_trace
        _, trace = get_trace(args.trace, "gpt2")
        n_it = len(set(trace.launch_iter[trace.launch_iter >= 0].tolist()))
        if any(not 0 <= i < n_it for i in its):
            raise ConfigError(f"--iterations {args.iterations!r}: the trace has iterations 0..{n_it - 1}")
        specs = [s for s in args.policies.split(",") if s]
        for spec in specs:
            make_policy(spec)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for spec in specs:
        with RunLog() as log:
            r = replay(trace, make_policy(spec), args.gpu, oversub=args.oversub, host=args.host, evict=args.evict,
                       discards=args.discards, timeline=True)
        print(f"## {spec} at {args.oversub}x: whole run {r['time_s']:.4f} s, steady state {r['steady_slowdown']:.4f}x "
              f"ideal, D2H runs {r['discard_calls']}, copy-in calls {r['repopulate_calls']}\n")
        for it in its:
            print("\n".join(iteration_tables(trace, r, log.rows, it, args.top, args.bucket * 1e-3)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
