"""The run report: one JSON object at ``UVMPREFETCH_REPORT`` and a short human summary on stderr.

Field names follow the replay result (docs/design.md §4) where they mean the same thing, so a live run and its
replay compare key by key: ``policy``, ``gpu``, ``capacity_bytes``, ``faults``, ``bytes_htod``,
``bytes_dtoh``, ``prefetch_issued_bytes``, ``prefetch_useful_bytes``, ``accuracy``, ``coverage``. Live-only
fields: ``backend``, ``budget_bytes``, ``memory`` (cuda: the managed limit and the budget in force, and why),
``peak_managed_bytes``, ``working_set_bytes`` (peak bytes of live
tensors the runtime saw), ``peak_resident_bytes``, ``iter_s`` (wall seconds per iteration), ``window``
(``[launch index, window]`` samples), ``errors``, ``degraded``, ``rank`` (``{rank, world_size, local_rank,
source}`` in a rank of a distributed job, else null). ``faults`` is null when the backend cannot
observe them (cuda without CUPTI); ``expected_faults`` then counts the blocks launches used that our books
did not have resident.
"""

from __future__ import annotations

import json
import os
import sys

from .. import __version__
from ..jsonutil import json_default
from ..units import format_size


def build_report(s) -> dict:
    """The report dict of session ``s`` (never raises: a failing part is recorded in ``errors``)."""
    try:
        be = s.backend.result()
    except Exception as e:  # noqa: BLE001
        s._note_error("report", e)
        be = {}
    try:
        pol = s.policy.report() or {}
    except Exception as e:  # noqa: BLE001
        s._note_error("policy report", e)
        pol = {}
    cap = int(getattr(s.backend, "capacity_bytes", 0) or 0)
    nat = _native(s)
    never_woke = bool(nat) and nat.get("planner", {}).get("woke") is None and nat["planner"].get("dormant")
    rep = {
        "uvmprefetch": __version__,
        "backend": s.cfg.backend,
        "rank": s.rank.as_dict() if getattr(s, "rank", None) is not None else None,
        "policy": s.policy.name,
        "gpu": be.get("gpu", getattr(s.gpu, "name", None)),
        "budget": str(s.cfg.budget) if s.cfg.budget is not None else None,
        "budget_bytes": cap if s.cfg.budget is not None else None,
        "capacity_bytes": cap,
        # cuda: the shim's managed limit and the budget, each with why it has its value (runtime/memory.py)
        "memory": s.backend.memory.as_dict() if getattr(s.backend, "memory", None) is not None else None,
        "block_size": s.block_size,
        "observer": {"kind": s.observer, "why_not_native": s.observer_why or None},
        "launches": s.index,
        "launches_by_phase": dict(s.phase_launches),
        "iterations": s.iteration,
        "inferred_iterations": s.iter_ends.inferred,
        "allocations_seen": s.tracker.next_id,
        # null while nothing was planned (the model fitted: no storage was looked at)
        "working_set_bytes": None if never_woke else int(s.tracker.peak_live_bytes),
        # dryrun: the high-water mark of the caching-allocator-like address space is what would be managed (while
        # the planner slept nothing was placed there: then the CPU allocator's peak live bytes stand in)
        "peak_managed_bytes": _peak_managed(s, be, nat),
        "peak_resident_bytes": be.get("peak_resident_bytes"),
        "faults": be.get("faults"),
        "expected_faults": be.get("expected_faults"),
        "bytes_htod": be.get("bytes_htod"),
        "bytes_dtoh": be.get("bytes_dtoh"),
        "prefetch_issued_bytes": be.get("prefetch_issued_bytes"),
        "prefetch_useful_bytes": be.get("prefetch_useful_bytes"),
        "accuracy": be.get("accuracy"),
        "coverage": be.get("coverage"),
        "iter_s": [round(x, 6) for x in s.iter_wall],
        "window": [list(w) for w in s.window_log] or pol.get("window_log") or None,
        # per iteration: late prefetches, faults, prefetched blocks evicted unused (source: the pre-op gate with
        # the C++ observer on a GPU, the simulated GPU for dryrun, the books otherwise)
        "monitor": s.monitor or None,
        "degraded": s.degraded,
        "errors": s.errors[:20],
        "policy_report": pol,
        "backend_result": be,
        "observe_time": nat or {
            "observer": "python", "ops": s.ops, "op_s": round(s.op_s, 6), "after_op_s": round(s.after_op_s, 6),
            "note": "host seconds over every dispatched op: op_s = the ops themselves (PyTorch below the dispatch "
                    "mode, kernel launches included); after_op_s = the runtime after each op (observation + "
                    "launch hook; the hook's own split is backend_result.host_time)"},
    }
    if s.cfg.backend == "dryrun":
        rep["model_time_s"] = be.get("time_s")
        rep["model_stall_s"] = be.get("stall_s")
        rep["model_iter_s"] = be.get("iteration_times_s")
    return rep


