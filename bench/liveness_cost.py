#!/usr/bin/env python3
"""What ``uvmprefetch.runtime.liveness.Liveness`` costs per allocator event, on a real model's allocation stream.

The stream: a trace recorded on the CPU (``uvmprefetch record``: every allocation and free of a training step,
in launch order), placed in one address space by the first-fit allocator the replay uses (512-byte rounding,
like the caching allocator), with a SEGMENT_ALLOC per 2 GiB the space grows by, an ALLOC per allocation and a
FREE_REQUESTED + FREE_COMPLETED per free -- the records the CUDA tracker pushes. It is fed in batches of
``--batch`` events (one planner drain) to a fresh tracker, ``--repeat`` times; the figure is the median
seconds per event, the Numba compilation excluded (one warm-up pass). Both the feeding thread's CPU time and
the wall clock are measured: on a shared machine the wall clock also counts the time other processes held
the core (a 2-core machine at load 13 inflated it up to 10x for runs longer than a scheduler slice), so the
CPU time is the cost.

    python bench/liveness_cost.py                      # GPT-2 large b8 s1024 bf16, 2 iterations
    python bench/liveness_cost.py --trace traces/gpt2-small-b2s128.uvmt --batch 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from uvmprefetch.runtime.liveness import (ALLOC, EVENT_DTYPE, FREE_COMPLETED, FREE_REQUESTED,  # noqa: E402
                                          SEGMENT_ALLOC, Liveness)
from uvmprefetch.trace.addrspace import FirstFit  # noqa: E402

SEGMENT = 2 << 30
BASE = 1 << 40  # a device-like address


def events_from_trace(trace) -> np.ndarray:
    """The allocator records of a trace's allocations and frees, in launch order (frees of a launch first)."""
    n = trace.n_allocs
    at, free_at, size = trace.alloc_at, trace.free_at, trace.alloc_size
    order = []  # (time, kind, alloc id): frees (kind 0) before allocations (kind 1) at the same launch
    for i in range(n):
        order.append((int(at[i]), 1, i))
        if free_at[i] >= 0:
            order.append((int(free_at[i]), 0, i))
    order.sort()
    ff, addr, rows, top = FirstFit(), {}, [], 0
    for _, kind, i in order:
        if kind == 1:
            a = ff.alloc(int(size[i]))
            addr[i] = a
            while ff.top > top:
                rows.append((SEGMENT_ALLOC, BASE + top, SEGMENT))
                top += SEGMENT
            rows.append((ALLOC, BASE + a, max(int(size[i]), 1)))
        else:
            rows.append((FREE_REQUESTED, BASE + addr[i], max(int(size[i]), 1)))
            rows.append((FREE_COMPLETED, BASE + addr[i], max(int(size[i]), 1)))
            ff.free(addr[i], int(size[i]))
    ev = np.zeros(len(rows), dtype=EVENT_DTYPE)
    r = np.asarray(rows, dtype=np.int64)
    ev["seq"] = np.arange(1, len(rows) + 1)
    ev["action"], ev["addr"], ev["size"] = r[:, 0], r[:, 1], r[:, 2]
    return ev


def run_once(ev: np.ndarray, batch: int) -> tuple[float, float, int]:
    """(thread CPU seconds, wall seconds, deaths) of feeding ``ev`` to a fresh tracker."""
    tr = Liveness(complete_from_start=True)
    deaths = 0
    c0, t0 = time.thread_time(), time.perf_counter()
    for k in range(0, ev.size, batch):
        deaths += tr.feed(ev[k:k + batch]).blocks.size
    return time.thread_time() - c0, time.perf_counter() - t0, deaths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, help="a .uvmt trace (default: record GPT-2 large b8 s1024 bf16)")
    p.add_argument("--batch", type=int, default=256, help="events per feed (one drain of the ring)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "out" / "liveness-cost.json")
    a = p.parse_args(argv)
    if a.batch <= 0 or a.repeat <= 0:
        p.error("--batch and --repeat must be positive")
    from uvmprefetch.trace import load
    if a.trace is None:
        path = Path(tempfile.mkdtemp(prefix="uvmp-liveness-")) / "gpt2-large.uvmt"
        subprocess.run([sys.executable, "-m", "uvmprefetch", "record", "--model", "gpt2", "--config", "large",
                        "--batch", "8", "--seq", "1024", "--dtype", "bf16", "--no-progress", "-o", str(path)],
                       check=True, cwd=ROOT)
        a.trace = path
    ev = events_from_trace(load(a.trace))
    run_once(ev[: min(ev.size, 4 * a.batch)], a.batch)  # compile
    runs = [run_once(ev, a.batch) for _ in range(a.repeat)]
    cpu = statistics.median(c for c, _, _ in runs) / ev.size
    wall = statistics.median(w for _, w, _ in runs) / ev.size
    spans = (ev["addr"] + ev["size"] - 1) // (2 << 20) - ev["addr"] // (2 << 20) + 1
    res = {"trace": str(a.trace), "events": int(ev.size), "blocks_per_event": round(float(spans.mean()), 2),
           "batch": a.batch, "repeat": a.repeat, "cpu_seconds": [round(c, 6) for c, _, _ in runs],
           "wall_seconds": [round(w, 6) for _, w, _ in runs], "cpu_us_per_event_median": round(cpu * 1e6, 4),
           "wall_us_per_event_median": round(wall * 1e6, 4), "deaths": runs[0][2],
           "machine": "shared 2-core CPU (wall clock noisy)"}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"| trace | events | blocks/event | batch | deaths | CPU us/event | wall us/event (medians of {a.repeat}) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {a.trace.name} | {ev.size} | {res['blocks_per_event']} | {a.batch} | {res['deaths']} | {cpu * 1e6:.3f} | "
          f"{wall * 1e6:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
