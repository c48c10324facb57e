"""GIVEN ``bench/gpu/discards.py`` WHEN run on this CPU machine THEN ``--help`` works, a missing GPU and bad
arguments are one line and a non-zero exit, and ``--dry-run`` trains the tiny GPT-2 under the runtime's dryrun
backend with discards on and off at each ratio, checks that the discard runs discarded and that their losses
are bit-equal to the runs without, prints the table last, and writes its cases to the dry-run baseline file
(never the committed one)."""

from __future__ import annotations

import json

import pytest

from test_gpu_scripts import GPU, SCRIPT_LIMITS, _result, _run


def test_help_and_refusals(tmp_path):
    proc = _run([str(GPU / "discards.py"), "--help"], timeout=60)
    assert proc.returncode == 0 and "usage:" in proc.stdout and "backend_result.liveness" in proc.stdout
    proc = _run([str(GPU / "discards.py")], timeout=120)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 5 and len(err) == 1 and err[0].startswith("discards: no GPU:"), proc.stderr
    for bad, word in ((["--ratios", "1,2"], "--ratios"), (["--iters", "2", "--warmup", "2"], "--iters"),
                      (["--working-set", "-5"], "--working-set"), (["--discard-batch", "0"], "--discard-batch")):
        proc = _run([str(GPU / "discards.py"), "--dry-run", *bad, "--out", str(tmp_path)], timeout=120)
        assert proc.returncode == 2 and word in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_dry_run_compares_discards_on_and_off(tmp_path):
    proc = _run([str(GPU / "discards.py"), "--dry-run", "--ratios", "1.5", "--out", str(tmp_path), *SCRIPT_LIMITS])
    res = _result(tmp_path, "discards", proc)
    assert res["passed"], proc.stdout[-3000:]
    runs = res["runs"]
    assert [(r["ratio"], r["discard"]) for r in runs] == [(1.5, True), (1.5, False)]
    assert all(r["runtime_active"] and r["budget"] == int(res["working_set_bytes"] / 1.5) for r in runs)
    on, off = runs
    assert on["report"]["backend_result"]["discards"] > 0 and off["report"]["backend_result"]["discards"] == 0
    names = {c["name"]: c for c in res["checks"]}
    assert names["1.5x losses, discards on vs off"]["ok"] is True
    assert names["1.5x-discard-on discarded"]["ok"] is True
    base = json.loads(open(res["baseline_file"]).read())
    assert "out/gpu-dryrun" in res["baseline_file"].replace("\\", "/")
    cases = {c["name"]: c for c in base["cpu (dry-run)"]["cases"]}
    for state in ("on", "off"):
        c = cases[f"discards/gpt2-mini/1.5/{state}"]
        assert c["discards"] is (state == "on") and c["losses_finite"] is True and c["dtoh_gib_per_iter"] is not None
    assert cases["discards/gpt2-mini/1.5/on"]["losses_bit_equal_discard_off"] is True
    # (gate closures are the cuda backend's: the dryrun backend has no gate, so the field is there and null)
    assert cases["discards/gpt2-mini/1.5/on"]["gate_closures_per_iter"] is None
