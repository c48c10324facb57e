"""``uvmprefetch bench``: GIVEN two small saved traces WHEN benchmarked THEN every trace x policy x level
has a row, the files are written, ``--json`` is one list with a ``trace`` field, and bad input is one line."""

import csv
import json

import pytest

from uvmprefetch.cli import main
from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace import save


@pytest.fixture(scope="module")
def two_traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("bt")
    a, b = d / "small.uvmt", d / "deep.uvmt"
    save(training_trace(layers=3, param_bytes=4 << 20, act_bytes=2 << 20), a)
    save(training_trace(layers=6, param_bytes=2 << 20, act_bytes=2 << 20), b)
    return [str(a), str(b)]


def test_bench_json_and_files(two_traces, tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["bench", *two_traces, "--policies", "ideal,demand,oracle", "--oversub", "1,2", "--out", str(out),
               "--json", "--no-progress"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) == 2 * 3 * 2
    assert {r["trace"] for r in rows} == {"small", "deep"}
    for r in rows:
        assert r["slowdown"] >= 1 - 1e-12 and "events_per_s" in r
    by = {(r["trace"], r["policy"], r["oversub_target"]): r for r in rows}
    for t in ("small", "deep"):
        assert by[(t, "oracle", 2.0)]["time_s"] <= by[(t, "demand", 2.0)]["time_s"]
        assert by[(t, "ideal", 2.0)]["slowdown"] == pytest.approx(1, rel=1e-12)
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 12
    assert (out / "slowdown.png").read_bytes()[:4] == b"\x89PNG" and (out / "steady.png").read_bytes()[:4] == b"\x89PNG"
    assert "| small | demand |" in (out / "table.md").read_text()


def test_bench_table_on_stdout(two_traces, tmp_path, capsys):
    assert main(["bench", two_traces[0], "--policies", "demand", "--oversub", "1.5", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| trace | policy | 1.5x |" in out and "launches/s" in out


@pytest.mark.parametrize("args, msg", [
    (["--oversub", "1,x"], "--oversub"),
    (["--policies", "demand,nosuch"], "unknown policy"),
    (["--gpu", "nosuch"], "unknown GPU profile"),
])
def test_bench_bad_input(two_traces, tmp_path, capsys, args, msg):
    rc = main(["bench", two_traces[0], "--out", str(tmp_path), "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_too_small_capacity_is_a_row_not_a_crash(two_traces, tmp_path, capsys):
    assert main(["bench", two_traces[0], "--policies", "demand", "--oversub", "1000", "--out", str(tmp_path),
                 "--json", "--no-progress"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert "largest launch" in row["error"]


def test_a_policy_spec_with_several_parameters_stays_one_spec(two_traces, tmp_path, capsys):
    # GIVEN --policies with a spec of two parameters between two plain names
    out = tmp_path / "res"
    rc = main(["bench", two_traces[0], "--policies", "demand,uvmprefetch:window=4,adaptive_window=false,oracle",
               "--oversub", "2", "--out", str(out), "--json", "--no-progress"])
    # THEN three policies ran, the spec with both its parameters (not 'adaptive_window=false' as a policy)
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows].count("demand") == 1 and len(rows) == 3
    spec = [r["policy"] for r in rows if r["policy"].startswith("uvmprefetch")]
    assert len(spec) == 1 and "window=4" in spec[0] and "adaptive_window=false" in spec[0]
