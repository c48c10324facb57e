"""Views of a replay's timeline: Chrome-trace JSON for ui.perfetto.dev and a residency/stall plot."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError

_TRACKS = {"compute": 1, "h2d": 2, "d2h": 3, "fault": 4}


def to_chrome_trace(result: dict, names: list[str] | None = None, max_block_intervals: int = 200_000) -> dict:
    """Chrome-trace (``traceEvents``) dict of ``result["timeline"]``: one thread per engine, instants for
    fault batches, a counter of GPU blocks in use, and one track per block showing when it was on the GPU
    (left out, with a note, beyond ``max_block_intervals`` intervals). Times are microseconds."""
    tl = result.get("timeline")
    if tl is None:
        raise ConfigError("this replay was run without a timeline (timeline=True)")
    us = 1e6
    ev: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"simulated {result['gpu']} "
                                                                             f"({result['policy']})"}}]
    for track, tid in _TRACKS.items():
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}})
    for start, end, idx, nid in tl["compute"]:
        name = names[nid] if names and 0 <= nid < len(names) else f"launch {idx}"
        ev.append({"name": name, "ph": "X", "pid": 1, "tid": 1, "ts": start * us, "dur": (end - start) * us,
                   "args": {"launch": idx}})
    for track in ("h2d", "d2h"):
        for start, end, n, kind in tl[track]:
            ev.append({"name": f"{kind} {n} blocks", "ph": "X", "pid": 1, "tid": _TRACKS[track], "ts": start * us,
                       "dur": max(end - start, 0.0) * us, "args": {"blocks": n, "kind": kind}})
    for t, n, batches in tl["fault"]:
        ev.append({"name": f"fault {n} blocks", "ph": "i", "s": "t", "pid": 1, "tid": 4, "ts": t * us,
                   "args": {"blocks": n, "batches": batches}})
    # Per-block residency: one track per block (process "blocks"), capped to keep the file loadable.
    n_iv = sum(len(b) for b, _, _ in tl.get("block", []))
    if 0 < n_iv <= max_block_intervals:
        ev.append({"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "blocks on the GPU"}})
        for blocks, landed, left in tl["block"]:
            for b, s0, s1 in zip(blocks.tolist(), landed.tolist(), left.tolist()):
                ev.append({"name": f"block {b}", "ph": "X", "pid": 2, "tid": b, "ts": s0 * us,
                           "dur": max(s1 - s0, 0.0) * us})
    elif n_iv:
        ev.append({"name": f"per-block residency left out: {n_iv} intervals > {max_block_intervals}", "ph": "i",
                   "s": "g", "pid": 1, "ts": 0})
    bs = result["block_size"]
    for t, used in tl["resident"]:
        ev.append({"name": "GPU memory in use (MiB)", "ph": "C", "pid": 1, "ts": t * us,
                   "args": {"MiB": used * bs / 2**20}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {k: result[k] for k in ("policy", "gpu", "capacity_bytes", "oversub", "time_s", "ideal_s")}}


def write_perfetto(result: dict, path: str | Path, names: list[str] | None = None) -> None:
    """Write ``to_chrome_trace(result)`` to ``path`` (open it in ui.perfetto.dev)."""
    try:
        Path(path).write_text(json.dumps(to_chrome_trace(result, names), separators=(",", ":")))
    except OSError as e:
        raise ConfigError(f"--perfetto {path}: cannot write ({e.strerror})") from None


def plot_timeline(result: dict, path: str | Path) -> None:
    """PNG of GPU memory in use and cumulative stall over simulated time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tl = result.get("timeline")
    if tl is None:
        raise ConfigError("this replay was run without a timeline (timeline=True)")
    comp = np.array([(s, e) for s, e, _, _ in tl["compute"]]) if tl["compute"] else np.zeros((0, 2))
    res = np.array(tl["resident"]) if tl["resident"] else np.zeros((0, 2))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    gib = result["block_size"] / 2**30
    if res.size:
        a1.step(res[:, 0] * 1e3, res[:, 1] * gib, where="post", lw=0.8, label="in use (resident + in flight)")
    a1.axhline(result["capacity_bytes"] / 2**30, color="r", ls="--", lw=0.8, label="capacity")
    a1.set_ylabel("GPU memory (GiB)")
    a1.legend(loc="lower right", fontsize=8)
    a1.set_title(f"{result['policy']} on {result['gpu']}, oversub {result['oversub']:.2f}: "
                 f"{result['time_s'] * 1e3:.1f} ms ({result['slowdown']:.2f}x ideal)")
    if comp.size:
        prev_end = np.concatenate([[0.0], comp[:-1, 1]])
        stall = np.cumsum(comp[:, 0] - prev_end)
        a2.plot(comp[:, 0] * 1e3, stall * 1e3, lw=0.8)
    a2.set_ylabel("cumulative stall (ms)")
    a2.set_xlabel("simulated time (ms)")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise ConfigError(f"--plot {path}: cannot write ({e.strerror})") from None
    finally:
        plt.close(fig)
