"""What a trace holds, in numbers: footprint by kind, working set, ideal iteration time (``uvmprefetch info``)."""

from __future__ import annotations

import numpy as np

from ..gpus import PROFILES
from .addrspace import first_fit_addresses
from .format import KIND, KINDS, Trace
from .roofline import durations_for


def live_bytes(t: Trace, mask: np.ndarray | None = None) -> np.ndarray:
    """Bytes live during each launch (length ``n_launches + 1``: the last entry is after the last launch),
    counting only allocations selected by ``mask``."""
    sel = np.ones(t.n_allocs, bool) if mask is None else mask
    delta = np.zeros(t.n_launches + 2, dtype=np.int64)
    np.add.at(delta, t.alloc_at[sel], t.alloc_size[sel])
    np.add.at(delta, t.free_at_or_end()[sel] + (t.free_at[sel] < 0), -t.alloc_size[sel])
    return np.cumsum(delta)[: t.n_launches + 1]


def steady_iteration(t: Trace) -> int:
    """The iteration that stands for steady state: the last complete one (-1 if there is none)."""
    return t.iterations - 1


def first_fit_layout(t: Trace) -> np.ndarray:
    """Base address of every allocation in the shared first-fit address space (``trace.addrspace``): the
    one the live dryrun runtime and the replay of its traces use, so ``working_set_bytes`` counts the bytes
    they see. Sizes round up to 512 B; a zero-byte allocation takes no space here (``min_size=0``)."""
    return first_fit_addresses(t, min_size=0)[0]


def _union_length(start: np.ndarray, end: np.ndarray) -> int:
    if start.size == 0:
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(s.size, bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    ends = np.append(run_end[idx[1:] - 1], run_end[-1])
    return int((ends - s[idx]).sum())


def touched_bytes(t: Trace, iteration: int, base: np.ndarray | None = None) -> int:
    """Distinct bytes the launches of ``iteration`` touch: in the address space ``base`` (allocation ->
    address; ranges of allocations that reuse the same addresses count once), or per allocation if None."""
    launches = np.flatnonzero(t.launch_iter == iteration)
    if launches.size == 0:
        return 0
    lo, hi = int(t.acc_ptr[launches[0]]), int(t.acc_ptr[launches[-1] + 1])
    a, off, ln = t.acc_alloc[lo:hi], t.acc_off[lo:hi], t.acc_len[lo:hi]
    if base is None:  # give every allocation its own address range
        base = np.concatenate(([0], np.cumsum(t.alloc_size)[:-1]))
    start = base[a] + off
    return _union_length(start, start + ln)


def working_set_bytes(t: Trace, iteration: int) -> int:
    """Distinct bytes touched by ``iteration`` with addresses as a caching allocator would reuse them."""
    return touched_bytes(t, iteration, first_fit_layout(t))


def summarize(t: Trace) -> dict:
    """The numbers ``uvmprefetch info --json`` prints.

    Keys: launches, allocations, accesses, iterations, bytes_allocated, peak_live_bytes, param_bytes,
    optimizer_bytes, gradient_bytes, activation_peak_bytes, input_bytes, working_set_bytes (distinct bytes
    touched in the steady-state iteration, with addresses reused as
    a caching allocator does), touched_alloc_bytes (the same, every allocation at its own addresses), ideal_s (GPU profile -> estimated steady-state iteration time),
    launches_per_iteration, phases (launch counts), meta.
    """
    kind = t.alloc_kind
    peak_of = lambda k: int(live_bytes(t, kind == KIND[k]).max()) if t.n_allocs else 0  # noqa: E731
    it = steady_iteration(t)
    in_it = t.launch_iter == it if it >= 0 else np.ones(t.n_launches, bool)
    from .format import PHASES
    ideal = {}
    for name, prof in PROFILES.items():
        # the recorded durations are for meta['gpu']; every other profile is re-estimated (roofline)
        d = t.launch_dur if name == (t.meta or {}).get("gpu") else durations_for(t, prof)
        ideal[name] = float(d[in_it].sum())
    return {
        "launches": t.n_launches,
        "allocations": t.n_allocs,
        "accesses": t.n_accesses,
        "iterations": t.iterations,
        "steady_iteration": it,
        "launches_per_iteration": int(in_it.sum()),
        "bytes_allocated": int(t.alloc_size.sum()),
        "peak_live_bytes": int(live_bytes(t).max()) if t.n_allocs else 0,
        "param_bytes": peak_of("param"),
        "optimizer_bytes": peak_of("optimizer"),
        "gradient_bytes": peak_of("grad"),
        "activation_peak_bytes": peak_of("activation"),
        "input_bytes": peak_of("input"),
        "other_peak_bytes": peak_of("other"),
        "working_set_bytes": working_set_bytes(t, it) if it >= 0 else 0,
        "touched_alloc_bytes": touched_bytes(t, it) if it >= 0 else 0,
        "flops_per_iteration": float(t.launch_flops[in_it].sum()),
        "ideal_s": ideal,
        "phases": {PHASES[p]: int((t.launch_phase[in_it] == p).sum()) for p in range(len(PHASES))},
        "kinds": {KINDS[k]: int((kind == k).sum()) for k in range(len(KINDS))},
        "meta": {k: v for k, v in (t.meta or {}).items() if k != "flop_dtype_runs"},
    }
