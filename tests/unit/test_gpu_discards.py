"""GIVEN ``bench/gpu/discards.py`` WHEN run on this CPU machine THEN ``--dry-run`` trains the tiny GPT-2 under the
runtime's dryrun backend with discards on and off at each ratio, checks that the discard runs discarded and that
their losses are bit-equal to the runs without, prints the table last, and writes its cases to the dry-run baseline
file (never the committed one). ``--help`` and bad arguments: test_gpu_scripts.py."""

from __future__ import annotations

import pytest

from test_gpu_scripts import GPU, _dry_run, _dry_run_cases, _run


def test_a_bad_discard_batch_is_one_line(tmp_path):
    proc = _run([str(GPU / "discards.py"), "--dry-run", "--discard-batch", "0", "--out", str(tmp_path)], timeout=120)
    assert proc.returncode == 2 and "--discard-batch" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_dry_run_compares_discards_on_and_off(tmp_path):
    res = _dry_run(tmp_path, "discards", "--ratios", "1.5")
    runs = res["runs"]
    assert [(r["ratio"], r["discard"]) for r in runs] == [(1.5, True), (1.5, False)]
    assert all(r["runtime_active"] and r["budget"] == int(res["working_set_bytes"] / 1.5) for r in runs)
    on, off = runs
    assert on["report"]["backend_result"]["discards"] > 0 and off["report"]["backend_result"]["discards"] == 0
    names = {c["name"]: c for c in res["checks"]}
    assert names["1.5x losses, discards on vs off"]["ok"] is True
    assert names["1.5x-discard-on discarded"]["ok"] is True
    cases = _dry_run_cases(res)
    for state in ("on", "off"):
        c = cases[f"discards/gpt2-mini/1.5/{state}"]
        assert c["discards"] is (state == "on") and c["losses_finite"] is True and c["dtoh_gib_per_iter"] is not None
    assert cases["discards/gpt2-mini/1.5/on"]["losses_bit_equal_discard_off"] is True
    # (gate closures are the cuda backend's: the dryrun backend has no gate, so the field is there and null)
    assert cases["discards/gpt2-mini/1.5/on"]["gate_closures_per_iter"] is None
