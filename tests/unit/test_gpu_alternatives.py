"""GIVEN bench/gpu/alternatives.py (every way to train one model under one GPU memory budget) WHEN run on this CPU
machine THEN it refuses without a GPU in one line, its dry run trains every method for real (tiny GPT-2, CPU
tensors, no cap) to a table with every row, a plot and baseline rows, and its verdicts (peak within budget,
losses against plain, plain's expected out-of-memory, the product target) follow from the measurements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "bench" / "gpu"
sys.path.insert(0, str(GPU))

import alternatives as A  # noqa: E402


def _run(args: list[str], timeout: float = 1200.0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


# ------------------------------------------------------------------------------------------- the verdicts

def _res(losses, *, hexes=None, rc=0, policy=None, oom=None, iter_s=(1.0, 0.5, 0.4, 0.3), peak=None, report=None,
         budget=None, iters=4):
    """A run_training result as the worker and run_training write it."""
    return {"returncode": rc, "losses": list(losses), "losses_hex": hexes or [float(x).hex() for x in losses],
            "policy": policy, "runtime_active": report is not None, "report": report, "oom": oom,
            "iter_s": list(iter_s), "stderr_tail": "", "peak_reserved_bytes": peak, "budget_bytes": budget,
            "stopped_early": len(iter_s) < iters, "workload": {"iters": iters}}


REF = _res([10.0, 9.5, 9.0])


def test_losses_bit_equal_or_within_the_tolerance_the_mode_implies():
    same = A.compare_losses(REF, _res([10.0, 9.5, 9.0]), exact=True)
    assert same["bit_equal"] and same["ok"]
    near = _res([10.0, 9.5 * (1 + 1e-6), 9.0])
    assert A.compare_losses(REF, near, exact=True)["ok"] is False  # exact mode: one ulp is a difference
    tol = A.compare_losses(REF, near, exact=False)
    assert tol["ok"] is True and not tol["bit_equal"] and tol["max_rel"] == pytest.approx(1e-6)
    # the first loss (the forward from the same weights) is reported apart: a drift there is another kernel
    first_off = A.compare_losses(REF, _res([10.0 * (1 + 1e-7), 9.5, 9.0]), exact=False)
    assert first_off["ok"] is True and first_off["first_equal"] is False
    assert "first differs" in A.losses_cell(first_off, False, A.METHODS["fsdp-offload"])
    far = _res([10.0, 9.6, 9.0])
    assert A.compare_losses(REF, far, exact=False)["ok"] is False
    # only the common iterations count (a run cut by its time limit has fewer)
    assert A.compare_losses(REF, _res([10.0]), exact=True)["n"] == 1


def test_judge_reads_peak_against_budget_and_expected_oom():
    ckpt = A.METHODS["checkpoint"]
    over = A.judge(_res([10.0, 9.5, 9.0], peak=12, budget=10), ckpt, REF, warmup=2, exact=True, expect_oom=False)
    assert over["within_budget"] is False and over["s_per_iter"] == pytest.approx(0.35)
    under = A.judge(_res([10.0, 9.5, 9.0], peak=10, budget=10), ckpt, REF, warmup=2, exact=True, expect_oom=False)
    assert under["within_budget"] is True and under["problem"] == ""
    # plain under the cap: out of memory is the expected result; running means the cap does not bind
    oom = A.judge(_res([], rc=3, oom={"iteration": 0, "message": "CUDA out of memory"}, iter_s=(), peak=9,
                       budget=10), A.METHODS["plain"], REF, warmup=2, exact=True, expect_oom=True)
    assert oom["status"] == "OOM" and oom["oom_at"] == "iteration 0" and oom["s_per_iter"] is None
    ran = A.judge(_res([10.0, 9.5, 9.0], peak=9, budget=10), A.METHODS["plain"], REF, warmup=2, exact=True,
                  expect_oom=True)
    assert "does not bind" in ran["problem"]


def test_judge_under_the_runtime_uses_the_resident_peak_and_needs_an_active_runtime():
    u = A.METHODS["uvmprefetch"]
    rep = {"peak_resident_bytes": 8, "degraded": False}
    r = A.judge(_res([10.0, 9.5, 9.0], policy="uvmprefetch", peak=40, budget=10, report=rep), u, REF, warmup=2,
                exact=True, expect_oom=False)
    assert r["peak_gpu_bytes"] == 8 and r["within_budget"] is True  # peak reserved = the managed allocation
    dead = A.judge(_res([10.0, 9.5, 9.0], policy="uvmprefetch", budget=10), u, REF, warmup=2, exact=True,
                   expect_oom=False)
    assert dead["status"] == "failed" and "runtime not active" in dead["problem"]
    cut = A.judge(_res([], rc=124, iter_s=(), policy="uvmprefetch"), u, REF, warmup=2, exact=True, expect_oom=False)
    assert cut["status"] == "timed out" and cut["problem"].startswith("exit 124")


def test_steady_median_and_short_runs():
    assert A.steady([5.0, 1.0, 2.0, 3.0], 1) == (2.0, "")
    t, note = A.steady([5.0, 4.0], 3)
    assert t == 4.0 and "not steady" in note
    assert A.steady([], 3) == (None, "")
    cut = A.judge(_res([10.0, 9.5], iter_s=(1.0, 0.5), iters=6), A.METHODS["offload"], REF, warmup=3, exact=True,
                  expect_oom=False)
    assert "time limit: 2 of 6" in cut["note"]


def test_product_target_compares_uvmprefetch_with_the_code_change_alternatives_only():
    def row(m, t):
        return {"method": m, "oversub": "1.5", "verdict": {"s_per_iter": t}}
    rows = [row("checkpoint", 0.4), row("offload", 2.0), row("managed", 0.1), row("uvmprefetch", 0.3)]
    [c] = A.product_targets(rows, dry=False)
    assert c.ok is True and "checkpoint" in c.value  # managed needs no code change: not an alternative here
    rows[-1] = row("uvmprefetch", 8.0)
    assert A.product_targets(rows, dry=False)[0].ok is False
    rows[-1] = row("uvmprefetch", None)
    assert A.product_targets(rows, dry=False)[0].ok is False
    assert A.product_targets(rows, dry=True)[0].ok is None


# --------------------------------------------------------------------------------------------- the script

def test_help_and_no_gpu_is_one_line():
    h = _run([str(GPU / "alternatives.py"), "--help"], timeout=60)
    assert h.returncode == 0 and "usage:" in h.stdout and "--oversub" in h.stdout
    proc = _run([str(GPU / "alternatives.py")], timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 5 and len(err) == 1 and err[0].startswith("alternatives: no GPU:"), proc.stderr


@pytest.mark.parametrize("args,names", [(["--oversub", "1"], "--oversub"), (["--oversub", "x"], "--oversub"),
                                        (["--methods", "plain,zero3"], "--methods"),
                                        (["--budget", "lots"], "--budget")])
def test_bad_arguments_are_one_line(tmp_path, args, names):
    proc = _run([str(GPU / "alternatives.py"), "--dry-run", "--out", str(tmp_path), *args], timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and names in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_worker_refuses_a_memory_cap_without_cuda_and_stops_at_its_time_limit(tmp_path):
    out = tmp_path / "w.json"
    bad = _run([str(GPU / "train_worker.py"), "--device", "cpu", "--memory-cap", "1e9", "--out", str(out)])
    assert bad.returncode != 0 and "--memory-cap" in bad.stderr and "Traceback" not in bad.stderr
    ok = _run([str(GPU / "train_worker.py"), "--config", "tiny", "--batch", "2", "--seq", "32", "--iters", "5",
               "--device", "cpu", "--max-seconds", "0", "--out", str(out)], timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    res = json.loads(out.read_text())
    assert len(res["iter_s"]) == 1 and res["stopped_early"] is True and res["oom"] is None


@pytest.mark.slow
def test_dry_run_trains_every_method_to_a_table_plot_and_baseline(tmp_path):
    base = tmp_path / "gpu.json"
    proc = _run([str(GPU / "alternatives.py"), "--dry-run", "--out", str(tmp_path), "--baseline", str(base),
                 "--timeout", "500", "--deadline", "1000"])
    res = json.loads((tmp_path / "alternatives.json").read_text())
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "alternatives: PASS", proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0 and res["env"]["dry_run"] is True
    # every method is a row of the table: the reference, then each method at the (uncapped) dry-run setting
    table = res["table"]["rows"]
    assert [r[0] for r in table] == ["plain", *A.METHODS]
    assert all(f"| {m} |" in proc.stdout for m in A.METHODS)
    runs = {(r["method"], r["oversub"]): r for r in res["rows"]}
    assert runs[("deepspeed-offload", "1.5")]["skipped"]  # no deepspeed here: skipped with its reason
    for m in A.METHODS:
        if m == "deepspeed-offload":
            continue
        run = runs[(m, "1.5")]["run"]
        assert run["returncode"] == 0 and len(run["losses"]) == 3, m
        # CPU kernels are deterministic and every optimizer is on the CPU: every method is bit-equal to plain
        assert run["losses_hex"] == res["rows"][0]["run"]["losses_hex"], m
    assert runs[("uvmprefetch", "1.5")]["run"]["runtime_active"] is True
    assert runs[("fsdp-offload", "1.5")]["run"]["method"]["fsdp_offload"] is True
    png = Path(res["plot"])
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cases = {c["name"]: c for c in json.loads(base.read_text())["cpu (dry-run)"]["cases"]}
    expected = {"alt/plain/fits"} | {f"alt/{m}/1.5" for m in A.METHODS if m != "deepspeed-offload"}
    assert set(cases) == expected
    assert all(c["losses_bit_equal_plain"] is True and c["s_per_iter_median"] > 0 for c in cases.values())
    assert cases["alt/uvmprefetch/1.5"]["policy"] == "uvmprefetch" and cases["alt/checkpoint/1.5"]["code_change"]
