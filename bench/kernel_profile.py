#!/usr/bin/env python3
"""Where the ``uvmprefetch`` policy's time goes inside its one-kernel step: microseconds per launch for each stage
(issue 4's decision cost, taken apart).

``bench/policy_cost.py`` times ``on_launch`` as a whole. This tool compiles a copy of
``uvmprefetch/policy/_uvmkernels.py`` in which each ``# stamp: <stage>`` comment becomes a read of the CPU's cycle
counter (``llvm.readcyclecounter``), replays a trace under that copy, and adds up, for each stage, the cycles since
the previous stamp. Only launches that take the one-kernel step (``_uvmkernels.step``) are stamped; the table says
how many did. What the stamps do not cover (the Python around the call, crossing into it and back) is the
difference between ``on_launch`` and the stamped total.

The copy lives in a temporary folder with its own, empty Numba cache, so the first replay compiles every kernel
(a minute or two; the stamped code holds the address of this process's counter array and must never be cached
where a normal run could load it). The timed replay is the second one. A stamp costs a few tens of cycles,
and a launch passes about twenty.

    python bench/kernel_profile.py [TRACE.uvmt] [--oversub 1.5] [--from-iteration 3] [--out DIR]

Without a trace it takes the shipped ``traces/gpt2-small-b2s128.uvmt``. For issue 4's GPT-2-large figure, pass the
standard trace (``uvmprefetch bench`` records it under ``~/.cache/uvmprefetch/traces/``) with ``--oversub 2``.
Writes ``kernel-profile-<date>.json`` to ``--out`` (default ``./kernel_profile-<date>/``) and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = Path("uvmprefetch") / "policy" / "_uvmkernels.py"
MARK = re.compile(r"^(?P<ind>[ \t]*)# stamp(?:-(?P<start>start)|: (?P<name>.+?))[ \t]*$")

# The counters live in one int64 array: cycles per stage, calls per stage, the sum of each stage's rank among the
# running launch's stamps (the table lists the stages by their mean rank: the order they run in), then the last
# stamp, whether the running launch took the stamped step (the Python clears it before each on_launch, so a
# kernel called from the general path adds nothing), and how many stamps the running launch has passed.
PRELUDE = '''
from numba import types as _stamp_types
from numba.core import cgutils as _stamp_cg
from numba.extending import intrinsic as _stamp_intrinsic
from llvmlite import ir as _stamp_ir

STAMPS = np.zeros({size}, dtype=np.int64)
_STAMPS_AT = STAMPS.ctypes.data


@_stamp_intrinsic
def _cycles(typingctx):
    def codegen(context, builder, signature, args):
        fn = _stamp_cg.get_or_insert_function(builder.module, _stamp_ir.FunctionType(_stamp_ir.IntType(64), []),
                                              "llvm.readcyclecounter")
        return builder.call(fn, [])
    return _stamp_types.int64(), codegen


@_stamp_intrinsic
def _stamps_ptr(typingctx, at):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], _stamp_ir.IntType(64).as_pointer())
    return _stamp_types.CPointer(_stamp_types.int64)(_stamp_types.int64), codegen


@nb.njit(nogil=True)
def cycles_now():
    return _cycles()


@nb.njit(nogil=True)
def _stamp_start():
    s = nb.carray(_stamps_ptr(_STAMPS_AT), {size})
    s[{active}] = 1
    s[{seq}] = 0
    s[{last}] = _cycles()


@nb.njit(nogil=True)
def _stamp(i):
    s = nb.carray(_stamps_ptr(_STAMPS_AT), {size})
    t = _cycles()
    if s[{active}]:
        s[i] += t - s[{last}]
        s[{calls} + i] += 1
        s[{seq}] += 1
        s[{rank} + i] += s[{seq}]
    s[{last}] = t
'''


def slots(n: int) -> dict[str, int]:
    """Where each part of the counter array starts, for ``n`` stages (the layout the comment above describes)."""
    return {"calls": n, "rank": 2 * n, "last": 3 * n, "active": 3 * n + 1, "seq": 3 * n + 2, "size": 3 * n + 3}


def instrument(src: str) -> tuple[str, list[str]]:
    """The kernels' source with a stamp call at each marker, and the stage names in stamp order."""
    names: list[str] = []
    lines = []
    for line in src.splitlines():
        m = MARK.match(line)
        if m is None:
            lines.append(line)
        elif m.group("start"):
            lines.append(f"{m.group('ind')}_stamp_start()")
        else:
            name = m.group("name")
            if name not in names:
                names.append(name)
            lines.append(f"{m.group('ind')}_stamp({names.index(name)})")
    if not names:
        raise SystemExit(f"error: no '# stamp:' markers in {KERNELS}: nothing to time")
    n = len(names)
    prelude = PRELUDE.format(**slots(n))
    out = "\n".join(lines) + "\n"
    anchor = "import numpy as np\n"
    if anchor not in out:
        raise SystemExit(f"error: {KERNELS} does not import numpy as np: cannot place the stamps")
    return out.replace(anchor, anchor + prelude, 1), names