def _peak_managed(s, be: dict, nat: dict) -> int:
    peak = int(be.get("peak_managed_bytes") or (s.tracker.layout.peak_top if s.tracker.layout
                                               else s.tracker.peak_live_bytes))
    planner = nat.get("planner") or {}
    if s.tracker.layout is not None and (planner.get("woke") is not None or planner.get("dormant")):
        peak = max(peak, int((nat.get("allocator") or {}).get("peak_live_bytes") or 0))
    return peak


def _native(s) -> dict:
    if s.native is None:
        return {}
    try:
        return s.native.result()
    except Exception as e:  # noqa: BLE001
        s._note_error("observer report", e)
        return {}


def summary(rep: dict) -> str:
    """A few human lines for stderr."""
    def sz(v):
        return format_size(v) if isinstance(v, (int, float)) and v is not None else "n/a"

    def pct(v):
        return f"{v:.0%}" if isinstance(v, (int, float)) else "n/a"

    ot = rep.get("observe_time") or {}
    planner = ot.get("planner") or {}
    observer = rep["observer"]["kind"] + (" observer, planner never woke: the model fitted" if planner.get("dormant")
                                          and not planner.get("woke") else " observer")
    budget = rep["budget_bytes"] or (rep.get("memory") or {}).get("budget_bytes")
    lines = [
        f"uvmprefetch: {rep['backend']} run" + (f" (rank {rep['rank']['rank']})" if rep.get("rank") else "") +
        f", policy {rep['policy']}, {rep['launches']} launches, {rep['iterations']} iterations, {observer}"
        + (" (DEGRADED: prefetcher switched off)" if rep["degraded"] else ""),
        f"  working set {sz(rep['working_set_bytes'])}, budget {sz(budget) if budget else 'none'}"
        f", peak resident {sz(rep['peak_resident_bytes'])}, peak managed {sz(rep['peak_managed_bytes'])}",
        f"  moved {sz(rep['bytes_htod'])} to GPU, {sz(rep['bytes_dtoh'])} to host; faults "
        f"{rep['faults'] if rep['faults'] is not None else 'not observable'}; prefetch accuracy "
        f"{pct(rep['accuracy'])}, coverage {pct(rep['coverage'])}",
    ]
    if rep.get("model_time_s") is not None:
        lines.append(f"  modelled GPU ({rep['gpu']}): {rep['model_time_s']:.4f} s, stalls {rep['model_stall_s']:.4f} s")
    if rep["iter_s"]:
        lines.append("  iteration wall s: " + ", ".join(f"{x:.3f}" for x in rep["iter_s"][:10]))
    return "\n".join(lines)


def write_outputs(s, rep: dict) -> None:
    """Write the JSON report and the trace where asked; print the summary unless ``UVMPREFETCH_LOG=quiet``."""
    if s.cfg.report:
        try:
            tmp = s.cfg.report + ".tmp"
            with open(tmp, "w") as f:
                json.dump(rep, f, indent=1, default=_default)
            os.replace(tmp, s.cfg.report)
        except OSError as e:
            print(f"uvmprefetch: cannot write the report {s.cfg.report}: {e.strerror}", file=sys.stderr)
    if s.builder is not None and s.cfg.trace:
        try:
            from ..trace.format import save
            save(s.builder.build(check=False), s.cfg.trace)
        except Exception as e:  # noqa: BLE001 - a bad trace must not turn a finished run into a failure
            print(f"uvmprefetch: cannot write the trace {s.cfg.trace}: {type(e).__name__}: {e}", file=sys.stderr)
    if s.cfg.log != "quiet":
        print(summary(rep), file=sys.stderr)


def _default(o):
    # A report must never fail to be written over an odd value: fall back to its text.
    try:
        return json_default(o)
    except TypeError:
        return str(o)
