"""GIVEN the GPU baseline file that ``bench/gpu/evict_microbench.py --dry-run`` writes over its fake CUDA driver WHEN
``bench/copy_model.py`` reads it THEN the simulator's copy-path fields are the fake's known costs, the flags it
prints replay as given, and bad input is one line."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from uvmprefetch.cli import main
from uvmprefetch.sim.copypath import from_microbench
from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace import save

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
from _evict_fake import TRUTH  # noqa: E402


def _run(args, timeout=600.0):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def dry_baseline(tmp_path_factory):
    d = tmp_path_factory.mktemp("mb")
    proc = _run(["bench/gpu/evict_microbench.py", "--dry-run", "--quiet", "--out", str(d), "--baseline",
                 str(d / "gpu.json")])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return d / "gpu.json"


def test_the_fields_are_the_fakes_costs(dry_baseline, tmp_path, capsys):
    proc = _run(["bench/copy_model.py", "--baseline", str(dry_baseline), "--json"])
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    g, h = r["gpu"], r["host"]
    assert r["missing"] == [] and r["device"] == "cpu (dry-run)"
    # bandwidths at the largest size the dry run measured (64 MiB: the call's latency still shows, a few %)
    assert g["copy_dtoh_bw"] == pytest.approx(TRUTH["copy_d2h_bw"], rel=0.05)
    assert g["copy_htod_bw"] == pytest.approx(TRUTH["copy_h2d_bw"], rel=0.05)
    assert g["copy_call_s"] == pytest.approx(TRUTH["copy_latency_s"], rel=0.5)
    assert g["discard_call_s"] == pytest.approx(TRUTH["discard_call_s"], rel=0.25)
    assert g["discard_block_s"] == pytest.approx(TRUTH["discard_block_s"], rel=0.25)
    # repopulate by a prefetch to the GPU (cheaper than the batch call at 64 MiB in the fake): its per-call cost
    assert g["repopulate_call_s"] == pytest.approx(TRUTH["prefetch_call_s"], rel=0.25)
    assert g["repopulate_block_s"] == pytest.approx(TRUTH["repopulate_block_s"], rel=0.5)
    assert g["remote_access_bw"] == pytest.approx(TRUTH["remote_read_bw"], rel=0.05)
    assert g["remote_write_bw"] == pytest.approx(TRUTH["remote_write_bw"], rel=0.05)
    # the fake's discard holds its caller (as a driver's may): it waits for the copy queued before it
    assert h["discard_waits_for_copy"] is True and h["copy_discard_block_s"] > 0
    # the printed flags are the replay's own
    t = tmp_path / "t.uvmt"
    save(training_trace(layers=4, param_bytes=4 << 20, act_bytes=4 << 20), t)
    argv = ["replay", str(t), "--oversub", "2", "--policy", "oracle", "--json"] + shlex.split(r["flags"])
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["copy_path"] is True and res["host"]["discard_waits_for_copy"] is True
    assert res["copy_out_bytes"] > 0


def test_a_field_not_measured_is_left_out():
    r = from_microbench({"evict/discard": {"ranges": {"per_call_us": 25.0, "per_block_us": None},
                                           "behind_copy": {"waits_for_copy": None}},
                         "evict/remote": {"stayed_remote": False, "read": {"gb_s": 30.0}}})
    assert r["gpu"] == {"discard_call_s": pytest.approx(25e-6)} and r["host"] == {}
    assert "copy_dtoh_bw" in r["missing"] and "remote_access_bw" in r["missing"]
    assert "host discard_waits_for_copy" in r["missing"]


def test_bad_input_is_one_line(tmp_path):
    p = tmp_path / "gpu.json"
    for text, msg in (("{", "not JSON"), (json.dumps({"H100": {"microbench": {}}}), "no device has evict/"),
                      (json.dumps({a: {"microbench": {"evict/summary": {}}} for a in ("A", "B")}), "several devices")):
        p.write_text(text)
        proc = _run(["bench/copy_model.py", "--baseline", str(p)])
        assert proc.returncode == 2 and msg in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = _run(["bench/copy_model.py", "--baseline", str(p), "--device", "C"])
    assert proc.returncode == 2 and "--device 'C'" in proc.stderr