def cycles_per_us(kernels) -> float:
    c0, t0 = kernels.cycles_now(), time.perf_counter()
    time.sleep(0.25)
    c1, t1 = kernels.cycles_now(), time.perf_counter()
    return (c1 - c0) / ((t1 - t0) * 1e6)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", default=str(ROOT / "traces" / "gpt2-small-b2s128.uvmt"),
                    help="a .uvmt trace (default: the shipped GPT-2 small trace)")
    ap.add_argument("--oversub", type=float, default=1.5, help="working set / GPU memory (default 1.5)")
    ap.add_argument("--gpu", default="h100-pcie", help="GPU profile of the replay (default h100-pcie)")
    ap.add_argument("--from-iteration", type=int, default=-1,
                    help="count launches from this iteration on (default: the last iteration, the steady state)")
    ap.add_argument("--disturb", type=float, default=0.0, metavar="MIB",
                    help="read this many MiB of other memory before each on_launch, untimed, as a live run's own "
                         "work does between two hooks (as bench/policy_cost.py --disturb; default 0)")
    ap.add_argument("--out", metavar="DIR", default=None,
                    help="folder for this run's JSON (default: ./kernel_profile-<UTC date-time>/)")
    args = ap.parse_args()
    if not 0 <= args.disturb <= 4096:
        print(f"error: --disturb must be between 0 and 4096 MiB, got {args.disturb:g}", file=sys.stderr)
        return 2
    if not Path(args.trace).is_file():
        print(f"error: no trace at {args.trace}", file=sys.stderr)
        return 2
    if not args.oversub > 0:
        print(f"error: --oversub must be > 0, got {args.oversub}", file=sys.stderr)
        return 2

    work = Path(tempfile.mkdtemp(prefix="uvmprefetch-kprof-"))
    try:
        shutil.copytree(ROOT / "uvmprefetch", work / "uvmprefetch", ignore=shutil.ignore_patterns("__pycache__"))
        src, names = instrument((ROOT / KERNELS).read_text())
        (work / KERNELS).write_text(src)
        os.environ["NUMBA_CACHE_DIR"] = str(work / "numba-cache")  # (before numba is imported)
        sys.path.insert(0, str(work))
        import numpy as np

        from uvmprefetch.errors import UvmPrefetchError
        from uvmprefetch.policy import _uvmkernels as kernels
        from uvmprefetch.policy import make_policy
        from uvmprefetch.sim.replay import replay
        from uvmprefetch.trace.format import load
        if not Path(kernels.__file__).resolve().is_relative_to(work.resolve()):
            raise SystemExit(f"error: imported the kernels from {kernels.__file__}, not the stamped copy")
        try:
            trace = load(args.trace)
        except UvmPrefetchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        its = np.unique(trace.launch_iter)
        first = int(its[-1]) if args.from_iteration < 0 else args.from_iteration
        if first > int(its[-1]):
            print(f"error: --from-iteration {first}: the trace has iterations {int(its[0])}..{int(its[-1])}",
                  file=sys.stderr)
            return 2
        n = len(names)
        disturb = np.ones(int(args.disturb * (1 << 20)) // 8) if args.disturb else None
        stamps = kernels.STAMPS
        at = slots(n)
        active = at["active"]

        def run():
            pol = make_policy("uvmprefetch")
            hook = pol.on_launch
            times, inside = [], []  # (inside: the stamped cycles of each launch that took the step)

            def on_launch(info, state):
                counting = info.iteration >= first
                if counting and not times:
                    stamps[:] = 0
                stamps[active] = 0
                before = int(stamps[:n].sum()) if counting else 0
                if disturb is not None:
                    disturb.sum()
                t0 = time.perf_counter_ns()
                dec = hook(info, state)
                t = time.perf_counter_ns() - t0
                if counting:
                    times.append(t)
                    inside.append(int(stamps[:n].sum()) - before if stamps[active] else -1)
                return dec

            pol.on_launch = on_launch
            r = replay(trace, pol, args.gpu, oversub=args.oversub)
            return np.asarray(times, dtype=np.float64) / 1e3, np.asarray(inside, dtype=np.float64), r

        print("compiling the stamped kernels and replaying once (a minute or two) ...", file=sys.stderr, flush=True)
        try:
            run()
            print("timed replay ...", file=sys.stderr, flush=True)
            us, inside, r = run()
        except UvmPrefetchError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        per_us = cycles_per_us(kernels)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    launches = int(us.size)
    if not launches:
        print("error: no launch counted", file=sys.stderr)
        return 2
    took = inside >= 0
    stepped = int(took.sum())
    # per launch that took the step: the stamped time and the rest of on_launch (medians: one launch's split)
    step_in = inside[took] / per_us
    step_out = us[took] - step_in
    rows = []
    calls_at, rank_at = at["calls"], at["rank"]
    order = sorted(range(n), key=lambda i: (stamps[calls_at + i] == 0,
                                            stamps[rank_at + i] / max(1, stamps[calls_at + i]), i))
    for i in order:
        calls = int(stamps[calls_at + i])
        total = float(stamps[i]) / per_us
        rows.append({"stage": names[i], "calls": calls, "us_per_launch": total / launches,
                     "us_per_call": total / calls if calls else None})
    stamped = sum(x["us_per_launch"] for x in rows)
    mean = float(us.mean())
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "trace": Path(args.trace).stem,
           "oversub": args.oversub, "gpu": args.gpu, "from_iteration": first, "launches": launches,
           "disturb_mib": args.disturb,
           "stepped_launches": stepped, "on_launch_mean_us": mean, "on_launch_median_us": float(np.median(us)),
           "stamped_us_per_launch": stamped, "outside_stamps_us_per_launch": mean - stamped,
           "stepped_on_launch_median_us": float(np.median(us[took])) if stepped else None,
           "stepped_stamped_median_us": float(np.median(step_in)) if stepped else None,
           "stepped_outside_median_us": float(np.median(step_out)) if stepped else None,
           "cycles_per_us": per_us, "stages": rows, "slowdown": r["slowdown"],
           "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
           "note": "stamped copy of the kernels; shared machine: compare runs taken back to back only"}
    dest = Path(args.out) if args.out else Path.cwd() / f"kernel_profile-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"kernel-profile-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    path.write_text(json.dumps(out, indent=1))

    print(f"{out['trace']} at {args.oversub}x ({args.gpu}), launches from iteration {first}: {launches}, "
          f"{stepped} of them in the one-kernel step" + (f"; {args.disturb:g} MiB read before each (--disturb)"
                                                          if args.disturb else ""))
    print(f"on_launch: mean {mean:.1f} us, median {out['on_launch_median_us']:.1f} us; "
          f"cycle counter {per_us:.0f} per us")
    print("| stage (ends at its stamp; in the order they run) | calls | us per launch | us per call "
          "| share of on_launch mean |")
    print("|---|---|---|---|---|")
    for x in rows:
        per_call = f"{x['us_per_call']:.2f}" if x["us_per_call"] is not None else "-"
        print(f"| {x['stage']} | {x['calls']} | {x['us_per_launch']:.2f} | {per_call} | "
              f"{100 * x['us_per_launch'] / mean:.0f} % |")
    print(f"| stamped, in all | | {stamped:.2f} | | {100 * stamped / mean:.0f} % |")
    print(f"| outside the stamps (Python, crossing in and out, launches off the step) | | {mean - stamped:.2f} | | "
          f"{100 * (mean - stamped) / mean:.0f} % |")
    if stepped:
        print(f"launches that took the step, medians: on_launch {out['stepped_on_launch_median_us']:.1f} us, "
              f"stamped {out['stepped_stamped_median_us']:.1f} us, outside the stamps "
              f"{out['stepped_outside_median_us']:.1f} us")
    print(f"JSON: {path}")
    print(f"results: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
