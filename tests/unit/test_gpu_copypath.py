"""GIVEN ``bench/gpu/copypath.py`` WHEN run on this CPU machine THEN ``--help`` works, a missing GPU and bad arguments
are one line and a non-zero exit, and ``--dry-run`` trains the tiny GPT-2 under the runtime's dryrun backend with the
copy path (``UVMPREFETCH_EVICT=auto``, a calibrated profile) and with UVM's eviction only, checks that the first
evicted by copy and that its losses are bit-equal to the second, prints the table last, and writes its cases to the
dry-run baseline file (never the committed one)."""

from __future__ import annotations

import json

import pytest

from test_gpu_scripts import GPU, SCRIPT_LIMITS, _result, _run


def test_help_and_refusals(tmp_path):
    proc = _run([str(GPU / "copypath.py"), "--help"], timeout=60)
    assert proc.returncode == 0 and "usage:" in proc.stdout and "backend_result.copy_path" in proc.stdout
    proc = _run([str(GPU / "copypath.py")], timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 5 and len(err) == 1 and err[0].startswith("copypath: no GPU:"), proc.stderr
    for bad, word in ((["--ratios", "1,2"], "--ratios"), (["--iters", "2", "--warmup", "2"], "--iters"),
                      (["--working-set", "-5"], "--working-set")):
        proc = _run([str(GPU / "copypath.py"), "--dry-run", *bad, "--out", str(tmp_path)], timeout=120)
        assert proc.returncode == 2 and word in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_dry_run_compares_the_copy_path_with_uvm_eviction(tmp_path):
    proc = _run([str(GPU / "copypath.py"), "--dry-run", "--ratios", "1.5", "--out", str(tmp_path), *SCRIPT_LIMITS])
    res = _result(tmp_path, "copypath", proc)
    assert res["passed"], proc.stdout[-3000:]
    runs = res["runs"]
    assert [(r["ratio"], r["evict"]) for r in runs] == [(1.5, "auto"), (1.5, "uvm")]
    auto, uvm = (r["report"]["backend_result"] for r in runs)
    assert auto["evict"] == "auto" and auto["copy_evictions"] > 0 and uvm["evict"] == "uvm"
    names = {c["name"]: c for c in res["checks"]}
    assert names["1.5x losses, copy path vs UVM only"]["ok"] is True
    assert names["1.5x-evict-auto evicted by copy"]["ok"] is True
    base = json.loads(open(res["baseline_file"]).read())
    assert "out/gpu-dryrun" in res["baseline_file"].replace("\\", "/")
    cases = {c["name"]: c for c in base["cpu (dry-run)"]["cases"]}
    assert cases["copypath/gpt2-mini/1.5/auto"]["losses_bit_equal_uvm"] is True
    assert cases["copypath/gpt2-mini/1.5/auto"]["copy_evictions"] > 0
    assert cases["copypath/gpt2-mini/1.5/uvm"]["copy_path_on"] is False
