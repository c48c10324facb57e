"""The bound on what exact allocation-time moves could give ``uvmprefetch``: the trace replayed with every
iteration's tensors placed where the last iteration's are.

The caching allocator places a step's tensors elsewhere than last step until the layout settles (T5 base: two
thirds of iteration 1's and 2's allocations move). A runtime that saw each allocation (address, size) could pair
the k-th allocation of this iteration with the k-th of the recorded one (same size) and learn the move before any
launch uses it. The most such a mechanism can give is a trace in which nothing moves: the pointer then matches
every launch exactly and no prediction needs translating. This script builds that layout and replays the policy on
it, against the oracle on the real layout.

Each allocation of iteration k is paired with one of the last iteration's: by position for an iteration with the
same sequence of (size, kind) (the hypothesis above; the script reports whether it holds), by a longest-common-
subsequence alignment for the first iteration (it also allocates the weights and the lazily made optimizer state).
A paired allocation takes its partner's address; the script checks that no two live allocations then overlap
(``conflicts``; an allocation that would is left where it was, and if that still overlaps, the bound is refused).

``python bench/allocmap_bound.py t5-base --oversub 1.5,2,3`` (standard trace names or ``.uvmt`` files; the
command line's default GPU profile, host model, eviction and discards, as ``uvmprefetch bench``). Prints one row
per trace and oversubscription: the oracle and the policy on the real layout, both on the pinned one, and the
policy's whole-run and steady ratios to the real oracle before and after.
"""

from __future__ import annotations

import argparse
import bisect
import difflib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from uvmprefetch.errors import ConfigError  # noqa: E402
from uvmprefetch.sim import layout as _layout  # noqa: E402
from uvmprefetch.sim.host import DEFAULT_HOST  # noqa: E402
from uvmprefetch.sim.replay import launch_durations, replay  # noqa: E402
from uvmprefetch.trace.addrspace import alloc_events  # noqa: E402


def alloc_iterations(t) -> np.ndarray:
    """Each allocation's iteration: that of the launch it precedes (the last launch's for one made at the end)."""
    at = np.minimum(t.alloc_at, t.n_launches - 1)
    return t.launch_iter[at]


def pair_with_last(t) -> tuple[np.ndarray, dict]:
    """``partner[a]``: the allocation of the last iteration paired with ``a`` (-1: none; the last iteration's own
    are their own partners). Also per iteration: allocations, paired, and whether the (size, kind) sequence is the
    last iteration's exactly."""
    it = alloc_iterations(t)
    last = int(it.max())
    ref = np.flatnonzero(it == last)
    ref_keys = list(zip(t.alloc_size[ref].tolist(), t.alloc_kind[ref].tolist()))
    partner = np.full(t.n_allocs, -1, dtype=np.int64)
    partner[ref] = ref
    info = {}
    for k in range(last):
        ids = np.flatnonzero(it == k)
        keys = list(zip(t.alloc_size[ids].tolist(), t.alloc_kind[ids].tolist()))
        same = keys == ref_keys
        if same:
            partner[ids] = ref
        else:
            sm = difflib.SequenceMatcher(None, keys, ref_keys, autojunk=False)
            for blk in sm.get_matching_blocks():
                partner[ids[blk.a:blk.a + blk.size]] = ref[blk.b:blk.b + blk.size]
        info[k] = {"allocs": int(ids.size), "paired": int((partner[ids] >= 0).sum()), "same_sequence": same}
    return partner, info


def overlaps(t, base: np.ndarray, rsize: np.ndarray) -> list[int]:
    """Allocations that overlap a live one when placed at ``base`` (reserved sizes ``rsize``), in event order."""
    starts: list[int] = []  # sorted starts of the live allocations
    ends: dict[int, tuple[int, int]] = {}
    bad = []
    for _, kind, a in alloc_events(t):
        lo, hi = int(base[a]), int(base[a] + rsize[a])
        if kind < 0:
            if a in ends:
                del ends[a]
                starts.pop(bisect.bisect_left(starts, (lo, a)))
            continue
        i = bisect.bisect_left(starts, (lo, -1))
        hit = (i < len(starts) and starts[i][0] < hi) or (i > 0 and ends[starts[i - 1][1]][1] > lo)
        if hit:
            bad.append(a)
            continue
        starts.insert(i, (lo, a))
        ends[a] = (lo, hi)
    return bad


