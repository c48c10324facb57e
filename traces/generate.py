#!/usr/bin/env python3
"""Rebuild the traces: the standard set into traces/generated/ (gitignored; the same files
``uvmprefetch bench`` records into its cache) and the small shipped traces into traces/.

    python traces/generate.py              # both
    python traces/generate.py --small      # only the shipped ones (seconds)
    python traces/generate.py --standard   # only the standard set (about a minute on 2 cores)

Prints one line per trace: name, launches, peak live footprint, working set, recording seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Shipped with the repository for golden tests (keep each well under 500 KB).
SMALL = {
    "gpt2-small-b2s128": dict(model="gpt2", config="small", batch=2, seq=128, iters=3),
    "resnet-50-b2i64": dict(model="resnet", config="50", batch=2, image_size=64, iters=3),
}


def _line(name, path, seconds):
    from uvmprefetch.trace import load
    from uvmprefetch.trace.stats import summarize
    from uvmprefetch.units import format_size

    s = summarize(load(path))
    return (f"{name:<22} {s['launches']:>6} launches  peak {format_size(s['peak_live_bytes']):>11}  working set "
            f"{format_size(s['working_set_bytes']):>11}  {path.stat().st_size / 1024:7.0f} KB  recorded in "
            f"{seconds:5.1f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="traces/generate.py", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--small", action="store_true", help="only the small shipped traces")
    g.add_argument("--standard", action="store_true", help="only the standard set")
    args = p.parse_args(argv)
    from uvmprefetch.trace.format import save
    from uvmprefetch.trace.models import record_model
    from uvmprefetch.trace.standard import STANDARD, standard_traces, trace_path

    if not args.standard:
        for name, kw in SMALL.items():
            kw = dict(kw)
            t0 = time.perf_counter()
            t = record_model(kw.pop("model"), kw.pop("config"), **kw)
            t.meta["name"] = name
            out = HERE / f"{name}.uvmt"
            save(t, out)
            print(_line(name, out, time.perf_counter() - t0), flush=True)
    if not args.small:
        gen = HERE / "generated"
        for name in STANDARD:
            path = trace_path(name, gen)
            if path.exists():
                path.unlink()  # rebuild: the point of this script
            t0 = time.perf_counter()
            standard_traces(gen, progress=sys.stderr.isatty(), names=[name])
            print(_line(name, path, time.perf_counter() - t0), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
