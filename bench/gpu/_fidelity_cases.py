"""``fidelity.py --cases``: the simulator's prediction beside every case of ``bench/baselines/gpu.json``.

The cases do not keep the traces of their live runs. Each is re-recorded here, on the CPU, with the project's recorder
(``uvmprefetch.trace.models.record_model``: the same model, config, batch, sequence and dtype on meta tensors,
durations estimated for the measured board: ``h100-sxm`` on an H100, ``h200`` on an H200) and replayed with the case's
policy, budget (the capacity), discards and the runtime it ran under: the synchronous runtime, ``--host live-sync``,
UVM's eviction only (``evict=uvm``). One trace per (model, board) serves all its cases.

The recording runs AdamW one parameter at a time (``foreach=False``), as the live runs did (``--foreach off``).
What differs from the live run: PyTorch's caching allocator is the simulator's model of it, so the replay's
footprint is not the live one; the capacity is therefore set by the case's oversubscription (working set / budget,
as the live run was sized), not by its budget in bytes. A case without a measured time (``s_per_iter_median``
null) or without a budget it could exceed gets ``{"replayed": false, "why": ...}``.

Each replayed case gets ``fidelity``: the predicted and measured seconds per iteration (steady state: the median of
the iterations from ``steady_from_iteration`` on, at most the trace's last), the error, bytes each way per iteration
(GiB) on both sides, and the per-stage host seconds per iteration where the case measured them (evictions the host
waited for, decisions) beside the replay's (``host_blocked_s``, ``host_decision_s``), which is what says which
modelled cost is wrong where the error is large.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

GiB = 1 << 30
TARGET = 0.20
MODEL = re.compile(r"^(?P<family>gpt2|bert|resnet|vit)-(?P<config>\w+) b(?P<batch>\d+)(?: s(?P<seq>\d+))? "
                   r"(?P<dtype>fp32|bf16|fp16)$")
POLICY = {"demand": "demand", "uvmprefetch": "uvmprefetch", "deepum": "deepum"}
RECORD_ITERS = 4


def why_not(case: dict) -> str | None:
    """Why ``case`` cannot be replayed, or None."""
    if case.get("s_per_iter_median") is None:
        return "no measured time per iteration (a correctness run: losses only)"
    if not case.get("budget_bytes") or not case.get("oversub"):
        return "no oversubscription: the budget was above the working set (nothing to replay against)"
    if not MODEL.match(str(case.get("model") or "")):
        return f"model {case.get('model')!r} is not one the recorder has"
    if str(case.get("policy")) not in POLICY:
        return f"policy {case.get('policy')!r} has no simulator counterpart"
    return None


def trace_for(model: str, gpu: str, cache: Path, record=None):
    """The recorded trace of ``model`` (the case's model string) with durations for ``gpu``, cached in ``cache``."""
    from uvmprefetch.trace.format import load, save
    m = MODEL.match(model)
    path = cache / (re.sub(r"\W+", "-", f"{model} {gpu}") + ".uvmt")
    if path.exists():
        return load(path), 0.0
    if record is None:
        from uvmprefetch.trace.models import record_model as record
    t0 = time.perf_counter()
    t = record(m["family"], m["config"], batch=int(m["batch"]), seq=int(m["seq"]) if m["seq"] else None,
               iters=RECORD_ITERS, dtype=m["dtype"], gpu=gpu, foreach=False)
    cache.mkdir(parents=True, exist_ok=True)
    save(t, path)
    return t, time.perf_counter() - t0


def steady(xs: list[float], first: int) -> float:
    """Median of ``xs[first:]``; the last one when the run is shorter."""
    tail = xs[min(first, len(xs) - 1):]
    return statistics.median(tail)


def predict(case: dict, trace, gpu: str, host: str = "live-sync") -> dict:
    """Replay ``trace`` as ``case`` ran and compare: the case's ``fidelity`` field."""
    from uvmprefetch.sim.replay import replay
    first = int(case.get("steady_from_iteration") or 2)
    t0 = time.perf_counter()
    r = replay(trace, POLICY[case["policy"]], gpu, oversub=float(case["oversub"]), host=host,
               discards=bool(case.get("discards")), evict="uvm")
    its = r["iteration_times_s"]
    pred = steady(its, first)
    meas = float(case["s_per_iter_median"])
    n = len(its)
    per_iter = lambda v: v / n  # noqa: E731 - the host counters are whole-run sums
    out = {"replayed": True, "profile": gpu, "host": host, "evict": "uvm", "discards": bool(case.get("discards")),
           "trace": f"record_model {case['model']}, {n} iterations, AdamW for-loop",
           "predicted_s_per_iter": round(pred, 4), "measured_s_per_iter": meas,
           "error": round(pred / meas - 1.0, 4), "within_target": abs(pred / meas - 1.0) <= TARGET,
           "ideal_s_per_iter": round(steady(r["ideal_iteration_times_s"], first), 4),
           "plain_s_per_iter": case.get("plain_s_per_iter"),
           "htod_gib_per_iter": [round(steady(r["iteration_bytes_htod"], first) / GiB, 2), case.get("htod_gib_per_iter")],
           "dtoh_gib_per_iter": [round(steady(r["iteration_bytes_dtoh"], first) / GiB, 2), case.get("dtoh_gib_per_iter")],
           "host_blocked_s_per_iter": [round(per_iter(r.get("host_blocked_s", 0.0)), 3), case.get("evict_s_per_iter")],
           "host_decision_s_per_iter": [round(per_iter(r.get("host_decision_s", 0.0)), 3),
                                        case.get("policy_s_per_iter")],
           "fault_stall_s_per_iter": round(per_iter(r["fault_stall_s"]), 3),
           "oversub": round(r["oversub"], 3), "replay_wall_s": round(time.perf_counter() - t0, 1),
           "note": "pairs are [predicted, measured]; steady state from iteration "
                   f"{min(first, n - 1)} of the replay"}
    return out


def run_cases(data: dict, cache: Path, host: str = "live-sync", only: str | None = None, record=None,
              log=print) -> dict:
    """``fidelity`` for every case of ``data`` (gpu.json's content, changed in place); returns {device: [names]}."""
    from calibrate import base_profile_for
    done: dict = {}
    for device, entry in data.items():
        gpu = base_profile_for(device)  # (the board that was measured: its calibrated profile)
        for case in entry.get("cases", []):
            if only and not re.search(only, case["name"]):
                continue
            why = why_not(case)
            if why:
                case["fidelity"] = {"replayed": False, "why": why}
                continue
            trace, rec_s = trace_for(case["model"], gpu, cache, record)
            if rec_s:
                log(f"recorded {case['model']} for {gpu} in {rec_s:.0f} s")
            case["fidelity"] = predict(case, trace, gpu, host)
            f = case["fidelity"]
            log(f"{device[:14]:14s} {case['name']:45s} predicted {f['predicted_s_per_iter']:7.3f} s measured "
                f"{f['measured_s_per_iter']:7.3f} s error {f['error']:+.0%}")
            done.setdefault(device, []).append(case["name"])
    return done
