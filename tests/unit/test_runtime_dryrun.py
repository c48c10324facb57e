"""The done-when of issue 5 on the CPU: an unchanged transformers GPT-2 script under ``UVMPREFETCH=1`` with the
dryrun backend trains 3 iterations with the same losses as without, and the report shows a working set above
the budget being served. Runs the example as a subprocess, through the installed start-up hook."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from uvmprefetch.trace import load

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt2.py"
BUDGET = 24 << 20  # the example's working set is ~36 MiB of live tensors


def _run(tmp_path, name, extra_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", **extra_env)
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, str(EXAMPLE), "--iters", "3", "--out", str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text()), r.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dryrun")
    plain, _ = _run(tmp, "plain", {})
    report, trace = tmp / "report.json", tmp / "run.uvmt"
    live, err = _run(tmp, "live", {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun",
                                   "UVMPREFETCH_BUDGET": str(BUDGET), "UVMPREFETCH_REPORT": str(report),
                                   "UVMPREFETCH_TRACE": str(trace)})
    return plain, live, err, json.loads(report.read_text()), trace


def test_losses_equal_with_and_without_the_runtime(runs):
    plain, live, _, _, _ = runs
    assert plain["device"] == live["device"] == "cpu"
    assert len(live["losses"]) == 3
    assert live["losses_hex"] == plain["losses_hex"]  # bit for bit


def test_report_shows_working_set_above_budget_served(runs):
    _, _, err, rep, _ = runs
    assert rep["backend"] == "dryrun" and rep["iterations"] == 3 and not rep["degraded"] and rep["errors"] == []
    assert rep["budget_bytes"] == BUDGET
    assert rep["working_set_bytes"] > BUDGET  # oversubscribed
    assert 0 < rep["peak_resident_bytes"] <= BUDGET  # the model never held more than the budget
    assert rep["bytes_dtoh"] > 0 and rep["bytes_htod"] > rep["peak_resident_bytes"]  # blocks went out and came back
    served = rep["faults"] + (rep["prefetch_useful_bytes"] or 0) // rep["block_size"]
    assert served > 0
    ph = rep["launches_by_phase"]
    assert ph["forward"] > 0 and ph["backward"] > 0 and ph["optimizer"] > 0
    assert len(rep["iter_s"]) == 3 and len(rep["model_iter_s"]) == 3
    assert "uvmprefetch: dryrun run" in err  # the human summary on stderr
    # the C++ observer (built here: a compiler is on every test machine) recorded every planned launch, and
    # says what its callbacks cost the training thread
    ot = rep["observe_time"]
    assert rep["observer"]["kind"] == ot["observer"] == "native"
    assert ot["recorded"] == rep["launches"] > 0 and ot["dropped_records"] == 0
    assert 0 < ot["callback_s"] < sum(rep["iter_s"])
    assert ot["planner"]["dormant"] is False  # a trace is recorded: every launch is planned from the start
    assert ot["planner"]["max_lag"] == 0 and ot["planner"]["shed_windows"] == 0  # and none is ever shed
    # the monitor, per iteration, from the simulated GPU: faults and late prefetches as it saw them
    mon = rep["monitor"]
    assert len(mon) == 3 and all(m["source"] == "model" for m in mon)
    assert sum(m["fault_blocks"] for m in mon) == rep["faults"]


def test_dead_data_is_dropped_only_with_uvmprefetch_discard(runs, tmp_path):
    """As on the GPU: by default nothing is dropped dead or zero-filled, and the policy, told so, takes no frees as
    deaths and asks for no discards; made to take them anyway (``invalidate_without_discard``), its discards are
    evictions. With ``UVMPREFETCH_DISCARD=1`` the model drops dead blocks. The report says which, for replays."""
    be, pol = runs[3]["backend_result"], runs[3]["policy_report"]
    assert be["discards_issued"] is False and be["discards"] == 0 and be["zero_fill_blocks"] == 0
    assert pol["invalidating"] is False and pol["discarded_blocks"] == 0 and be["refused_discards"] == 0

    def run(name, **env):
        report = tmp_path / f"{name}.json"
        _run(tmp_path, name, {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_BUDGET": str(BUDGET),
                              "UVMPREFETCH_REPORT": str(report), **env})
        return json.loads(report.read_text())
    old = run("always", UVMPREFETCH_POLICY="uvmprefetch:invalidate_without_discard=true")
    assert old["policy_report"]["invalidating"] is True
    assert old["backend_result"]["refused_discards"] >= old["policy_report"]["discarded_blocks"] > 0
    on = run("discard", UVMPREFETCH_DISCARD="1")
    assert on["policy_report"]["invalidating"] is True
    on = on["backend_result"]
    assert on["discards_issued"] is True and on["discards"] > 0 and on["bytes_dtoh"] < be["bytes_dtoh"]


def test_live_trace_is_a_valid_trace_of_the_run(runs):
    _, _, _, rep, trace = runs
    t = load(trace)  # validates
    assert t.n_launches == rep["launches"] and t.iterations == 3
    assert t.n_allocs == rep["allocations_seen"]
    assert (t.free_at >= 0).any()  # tensor deaths were recorded


def test_trace_exec_ids_are_the_live_ones(runs):
    _, _, _, rep, trace = runs
    t = load(trace)
    # the same op on the same shapes gets the same execution id in iterations 1 and 2 (steady state)
    it = t.launch_iter
    a, b = t.launch_exec_id[it == 1], t.launch_exec_id[it == 2]
    assert a.size == b.size and (a == b).mean() > 0.95


AUTOCAST_SCRIPT = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(64, 256)
for _ in range(2):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


def test_live_trace_keeps_the_flop_dtype_for_re_estimates(tmp_path):
    """A live trace replayed on another GPU profile is re-estimated from its FLOPs, in the dtype they ran in.
    Under bf16 autocast the matmuls are bf16: the trace must say so (``flop_dtype_runs``), or every matmul is
    re-estimated at the fp32 peak (on the H100 that made fidelity.py's compute model 4x too slow). Check:
    re-estimating on the recording's own profile gives back the recorded durations."""
    from uvmprefetch.trace.roofline import FLOP_DTYPES, dtype_codes, durations_for
    script = tmp_path / "train.py"
    script.write_text(AUTOCAST_SCRIPT)
    trace, report = tmp_path / "run.uvmt", tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(OMP_NUM_THREADS="1", UVMPREFETCH="1", UVMPREFETCH_BACKEND="dryrun", UVMPREFETCH_TRACE=str(trace),
               UVMPREFETCH_REPORT=str(report))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(report.read_text())
    t = load(trace)
    assert rep["launches"] == t.n_launches > 0
    codes = dtype_codes(t)
    flop = t.launch_flops > 0
    assert flop.any() and {FLOP_DTYPES[c] for c in codes[flop]} == {"bf16"}
    again = durations_for(t, rep["gpu"])
    assert np.allclose(again, t.launch_dur, rtol=1e-12, atol=0)
