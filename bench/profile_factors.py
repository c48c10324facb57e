"""Which of the literature profile's differences from the default one move a trace's run against the oracle.

``python bench/profile_factors.py t5-base --oversub 2,3`` replays a standard trace (or a ``.uvmt`` file) under
``uvmprefetch`` (``--policy`` for its parameters) and the ``oracle`` in a chain of settings, each adding one of the
default profile's differences to the literature one (``uvmprefetch bench --gpu h100-pcie-lit --host free``):

- ``lit``: ``h100-pcie-lit``, host ``free``. Memory no processor has touched holds data on the host, so every first
  touch in iteration 0 moves a block over the link (docs/simulator.md "Cold start");
- ``+fresh``: the same with ``h100-pcie``'s populate cost, which makes the simulator map untouched memory on the
  GPU without data, and populates (``PolicyContext.fresh_memory``, ``populates``);
- ``+faults``: the same with ``h100-pcie``'s fault costs (17 entries a batch, 330 us a batch, against 256 and 45);
- ``+link``: ``h100-pcie`` itself, host ``free``: its link (50 GB/s H2D, 7.5 GB/s D2H by UVM's eviction) and the
  copy path (55 GB/s each way);
- ``default``: ``h100-pcie``, host ``live`` (``uvmprefetch bench``'s default setting).

Every replay takes ``--evict auto`` and discards, as ``uvmprefetch bench`` does.

For each setting and oversubscription it prints the whole run and the steady state against the oracle, each
iteration's ratio, the oracle's iteration-0 time, and iteration 0's H2D bytes under both policies; the lines that
follow name, per oversubscription, how much of the whole run's ratio each step moved.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uvmprefetch.gpus import PROFILES  # noqa: E402
from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.policy.uvmprefetch import UvmPrefetchPolicy  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402


def settings() -> list[tuple[str, object, str]]:
    """The chain of ``(name, GPU profile, host model)``, each step adding one of ``h100-pcie``'s differences from
    ``h100-pcie-lit`` (the fields are read from the two profiles, not restated here)."""
    lit, cal = PROFILES["h100-pcie-lit"], PROFILES["h100-pcie"]
    fresh = dataclasses.replace(lit, name="h100-pcie-lit+fresh", repopulate_call_s=cal.repopulate_call_s,
                                repopulate_block_s=cal.repopulate_block_s)
    faults = dataclasses.replace(fresh, name="h100-pcie-lit+fresh+faults", fault_batch_size=cal.fault_batch_size,
                                 fault_batch_latency_s=cal.fault_batch_latency_s)
    return [("lit", lit, "free"), ("+fresh", fresh, "free"), ("+faults", faults, "free"), ("+link", cal, "free"),
            ("default", cal, "live")]


def parse_oversubs(text: str) -> list[float]:
    """``--oversub``'s value as numbers above 1; a ConfigError naming it otherwise."""
    from uvmprefetch.errors import ConfigError
    try:
        xs = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--oversub {text!r}: comma-separated numbers expected") from None
    if not xs or any(not x >= 1.0 for x in xs):
        raise ConfigError(f"--oversub {text!r}: oversubscriptions of at least 1 expected")
    return xs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a standard trace's name (recorded if missing) or a .uvmt file")
    ap.add_argument("--oversub", default="2,3", help="comma-separated oversubscriptions (default 2,3)")
    ap.add_argument("--policy", default="uvmprefetch", help="uvmprefetch[:k=v,...]")
    ap.add_argument("--settings", default=None,
                    help="comma-separated names of the settings to run (default all: lit,+fresh,+faults,+link,default)")
    args = ap.parse_args(argv)
    from uvmprefetch.errors import ConfigError, UvmPrefetchError
    try:
        xs = parse_oversubs(args.oversub)
        if not isinstance(make_policy(args.policy), UvmPrefetchPolicy):
            raise ConfigError(f"--policy {args.policy!r}: only uvmprefetch is compared here")
        chain = settings()
        if args.settings is not None:
            want = [s.strip() for s in args.settings.split(",") if s.strip()]
            names = [n for n, _, _ in chain]
            bad = [s for s in want if s not in names]
            if bad or not want:
                raise ConfigError(f"--settings {args.settings!r}: names from {', '.join(names)} expected")
            chain = [c for c in chain if c[0] in want]
        from bench.policy_cost import get_trace
        _, trace = get_trace(args.trace, "gpt2")
        rows = []
        for x in xs:
            for name, gpu, host in chain:
                kw = dict(oversub=x, host=host, evict="auto")  # (as ``uvmprefetch bench``: the copy path where there is one)
                u = replay(trace, make_policy(args.policy), gpu, **kw)
                o = replay(trace, make_policy("oracle"), gpu, **kw)
                rows.append((x, name, u, o))
    except (UvmPrefetchError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.trace}: {args.policy} against the oracle, the literature profile's differences from the default "
          f"added one at a time")
    print("| oversub | setting | whole | steady | per iteration | oracle it. 0 s | it. 0 H2D GB (oracle) |")
    print("|---|---|---|---|---|---|---|")
    for x, name, u, o in rows:
        per = " ".join(f"{a / b:.2f}" for a, b in zip(u["iteration_times_s"], o["iteration_times_s"]))
        print(f"| {x:g} | {name} | {u['time_s'] / o['time_s']:.4f} | "
              f"{u['steady_slowdown'] / o['steady_slowdown']:.4f} | {per} | {o['iteration_times_s'][0]:.3f} | "
              f"{u['iteration_bytes_htod'][0] / 1e9:.1f} ({o['iteration_bytes_htod'][0] / 1e9:.1f}) |")
    for x in xs:
        mine = [(name, u["time_s"] / o["time_s"]) for xx, name, u, o in rows if xx == x]
        steps = ", ".join(f"{b[0]} {b[1] - a[1]:+.4f}" for a, b in zip(mine, mine[1:]))
        print(f"{x:g}x: whole run {mine[0][0]} {mine[0][1]:.4f}" + (f"; each step: {steps}" if steps else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
