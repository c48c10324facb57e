"""bench/policy_cost.py and bench/ablation.py run end to end on a small trace and write their JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace.format import save

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def small_trace(tmp_path):
    p = tmp_path / "small.uvmt"
    save(training_trace(layers=4, iterations=3), p)
    return p


def run(args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_policy_cost_reports_microseconds_per_launch(small_trace, tmp_path):
    out = tmp_path / "res"
    r = run(["bench/policy_cost.py", str(small_trace), "--out", str(out), "--policies", "uvmprefetch,deepum",
             "--rounds", "2"])
    assert r.returncode == 0, r.stderr
    data = json.loads(next(out.glob("policy-cost-*.json")).read_text())
    rows = {x["policy"]: x for x in data["results"]}
    assert set(rows) == {"uvmprefetch", "deepum"}
    for x in rows.values():
        assert x["launches"] > 0 and 0 < x["on_launch_median_us"] <= x["on_launch_p99_us"]
        lo, hi = x["on_launch_median_spread_us"]
        assert len(x["rounds"]) == 2 and lo <= x["on_launch_median_us"] <= hi
        assert x["on_launch_steady_median_us"] > 0
        # one median per iteration of the trace (3), the last of which is the steady state's
        by_it = x["on_launch_by_iteration_median_us"]
        assert len(by_it) == 3 and all(v > 0 for v in by_it)
        assert len(x["rounds"][0]["by_iteration"]) == 3
    assert "on_launch median us" in r.stdout and "2 timed rounds" in r.stdout
    assert "uvmprefetch: on_launch median by iteration (us): " in r.stdout


def test_policy_cost_rejects_zero_rounds(small_trace, tmp_path):
    r = run(["bench/policy_cost.py", str(small_trace), "--out", str(tmp_path), "--rounds", "0"])
    assert r.returncode == 2 and "--rounds" in r.stderr and "Traceback" not in r.stderr


def test_policy_cost_bad_policy_is_one_line_error(small_trace, tmp_path):
    r = run(["bench/policy_cost.py", str(small_trace), "--out", str(tmp_path), "--policies", "nope"])
    assert r.returncode == 2 and "unknown policy" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_ablation_table_and_json(small_trace, tmp_path):
    r = run(["bench/ablation.py", "--traces", str(small_trace), "--oversub", "2", "--no-patterns", "--out",
             str(tmp_path)])
    assert r.returncode == 0, r.stderr
    data = json.loads(next(tmp_path.glob("ablation-*.json")).read_text())
    labels = [a["configuration"] for a in data["ablation"]]
    assert labels[:2] == ["deepum", "prefetch only"] and labels[-1] == "oracle"
    assert data["targets"][0]["oversub"] == 2.0 and data["quality"]
    # Both measures: the whole trace and the steady state (last iteration), each for every oversub level.
    assert [t["measure"] for t in data["targets"]] == ["time_s", "steady_slowdown"]
    assert {a["measure"] for a in data["ablation"]} == {"time_s", "steady_slowdown"}
    assert all(t["uvm_over_oracle"] > 0 for t in data["targets"])
    assert "## Ablation" in r.stdout and "## Targets: steady state" in r.stdout