def pinned_layout(t, block_size: int):
    """The caching-allocator layout of ``t`` and the pinned one (see the module docstring), with a summary."""
    base, rsize, top, events = _layout._allocate_addresses(t, "caching")
    partner, info = pair_with_last(t)
    new = base.copy()
    ok = partner >= 0
    new[ok] = base[partner[ok]]
    bad = overlaps(t, new, rsize)
    if bad:
        new[bad] = base[bad]
        still = overlaps(t, new, rsize)
        if still:
            raise ConfigError(f"pinned layout: {len(still)} allocations overlap a live one even where left in place "
                              f"(first: allocation {still[0]})")
    moved = int((new != base).sum())
    real = _layout.build_layout(t, block_size, "caching")
    orig = _layout._allocate_addresses
    _layout._allocate_addresses = lambda tr, allocator="caching": (new, rsize, top, events)
    try:
        pin = _layout.build_layout(t, block_size, "caching")
    finally:
        _layout._allocate_addresses = orig
    return real, pin, {"iterations": info, "conflicts": len(bad), "repinned": moved}


def _numbers(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"{what} {text!r}: comma-separated numbers expected") from None


def _rows(name: str, t, oversubs: list[float], gpu, policy: str) -> list[tuple]:
    """The table's rows of one trace (a summary of its pairing printed first)."""
    real, pin, info = pinned_layout(t, 2 << 20)
    print(f"{name}: " + "; ".join(f"iter {k} {v['paired']}/{v['allocs']} paired"
                                  f"{' (same sequence)' if v['same_sequence'] else ''}"
                                  for k, v in info["iterations"].items())
          + f"; {info['repinned']} allocations re-placed, {info['conflicts']} left in place (overlap)")
    dur = launch_durations(t, gpu)
    rows = []
    for ov in oversubs:
        kw = dict(oversub=ov, durations=dur, host=DEFAULT_HOST, evict="auto")
        try:
            res = {(lname, p): replay(t, p, gpu, layout=lay, **kw)
                   for lname, lay in (("real", real), ("pinned", pin)) for p in ("oracle", policy)}
        except ConfigError as e:
            raise ConfigError(f"{name} at {ov}x: {e}") from None
        o = res["real", "oracle"]
        pol = [res[lname, policy] for lname in ("real", "pinned")]
        rows.append((name, ov, o["time_s"], res["pinned", "oracle"]["time_s"], pol[0]["time_s"], pol[1]["time_s"],
                     *(r["time_s"] / o["time_s"] for r in pol),
                     *(r["steady_slowdown"] / o["steady_slowdown"] for r in pol), pol[1]["iteration_times_s"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", help="standard trace names or .uvmt files")
    ap.add_argument("--oversub", default="1.5,2,3")
    ap.add_argument("--gpu", default="h100-pcie")
    ap.add_argument("--policy", default="uvmprefetch")
    args = ap.parse_args(argv)
    from bench.policy_cost import get_trace
    from uvmprefetch.errors import UvmPrefetchError
    from uvmprefetch.gpus import get_profile
    rows = []
    try:
        oversubs = _numbers(args.oversub, "--oversub")
        gpu = get_profile(args.gpu)
        for name in args.traces:
            rows += _rows(*get_trace(name, "gpt2"), oversubs, gpu, args.policy)
    except (UvmPrefetchError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\n{'trace':12} {'x':>4} {'oracle':>7} {'or.pin':>7} {'pol':>7} {'pol.pin':>7} {'whole':>6} {'w.pin':>6} "
          f"{'steady':>6} {'s.pin':>6}  pinned policy per iteration (s)")
    for r in rows:
        its = " ".join(f"{x:.3f}" for x in r[10])
        print(f"{r[0]:12} {r[1]:4} {r[2]:7.3f} {r[3]:7.3f} {r[4]:7.3f} {r[5]:7.3f} {r[6]:6.3f} {r[7]:6.3f} "
              f"{r[8]:6.3f} {r[9]:6.3f}  {its}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
