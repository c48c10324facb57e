"""GIVEN ``bench/gpu/copypath.py`` WHEN run on this CPU machine THEN ``--dry-run`` trains the tiny GPT-2 under the
runtime's dryrun backend with the copy path (``UVMPREFETCH_EVICT=auto``, a calibrated profile) and with UVM's
eviction only, checks that the first evicted by copy and that its losses are bit-equal to the second, prints the
table last, and writes its cases to the dry-run baseline file (never the committed one). ``--help`` and bad
arguments: test_gpu_scripts.py."""

from __future__ import annotations

import pytest

from test_gpu_scripts import _dry_run, _dry_run_cases


@pytest.mark.slow
def test_dry_run_compares_the_copy_path_with_uvm_eviction(tmp_path):
    res = _dry_run(tmp_path, "copypath", "--ratios", "1.5")
    runs = res["runs"]
    assert [(r["ratio"], r["evict"]) for r in runs] == [(1.5, "auto"), (1.5, "uvm")]
    auto, uvm = (r["report"]["backend_result"] for r in runs)
    assert auto["evict"] == "auto" and auto["copy_evictions"] > 0 and uvm["evict"] == "uvm"
    names = {c["name"]: c for c in res["checks"]}
    assert names["1.5x losses, copy path vs UVM only"]["ok"] is True
    assert names["1.5x-evict-auto evicted by copy"]["ok"] is True
    cases = _dry_run_cases(res)
    assert cases["copypath/gpt2-mini/1.5/auto"]["losses_bit_equal_uvm"] is True
    assert cases["copypath/gpt2-mini/1.5/auto"]["copy_evictions"] > 0
    assert cases["copypath/gpt2-mini/1.5/uvm"]["copy_path_on"] is False
