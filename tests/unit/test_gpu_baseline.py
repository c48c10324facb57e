"""``bench/gpu/baseline.py``: the GPU baseline file's schema and merge rules.

GIVEN two scripts of one GPU session writing their cases for the same device, and a second device,
WHEN each calls ``update``,
THEN every case carries every schema field (null where not measured), a case replaces only the case of the
same name, microbenchmarks merge by key, other devices are untouched, and bad input is refused by name.
"""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import baseline  # noqa: E402

ENV = {"date_utc": "2026-11-27T12:00:00Z", "commit": "abc1234", "driver": "580.1", "torch": "2.11.0+cu130"}


def test_cases_merge_by_name_and_unmeasured_fields_are_null(tmp_path):
    p = tmp_path / "gpu.json"
    baseline.update(p, "NVIDIA H200", ENV, cases=[baseline.case("overhead/gpt2-medium", s_per_iter_median=0.1)])
    baseline.update(p, "NVIDIA H200", {**ENV, "commit": "def5678"},
                    cases=[{"name": "alt/checkpoint/1.5", "model": "gpt2-large", "s_per_iter_median": 0.4}],
                    microbench={"d2h_copy": {"gbps_2mib": 20.0}})
    baseline.update(p, "NVIDIA H200", ENV, cases=[baseline.case("overhead/gpt2-medium", s_per_iter_median=0.2)],
                    microbench={"discard": {"us_per_call": 5.0}})
    baseline.update(p, "NVIDIA H100 80GB HBM3", ENV, cases=[baseline.case("x")])
    data = json.loads(p.read_text())
    h200 = data["NVIDIA H200"]
    assert [c["name"] for c in h200["cases"]] == ["alt/checkpoint/1.5", "overhead/gpt2-medium"]
    over = h200["cases"][1]
    assert over["s_per_iter_median"] == 0.2
    assert set(baseline.CASE_FIELDS) <= set(over) and over["plain_s_per_iter"] is None
    assert h200["microbench"] == {"d2h_copy": {"gbps_2mib": 20.0}, "discard": {"us_per_call": 5.0}}
    assert h200["commit"] == "abc1234"
    assert [c["name"] for c in data["NVIDIA H100 80GB HBM3"]["cases"]] == ["x"]


def test_bad_input_is_refused_by_name(tmp_path):
    with pytest.raises(baseline.BaselineError, match="s_per_iter_median"):
        baseline.case("a", s_per_iter_median=math.nan)
    with pytest.raises(baseline.BaselineError, match="non-empty name"):
        baseline.case("")
    bad = tmp_path / "gpu.json"
    bad.write_text("{not json")
    with pytest.raises(baseline.BaselineError, match="not valid JSON"):
        baseline.update(bad, "dev", ENV)
    bad.write_text(json.dumps({"dev": {"cases": [{"model": "m"}]}}))
    with pytest.raises(baseline.BaselineError, match="without a name"):
        baseline.load(bad)


def test_dry_runs_never_write_the_committed_file():
    assert baseline.path_for(dry_run=True) != baseline.BASELINE
    assert baseline.path_for(dry_run=False) == baseline.BASELINE
