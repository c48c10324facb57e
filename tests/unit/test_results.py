"""Where results go (``uvmprefetch/results.py``): GIVEN a benchmark run WHEN no ``--out`` is given THEN it writes to a
fresh folder under the current directory and prints it; WHEN ``--update-baseline`` is given THEN its figures land in
``bench/baselines/<benchmark>.json`` under the run's setting and other settings stay; bad files are one clear error.
Also checks that the committed baseline files are what the README and docs read."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from uvmprefetch import results
from uvmprefetch.cli import main
from uvmprefetch.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SMALL = str(REPO / "traces" / "gpt2-small-b2s128.uvmt")


def test_run_dir_defaults_to_a_fresh_folder_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = results.run_dir(None, "replay")
    assert d.parent == tmp_path and d.name.startswith("replay-") and d.is_dir()
    assert results.run_dir(tmp_path / "x" / "y", "replay") == tmp_path / "x" / "y"


def test_run_dir_that_cannot_be_created_names_it(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="--out .*file/sub: cannot create"):
        results.run_dir(tmp_path / "file" / "sub", "replay")


def test_update_baseline_replaces_one_setting_and_keeps_the_others(tmp_path):
    p = results.update_baseline("demo", "a", {"x": 1}, root=tmp_path)
    results.update_baseline("demo", "b", {"x": 2}, root=tmp_path)
    results.update_baseline("demo", "a", {"x": 3}, root=tmp_path)
    assert json.loads(p.read_text()) == {"a": {"x": 3}, "b": {"x": 2}}
    assert not list(tmp_path.glob(".demo-*"))  # the temporary file of the atomic write is gone


def test_bad_baseline_file_and_empty_setting_are_named(tmp_path):
    (tmp_path / "demo.json").write_text("[1, 2")
    with pytest.raises(ConfigError, match="demo.json: not valid JSON"):
        results.update_baseline("demo", "a", {}, root=tmp_path)
    (tmp_path / "demo.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object of settings"):
        results.read_object(tmp_path / "demo.json")
    with pytest.raises(ConfigError, match="empty setting"):
        results.update_baseline("demo", "", {}, root=tmp_path)


def test_bench_without_out_writes_a_run_folder_in_the_current_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", SMALL, "--policies", "demand", "--oversub", "1.5", "--no-progress"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    (run,) = tmp_path.glob("replay-*")
    assert last == f"results: {run}" and (run / "results.json").is_file() and (run / "table.md").is_file()


def test_bench_update_baseline_writes_the_settings_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(results, "BASELINES", tmp_path / "baselines")
    out = tmp_path / "run"
    for extra in ([], ["--no-discard", "--host", "live-sync"]):
        assert main(["bench", SMALL, "--policies", "demand,oracle", "--oversub", "1.5,2", "--out", str(out),
                     "--no-progress", "--update-baseline", *extra]) == 0
    assert "baseline: " in capsys.readouterr().out
    data = json.loads((tmp_path / "baselines" / "replay.json").read_text())
    assert set(data) == {"h100-pcie host=live evict=auto traces=gpt2-small-b2s128",
                         "h100-pcie no-discard host=live-sync evict=auto traces=gpt2-small-b2s128"}
    base = data["h100-pcie host=live evict=auto traces=gpt2-small-b2s128"]
    rows = json.loads((out / "results.json").read_text())["results"]  # the second run's: the no-discard one
    assert base["meta"]["discards"] is True and len(base["rows"]) == 4 and base["traces"] == ["gpt2-small-b2s128"]
    # one trace: the geomean is that trace's slowdown, rounded; at 2x the trace's widest launch does not fit, so
    # that level is an error row and has no geomean
    demand = {r["oversub"]: r for r in base["rows"] if r["policy"] == "demand"}
    assert demand[1.5]["slowdown"] > 1 and demand[1.5]["error"] is None
    assert base["geomean"]["demand"]["slowdown"]["1.5"] == pytest.approx(demand[1.5]["slowdown"], rel=1e-4)
    assert demand[2]["slowdown"] is None and "below the largest launch" in demand[2]["error"]
    assert base["geomean"]["demand"]["slowdown"]["2"] is None
    assert base["meta"]["host_name"] == "live" and base["meta"]["host"]["planner"] is True
    nodisc = data["h100-pcie no-discard host=live-sync evict=auto traces=gpt2-small-b2s128"]
    r = next(x for x in rows if x["policy"] == "oracle" and x["oversub_target"] == 1.5)
    got = next(x for x in nodisc["rows"] if x["policy"] == "oracle" and x["oversub"] == 1.5)
    assert got["time_s"] == pytest.approx(r["time_s"], rel=1e-5) and nodisc["meta"]["host"] is not None


def test_a_benchmark_script_writes_to_its_run_folder(tmp_path):
    """``bench/iteration_marks.py`` on the shipped trace, run from a scratch directory: no --out, so its JSON
    lands in ``./iteration_marks-<stamp>/``, printed last; nothing is written under ``bench/``."""
    before = set((REPO / "bench").rglob("*"))
    p = subprocess.run([sys.executable, str(REPO / "bench" / "iteration_marks.py"), "--traces", SMALL,
                        "--oversub", "1.5"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    (run,) = tmp_path.glob("iteration_marks-*")
    assert p.stdout.strip().splitlines()[-1] == f"results: {run}"
    (js,) = run.glob("iteration-marks-*.json")
    assert json.loads(js.read_text())["rows"][0]["name"] == "gpt2-small-b2s128"
    assert set((REPO / "bench").rglob("*")) == before


def test_committed_baselines_hold_the_quoted_settings():
    """The settings the README and the docs quote exist, with finite figures, and every GPU case follows the
    schema of ``bench/gpu/baseline.py`` (a field not measured is null, never missing)."""
    base = REPO / "bench" / "baselines"
    replay = results.read_object(base / "replay.json")
    for key in ("h100-pcie host=live evict=auto", "h100-pcie no-discard host=live", "h100-pcie-lit host=free"):
        geo = replay[key]["geomean"]
        assert {"demand", "uvmprefetch", "oracle", "deepum"} <= set(geo)
        assert all(math.isfinite(v) and v >= 1 - 1e-9 for v in geo["uvmprefetch"]["slowdown"].values() if v)
    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    import baseline as B
    gpu = B.load(base / "gpu.json")
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} <= set(gpu)
    for dev, entry in gpu.items():
        assert all(entry[k] for k in B.ENTRY_FIELDS)
        for c in entry["cases"]:
            assert set(B.CASE_FIELDS) <= set(c), (dev, c["name"])
            # every case says how the simulator predicts it (bench/gpu/fidelity.py --cases), or why it cannot
            f = c.get("fidelity")
            assert f and (f.get("why") if not f["replayed"] else math.isfinite(f["error"])), (dev, c["name"])
    for name in ("policy_cost", "decision_budget", "ablation", "observe_overhead", "iteration_marks"):
        assert results.read_object(base / f"{name}.json"), name
