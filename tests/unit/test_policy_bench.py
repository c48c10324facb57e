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


def assert_one_line_error(r, says: str) -> None:
    """The script exited 2 with one line on stderr, ``error: ...``, naming ``says``."""
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and err[0].startswith("error:") and says in err[0], r.stderr


def _module(name):
    """``bench/<name>.py`` loaded as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_policy_cost_takes_a_standard_trace_by_name(small_trace, tmp_path):
    # GIVEN the trace cache holding a trace where the standard gpt2-large lives (here the small one: no recording),
    # WHEN policy_cost is given the name, THEN it replays that file under the name
    import os
    import shutil

    from uvmprefetch.trace.standard import trace_path
    cache = tmp_path / "cache"
    dest = trace_path("gpt2-large", cache)
    dest.parent.mkdir(parents=True)
    shutil.copy(small_trace, dest)
    out = tmp_path / "res"
    r = subprocess.run([sys.executable, "bench/policy_cost.py", "gpt2-large", "--out", str(out), "--policies",
                        "uvmprefetch", "--rounds", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "UVMPREFETCH_TRACE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    data = json.loads(next(out.glob("policy-cost-*.json")).read_text())
    assert [x["trace"] for x in data["results"]] == ["gpt2-large"] and data["results"][0]["launches"] > 0


def test_policy_cost_rejects_zero_rounds(small_trace, tmp_path):
    r = run(["bench/policy_cost.py", str(small_trace), "--out", str(tmp_path), "--rounds", "0"])
    assert r.returncode == 2 and "--rounds" in r.stderr and "Traceback" not in r.stderr


def test_policy_cost_disturbs_the_caches_before_each_launch_outside_the_timing():
    """--disturb reads other memory before each on_launch (as a live run's own work does between two hooks),
    never before the other hooks, and never inside the timed span."""
    import time
    mod = _module("policy_cost")

    class Reads:
        calls = 0

        def sum(self):
            self.calls += 1
            time.sleep(0.05)

    class Hooks:
        def on_launch(self, info, state):
            return None

        on_fault = on_free = on_evict = on_iteration = on_launch

    pol, reads = Hooks(), Reads()
    ns = mod.timed(pol, reads)
    for _ in range(3):
        pol.on_launch(None, None)
    pol.on_fault(None, None)
    assert reads.calls == 3 and len(ns["on_launch"]) == 3 and len(ns["on_fault"]) == 1
    assert max(ns["on_launch"]) < 0.05e9  # the 50 ms read is not in the launch's time


def test_policy_cost_rejects_a_bad_disturb(small_trace, tmp_path):
    r = run(["bench/policy_cost.py", str(small_trace), "--out", str(tmp_path), "--disturb", "-1"])
    assert r.returncode == 2 and "--disturb" in r.stderr and "Traceback" not in r.stderr


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


@pytest.mark.slow
def test_kernel_profile_times_every_marked_stage(tmp_path):
    import re
    # GIVEN the stage markers in the kernels' source
    src = "\n".join(p.read_text() for p in (ROOT / "uvmprefetch" / "policy" / "uvmprefetch").glob("*.py"))
    marked = set(re.findall(r"^\s*# stamp: (.+?)\s*$", src, flags=re.M))
    assert {"commit_step", "match", "launch_marks", "window pass"} <= marked
    # WHEN the profiler replays the shipped small trace with a stamped copy of the policy
    # (reading 1 MiB of other memory before each launch, as between two live hooks)
    r = run(["bench/kernel_profile.py", str(ROOT / "traces" / "gpt2-small-b2s128.uvmt"), "--disturb", "1",
             "--out", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    data = json.loads(next(tmp_path.glob("kernel-profile-*.json")).read_text())
    assert data["disturb_mib"] == 1 and "1 MiB read before each" in r.stdout
    # THEN every marked stage has a row, the launches of the steady state went through the stamped step, and the
    # stamped time is a part of on_launch's
    stages = {x["stage"]: x for x in data["stages"]}
    assert set(stages) == marked
    assert 0 < data["stepped_launches"] <= data["launches"]
    assert stages["commit_step"]["calls"] == data["stepped_launches"] and stages["commit_step"]["us_per_call"] > 0
    assert 0 < data["stamped_us_per_launch"] < data["on_launch_mean_us"]
    assert "| commit_step |" in r.stdout and "outside the stamps" in r.stdout


def test_kernel_profile_bad_input_is_one_line_error(tmp_path):
    r = run(["bench/kernel_profile.py", str(tmp_path / "missing.uvmt"), "--out", str(tmp_path)])
    assert r.returncode == 2 and "no trace at" in r.stderr and "Traceback" not in r.stderr
    r = run(["bench/kernel_profile.py", str(ROOT / "traces" / "gpt2-small-b2s128.uvmt"), "--from-iteration", "99",
             "--out", str(tmp_path)])
    assert r.returncode == 2 and "--from-iteration 99" in r.stderr and "Traceback" not in r.stderr
    r = run(["bench/kernel_profile.py", "--disturb", "-5", "--out", str(tmp_path)])
    assert r.returncode == 2 and "--disturb" in r.stderr and "Traceback" not in r.stderr


def test_kernel_profile_needs_markers(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import kernel_profile
    finally:
        sys.path.remove(str(ROOT / "bench"))
    # GIVEN a folder of modules, one with markers WHEN it is instrumented THEN the markers became stamp calls, the
    # module imports them, and the stamps' module holds a counter array for the one stage
    (tmp_path / "a.py").write_text("import numpy as np\n\ndef f():\n    # stamp-start\n    x = 1\n"
                                   "    # stamp: one\n    return x\n")
    (tmp_path / "b.py").write_text("import numpy as np\n")
    names = kernel_profile.instrument(tmp_path)
    src = (tmp_path / "a.py").read_text()
    assert names == ["one"] and "    _stamp_start()\n" in src and "    _stamp(0)\n" in src
    assert "from ._stamps import _stamp, _stamp_start" in src and "_stamps" not in (tmp_path / "b.py").read_text()
    assert "STAMPS = np.zeros(6" in (tmp_path / "_stamps.py").read_text()
    # ... and a folder without markers is refused
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "c.py").write_text("import numpy as np\n")
    with pytest.raises(SystemExit, match="no '# stamp:' markers"):
        kernel_profile.instrument(empty)


def test_decision_budget_is_the_largest_cost_before_the_first_one_over_the_tolerance():
    budget = _module("decision_budget").budget
    # (a cost past the first one over is not counted, even back within the tolerance: the budget has no gaps)
    assert budget([0, 10, 20, 40], [1.0, 1.004, 1.02, 1.003], 0.01) == (10, 20)
    assert budget([0, 10, 20], [1.0, 1.0, 1.009], 0.01) == (20, None)
    assert budget([0, 10], [1.0, 1.5], 0.01) == (0, 10)


def test_decision_budget_replays_each_cost_and_the_measured_one(small_trace, tmp_path):
    out = tmp_path / "res"
    r = run(["bench/decision_budget.py", str(small_trace), "--out", str(out), "--costs", "50,5000", "--oversub",
             "1.5", "--no-progress"])
    assert r.returncode == 0, r.stderr
    data = json.loads(next(out.glob("decision-budget-*.json")).read_text())
    assert next(out.glob("decision-budget-*.png")).stat().st_size > 0
    assert data["meta"]["host"]["blocking_evict"] and data["meta"]["host"]["sync_iterations"]
    (x,) = data["results"]
    assert x["costs_us"] == [0.0, 50.0, 5000.0] and x["ratios"][0] == 1.0 and len(x["time_s"]) == 3
    # 5 ms of host time per launch outruns any kernel of this trace: the host bounds the run
    assert x["ratios"][2] > 1.5 and x["host_stall_s"][2] > x["host_stall_s"][0]
    assert x["first_over_us"] is not None and x["budget_us"] < x["first_over_us"]
    m = x["measured"]
    assert 0 < m["median_us"] <= m["p90_us"] and m["host_decision_s"] > 0 and m["ratio"] >= 1.0
    assert "| budget (<= +1%) |" in r.stdout and "small" in r.stdout


@pytest.mark.parametrize("flag, value, says", [("--costs", "a,b", "--costs"), ("--costs", "-5", "--costs"),
                                              ("--tolerance", "0", "--tolerance"), ("--oversub", "0.5", "--oversub"),
                                              ("--launch-us", "-1", "--launch-us")])
def test_decision_budget_names_a_bad_argument(small_trace, tmp_path, flag, value, says):
    r = run(["bench/decision_budget.py", str(small_trace), "--out", str(tmp_path), flag, value])
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("script", ["replay_bench", "ablation", "iteration_marks"])
def test_a_trace_file_that_does_not_load_is_one_line(script, tmp_path):
    bad = tmp_path / "bad.uvmt"
    bad.write_bytes(b"NOTTRACE")
    r = run([f"bench/{script}.py", "--traces", str(bad), "--out", str(tmp_path / "out")])
    assert_one_line_error(r, "bad.uvmt")
    assert not (tmp_path / "out").exists()


def test_wasted_prefetch_splits_every_prefetched_block_once(small_trace):
    # GIVEN a small training trace at 3x WHEN bench/wasted_prefetch.py follows uvmprefetch's prefetches THEN its
    # replay took the same decisions as an untracked one (the script checks and exits 1 otherwise), and each
    # iteration's categories add up to its total
    r = run(["bench/wasted_prefetch.py", str(small_trace), "--oversub", "3", "--iterations", "1,2"])
    assert r.returncode == 0, r.stderr
    tables = r.stdout.split("\niteration ")[1:]
    assert len(tables) == 2
    for t in tables:
        total = float(t.split(" GiB prefetched")[0].split(": ")[1])
        rows = [line.split("|")[1:-1] for line in t.splitlines() if line.startswith("| ") and "---" not in line]
        body = [[float(c) for c in row[2:]] for row in rows[1:-1]]
        assert abs(sum(b[-1] for b in body) - total) < 0.02
        for b in body:  # used + evicted + discarded + never = total; used later <= evicted unused
            assert abs(sum(b[:4]) - b[-1]) < 0.02 and b[4] <= b[1] + 1e-9
    assert total > 0


def test_wasted_prefetch_counts_only_the_prefetches_the_replay_issued(small_trace):
    # GIVEN a small training trace at 2x without discards and with UVM's eviction, where decisions wait in the
    # planner's queue and part of what they list is faulted in first or finds no room once the mover applies them
    # WHEN bench/wasted_prefetch.py follows every iteration
    r = run(["bench/wasted_prefetch.py", str(small_trace), "--oversub", "2", "--no-discard", "--evict", "uvm",
             "--iterations", "0,1,2"])
    assert r.returncode == 0, r.stderr
    issued = float(r.stdout.split(" GiB of prefetches issued")[0].rsplit(", ", 1)[1])
    heads = [line for line in r.stdout.splitlines() if line.startswith("iteration ")]
    counted = [float(h.split(": ")[1].split(" GiB")[0]) for h in heads]
    listed = [float(h.split("(")[1].split(" listed")[0]) for h in heads]
    # THEN the blocks it counts add up to at most what the replay issued, though the decisions listed more
    assert len(heads) == 3 and 0 < sum(counted) <= issued + 0.01 < sum(listed)
    assert all(c <= li + 0.01 for c, li in zip(counted, listed))


def test_wasted_prefetch_rejects_another_policy_in_one_line(small_trace):
    r = run(["bench/wasted_prefetch.py", str(small_trace), "--policy", "demand"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: --policy 'demand': only uvmprefetch is tracked"]


def test_refetch_splits_each_iterations_h2d_bytes_by_why_they_crossed(small_trace):
    # GIVEN a small training trace at 3x WHEN bench/refetch.py follows every block that crosses the link under
    # uvmprefetch and the oracle THEN the tracked replays took the same decisions as untracked ones and each
    # iteration's rows add up to the replay's own H2D bytes (the script checks both and exits 1 otherwise), and the
    # printed tables add up too, with data that crossed again after an eviction in the same iteration among them
    r = run(["bench/refetch.py", str(small_trace), "--oversub", "3", "--iterations", "1,2"])
    assert r.returncode == 0, r.stderr
    tables = r.stdout.split("\niteration ")[1:]
    assert len(tables) == 2
    again = 0.0
    for t in tables:
        rows = [[c.strip() for c in line.split("|")[1:-1]] for line in t.splitlines()
                if line.startswith("| ") and "---" not in line]
        head, body, total = rows[0], rows[1:-1], rows[-1]
        assert head[4].startswith("uvmprefetch GB") and head[6].startswith("oracle GB")
        for col in (4, 6):
            assert abs(sum(float(b[col]) for b in body) - float(total[col])) < 0.05
        assert float(total[4]) > 0 and all(b[0] in ("first", "first, left", "again", "not needed") for b in body)
        again += sum(float(b[4]) for b in body if b[0] == "again")
    assert again > 0


@pytest.mark.parametrize("flag, value, says", [("--policies", "nosuch", "nosuch"), ("--iterations", "9", "0..2"),
                                              ("--iterations", "a", "--iterations")])
def test_refetch_names_a_bad_argument_in_one_line(small_trace, flag, value, says):
    r = run(["bench/refetch.py", str(small_trace), flag, value])
    assert_one_line_error(r, says)


def test_link_idle_splits_the_lost_link_time_by_cause_and_by_kind():
    # GIVEN the shipped GPT-2 small trace at 1.7x (its activations move: launches stall on late blocks) WHEN
    # bench/link_idle.py follows uvmprefetch's decisions THEN its two replays took the same decisions (the script
    # exits 2 otherwise), each iteration's lost link time is part of its idle time, and the causes and the kinds of
    # block each add up to it; some link time is lost (the stalls are real); how the pointer followed the record
    # accounts for each of the iteration's launches once; the first iteration has no record to jump into, the
    # third (the allocator settled) follows the second's exactly
    r = run(["bench/link_idle.py", "traces/gpt2-small-b2s128.uvmt", "--oversub", "1.7", "--iterations", "0,1,2"])
    assert r.returncode == 0, r.stderr
    rest, follow = r.stdout.split("\nhow the pointer followed the record: launches")
    causes, kinds = [t.splitlines() for t in rest.split("\nlost link s by the missing block's kind")]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in causes
            if line.startswith("| ") and "---" not in line]
    head, body = rows[0], rows[1:]
    assert [b[0] for b in body] == ["0", "1", "2"]
    lost = head.index("lost s")
    total = 0.0
    for b in body:
        idle, lo = float(b[head.index("link idle s")]), float(b[lost])
        assert lo <= idle + 1e-9 and abs(sum(float(c) for c in b[lost + 2:]) - lo) < 0.003
        assert float(b[lost + 1]) <= lo + 1e-9  # (of which for the step)
        total += lo
    k = [[float(c) for c in line.split("|")[2:-1]] for line in kinds if line.startswith("| ") and line[2].isdigit()]
    assert len(k) == 3 and all(abs(sum(row) - float(b[lost])) < 0.003 for row, b in zip(k, body))
    assert total > 0
    f = [[int(c) for c in line.split("|")[1:-1]] for line in follow.splitlines()
         if line.startswith("| ") and line[2].isdigit()]
    from uvmprefetch.trace.format import load
    its = load("traces/gpt2-small-b2s128.uvmt").launch_iter
    assert [row[0] for row in f] == [0, 1, 2]
    assert all(sum(row[1:]) == int((its == row[0]).sum()) for row in f)
    assert f[0][4:7] == [0, 0, 0] and f[0][7] > 0  # (iteration 0's jumps land in its own launches)
    assert f[2][1] == int((its == 2).sum())


def test_link_idle_rejects_another_policy_in_one_line(small_trace):
    r = run(["bench/link_idle.py", str(small_trace), "--policy", "demand"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: --policy 'demand': only uvmprefetch is watched"]


def test_profile_factors_chain_adds_one_difference_of_the_default_profile_at_a_time():
    # GIVEN bench/profile_factors.py's chain WHEN each setting is compared with the one before THEN it differs in
    # exactly the fields of one difference (populate costs, fault costs, then the link and copy path), starts at
    # h100-pcie-lit with an idle host and ends at the bench's default (h100-pcie, host live)
    import dataclasses
    from uvmprefetch.gpus import PROFILES
    chain = _module("profile_factors").settings()
    assert [c[0] for c in chain] == ["lit", "+fresh", "+faults", "+link", "default"]
    assert chain[0][1] == PROFILES["h100-pcie-lit"] and chain[0][2] == "free"
    assert chain[-1][1] is PROFILES["h100-pcie"] and chain[-1][2] == "live"

    def diff(a, b):
        return {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)} - {"name"}

    assert diff(chain[0][1], chain[1][1]) == {"repopulate_call_s", "repopulate_block_s"}
    assert diff(chain[1][1], chain[2][1]) == {"fault_batch_size", "fault_batch_latency_s"}
    assert diff(chain[2][1], chain[3][1]) == {"link_htod_bw", "link_dtoh_bw", "copy_dtoh_bw", "copy_htod_bw",
                                              "copy_call_s", "discard_call_s", "discard_block_s", "calibrated",
                                              "sources"}
    assert chain[3][1] is chain[4][1] and chain[3][2] == "free"


def test_profile_factors_prints_each_settings_ratio_and_the_steps_between():
    # GIVEN the shipped GPT-2 small trace at 1.5x WHEN bench/profile_factors.py replays it in the chain THEN the
    # literature row is a plain replay's ratio to the oracle's, fresh memory takes iteration 0's cold data off the
    # link for both policies (the literature profile moves every first touch), and the steps add up to the chain's
    # end minus its start
    from uvmprefetch.policy import make_policy
    from uvmprefetch.sim.replay import replay
    r = run(["bench/profile_factors.py", "traces/gpt2-small-b2s128.uvmt", "--oversub", "1.5"])
    assert r.returncode == 0, r.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in r.stdout.splitlines()
            if line.startswith("| 1.5 ")]
    assert [row[1] for row in rows] == ["lit", "+fresh", "+faults", "+link", "default"]
    from uvmprefetch.trace.format import load
    t = load("traces/gpt2-small-b2s128.uvmt")
    u = replay(t, make_policy("uvmprefetch"), "h100-pcie-lit", oversub=1.5, host="free")
    o = replay(t, make_policy("oracle"), "h100-pcie-lit", oversub=1.5, host="free")
    assert float(rows[0][2]) == pytest.approx(u["time_s"] / o["time_s"], abs=1e-4)

    def h2d(row):
        mine, oracle = row[6].replace(")", "").split(" (")
        return float(mine), float(oracle)

    assert all(b < a for a, b in zip(h2d(rows[0]), h2d(rows[1])))
    whole = [float(row[2]) for row in rows]
    steps = r.stdout.splitlines()[-1].split("each step: ")[1].split(", ")
    assert abs(sum(float(s.split()[-1]) for s in steps) - (whole[-1] - whole[0])) < 5e-4


@pytest.mark.parametrize("flag, value, says", [("--oversub", "0.5", "--oversub"), ("--oversub", "x", "--oversub"),
                                              ("--settings", "lit,nosuch", "--settings"),
                                              ("--policy", "demand", "only uvmprefetch")])
def test_profile_factors_names_a_bad_argument_in_one_line(small_trace, flag, value, says):
    r = run(["bench/profile_factors.py", str(small_trace), flag, value])
    assert_one_line_error(r, says)


def test_stall_queue_puts_each_iterations_stall_on_its_launches_and_counts_the_copy_engines():
    # GIVEN the shipped GPT-2 small trace at 1.7x (launches stall on late blocks) WHEN bench/stall_queue.py replays it
    # under uvmprefetch THEN each iteration's time and stall are the replay's own (the stall from the compute stream's
    # gaps, the replay's from its launches' waits: within 2 % and 0.05 ms), the listed launches are the longest waits
    # (sorted, none above the stall), and the engine table's D2H blocks add up to no more than the blocks copied out
    # or discarded in the whole run
    from uvmprefetch.policy import make_policy
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.format import load
    r = run(["bench/stall_queue.py", "traces/gpt2-small-b2s128.uvmt", "--oversub", "1.7", "--iterations", "1,2",
             "--policies", "uvmprefetch", "--top", "3"])
    assert r.returncode == 0, r.stderr
    t = load("traces/gpt2-small-b2s128.uvmt")
    u = replay(t, make_policy("uvmprefetch"), "h100-pcie", oversub=1.7, host="live", evict="auto")
    lines = r.stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("iteration ")]
    assert len(heads) == 2
    d2h = 0
    for it, i in zip((1, 2), heads):
        ms, stall = lines[i].split(": ")[1].split(", stall ")
        assert float(ms.split()[0]) == pytest.approx(u["iteration_times_s"][it] * 1e3, rel=0.01)
        want = u["iteration_stall_s"][it] * 1e3
        assert abs(float(stall.split()[0]) - want) <= 0.05 + 0.02 * want
        waits = [float(line.split("|")[3]) for line in lines[i + 4:i + 7]]
        assert waits == sorted(waits, reverse=True) and waits[0] <= float(stall.split()[0]) + 1e-3
        body = [line for line in lines[i + 7:(heads[1] if it == 1 else len(lines))] if line.startswith("| ")
                and line[2].isdigit()]
        d2h += sum(int(line.split("|")[4]) for line in body)
    assert u["stall_s"] > 0 and 0 < d2h <= u["copy_evictions"] + u["discard_only_evictions"]


@pytest.mark.parametrize("flag, value, says", [("--policies", "nosuch", "nosuch"), ("--iterations", "9", "0..2"),
                                              ("--top", "0", "--top"), ("--bucket", "0", "--bucket")])
def test_stall_queue_names_a_bad_argument_in_one_line(small_trace, flag, value, says):
    r = run(["bench/stall_queue.py", str(small_trace), flag, value])
    assert_one_line_error(r, says)
