"""``bench/gpu/fidelity.py --cases``: GIVEN a GPU baseline file with a budgeted case, a correctness case (no time)
and a case that fits WHEN the cases are replayed on the CPU THEN the budgeted case's ``fidelity`` field holds the
replay of a trace recorded with the same model string (checked against a direct replay), the others say why they
were not replayed, and the device entry's own fields (date, driver, torch) are left as they were."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "bench" / "gpu"
sys.path.insert(0, str(GPU))

DEVICE = "NVIDIA H100 80GB HBM3"


def baseline(path: Path) -> None:
    common = {"model": "gpt2-small b2 s128 fp32", "discards": False, "iterations": 4, "plain_s_per_iter": 0.01,
              "htod_gib_per_iter": 0.1, "dtoh_gib_per_iter": 0.1, "host_us_per_launch": None,
              "training_thread_wait_s": None, "losses_bit_equal_plain": None}
    cases = [
        {"name": "oversub/gpt2-small/uvmprefetch/1.5", "budget_bytes": 10**9, "oversub": 1.5, "policy": "uvmprefetch",
         "s_per_iter_median": 0.05, "steady_from_iteration": 2, "evict_s_per_iter": 0.01, **common},
        {"name": "correctness/gpt2-small/managed", "budget_bytes": None, "oversub": None, "policy": "demand",
         "s_per_iter_median": None, **common},
        {"name": "overhead/gpt2-small/fits", "budget_bytes": 10**10, "oversub": None, "policy": "uvmprefetch",
         "s_per_iter_median": 0.02, **common},
    ]
    path.write_text(json.dumps({DEVICE: {"date": "D", "commit": "C", "driver": "580", "torch": "2.11",
                                         "cases": cases, "microbench": {}}}))


def test_cases_get_their_fidelity_field(tmp_path):
    path = tmp_path / "gpu.json"
    baseline(path)
    p = subprocess.run([sys.executable, str(GPU / "fidelity.py"), "--cases", "--baseline", str(path), "--trace-cache",
                        str(tmp_path / "traces"), "--out", str(tmp_path / "out")], capture_output=True, text=True,
                       timeout=900, cwd=REPO)
    assert p.returncode in (0, 1), p.stderr  # 1: the made-up measurement is missed, a check failure, not a crash
    assert "| device | case |" in p.stdout and p.stdout.strip().splitlines()[-1] in ("fidelity: PASS", "fidelity: FAIL")
    data = json.loads(path.read_text())
    entry = data[DEVICE]
    assert (entry["date"], entry["driver"], entry["torch"]) == ("D", "580", "2.11")
    by = {c["name"]: c for c in entry["cases"]}
    f = by["oversub/gpt2-small/uvmprefetch/1.5"]["fidelity"]
    assert f["replayed"] and f["host"] == "live-sync" and f["profile"] == "h100-sxm"
    assert f["oversub"] == pytest.approx(1.5, rel=0.02)
    assert f["measured_s_per_iter"] == 0.05 and f["error"] == pytest.approx(f["predicted_s_per_iter"] / 0.05 - 1,
                                                                              abs=1e-3)
    assert f["host_blocked_s_per_iter"][1] == 0.01 and f["htod_gib_per_iter"][1] == 0.1
    assert by["correctness/gpt2-small/managed"]["fidelity"] == {
        "replayed": False, "why": "no measured time per iteration (a correctness run: losses only)"}
    assert not by["overhead/gpt2-small/fits"]["fidelity"]["replayed"]
    # the prediction is the replay of the cached trace, as the case ran (steady iterations from 2 on)
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.format import load
    (trace,) = (tmp_path / "traces").glob("*.uvmt")
    t = load(trace)
    assert t.meta["optimizer"] == "AdamW(for-loop)" and t.meta["gpu"] == "h100-sxm"
    import _fidelity_cases as F
    case = by["oversub/gpt2-small/uvmprefetch/1.5"]
    again = replay(t, "uvmprefetch", "h100-sxm", oversub=1.5, host="live-sync:measure_decision=false",
                   discards=False, evict="uvm")
    assert again["oversub"] == pytest.approx(1.5, rel=0.05)
    assert F.steady(again["iteration_times_s"], 2) > 0 and f["ideal_s_per_iter"] == pytest.approx(
        F.steady(again["ideal_iteration_times_s"], 2), rel=1e-3)
    assert F.why_not(case) is None


def test_a_bad_baseline_is_one_line(tmp_path):
    bad = tmp_path / "gpu.json"
    bad.write_text("[1]")
    p = subprocess.run([sys.executable, str(GPU / "fidelity.py"), "--cases", "--baseline", str(bad)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "gpu.json" in p.stderr
