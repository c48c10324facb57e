"""``uvmprefetch replay``: GIVEN a saved synthetic trace WHEN replayed from the CLI THEN the JSON result has
`docs/design.md` §4's fields, the timeline files are written, and bad input is one clear error line."""

import json

import pytest

from uvmprefetch.cli import main
from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace import save

FIELDS = ("policy", "gpu", "capacity_bytes", "oversub", "time_s", "ideal_s", "slowdown", "stall_s", "faults",
          "bytes_htod", "bytes_dtoh", "prefetch_issued_bytes", "prefetch_useful_bytes", "accuracy", "coverage",
          "events_per_s", "block_accesses_per_s", "iteration_times_s", "cold_first_touch_s", "policy_report")


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("t") / "syn.uvmt"
    save(training_trace(layers=4, param_bytes=4 << 20, act_bytes=4 << 20), p)
    return p


def test_json_result_has_the_contract_fields(trace_path, capsys):
    assert main(["replay", str(trace_path), "--oversub", "2", "--policy", "demand", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for f in FIELDS:
        assert f in r, f
    assert r["policy"] == "demand" and r["gpu"] == "h100-pcie"
    assert r["oversub"] == pytest.approx(2.0, rel=0.05)
    assert r["slowdown"] > 1 and r["faults"] > 0 and len(r["iteration_times_s"]) == 2


def test_capacity_and_human_output(trace_path, capsys):
    assert main(["replay", str(trace_path), "--capacity", "40MiB", "--policy", "oracle"]) == 0
    out = capsys.readouterr().out
    assert "slowdown" in out and "oracle" in out


def test_perfetto_and_plot(trace_path, tmp_path, capsys):
    pj, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["replay", str(trace_path), "--oversub", "1.5", "--policy", "demand", "--perfetto", str(pj),
                 "--plot", str(png), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert "timeline" not in r
    ev = json.loads(pj.read_text())["traceEvents"]
    assert {e["ph"] for e in ev} >= {"M", "X", "C", "i"}
    assert sum(1 for e in ev if e["ph"] == "X" and e["pid"] == 1 and e.get("tid") == 1) == r["n_launches"]
    # per-block residency: intervals of one block never overlap, and every faulted block appears
    per_block: dict = {}
    for e in ev:
        if e["ph"] == "X" and e["pid"] == 2:
            per_block.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    assert sum(len(v) for v in per_block.values()) >= r["faults"]
    for spans in per_block.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, msg", [
    (["--oversub", "0"], "--oversub"),
    (["--oversub", "1000"], "largest launch"),
    (["--capacity", "lots"], "--capacity"),
    (["--oversub", "2", "--policy", "nosuch"], "unknown policy"),
    (["--oversub", "2", "--gpu", "tpu"], "unknown GPU profile"),
    (["--oversub", "2", "--block-size", "3MiB"], "block size"),
    (["--oversub", "2", "--gpu-set", "warp=3"], "unknown gpu profile field"),
    (["--oversub", "2", "--gpus", "2", "--no-discard"], "--no-discard"),
])
def test_bad_input_is_one_line(trace_path, capsys, args, msg):
    rc = main(["replay", str(trace_path), "--policy", "demand", *args] if "--policy" not in args
              else ["replay", str(trace_path), *args])
    err = capsys.readouterr().err
    assert rc != 0 and msg in err and len(err.strip().splitlines()) == 1


def test_no_discard_flag_reaches_the_result(trace_path, capsys):
    """``--no-discard``: a policy's discards are evictions (``refused_discards``), nothing is dropped dead; the
    ``uvmprefetch`` policy, told so, takes no frees as deaths and discards nothing. The only blocks zero-filled are
    fresh ones on their first touch (memory nothing had used: the driver maps it without data either way)."""
    from uvmprefetch.sim.layout import build_layout
    from uvmprefetch.trace import load
    t = load(trace_path)
    lay = build_layout(t)
    fresh = int((lay.fresh & (lay.first_use() < t.n_launches)).sum())
    args = ["replay", str(trace_path), "--oversub", "2", "--policy", "uvmprefetch:invalidate_without_discard=true", "--json"]
    assert main(args) == 0
    on = json.loads(capsys.readouterr().out)
    assert main([*args, "--no-discard"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert on["discards"] > 0 and on["refused_discards"] == 0
    assert off["discards"] == 0 and off["refused_discards"] > 0 and off["zero_fill_blocks"] <= fresh
    args[5] = "uvmprefetch"
    assert main([*args, "--no-discard"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["discards"] == 0 and default["refused_discards"] == 0 and default["zero_fill_blocks"] <= fresh
    assert main([*args, "--no-discard", "--gpu", "h100-pcie-lit"]) == 0  # (no fresh memory there)
    assert json.loads(capsys.readouterr().out)["zero_fill_blocks"] == 0


def test_missing_trace(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "none.uvmt"), "--oversub", "2", "--policy", "demand"]) == 3
    assert "no such trace" in capsys.readouterr().err


def test_durations_are_re_estimated_for_another_gpu():
    """A trace estimated for h100-pcie replayed on a100-pcie uses the roofline durations for the A100;
    measured durations are kept as recorded."""
    roofline = pytest.importorskip("uvmprefetch.trace.roofline")
    import numpy as np

    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace import READ, TraceBuilder
    b = TraceBuilder(meta={"gpu": "h100-pcie", "durations": "estimated"})
    x = b.alloc(64 << 20)
    b.launch("gemm", [(x, 0, 64 << 20, READ)], duration=1e-3, flops=5e12)
    t = b.build()
    r = replay(t, "ideal", "a100-pcie", oversub=1.0)
    assert r["ideal_s"] == pytest.approx(float(np.sum(roofline.durations_for(t, "a100-pcie"))))
    assert r["ideal_s"] != pytest.approx(1e-3)
    t.meta["durations"] = "measured"
    assert replay(t, "ideal", "a100-pcie", oversub=1.0)["ideal_s"] == pytest.approx(1e-3)


@pytest.mark.parametrize("flag, want", [([], "caching"), (["--allocator", "auto"], "caching"),
                                        (["--allocator", "caching"], "caching"),
                                        (["--allocator", "first-fit"], "first-fit")])
def test_allocator_flag_reaches_the_result(trace_path, capsys, flag, want):
    """A synthetic trace is not a live dryrun one, so auto is the caching model; the flag overrides it."""
    assert main(["replay", str(trace_path), "--oversub", "2", "--policy", "demand", "--json", *flag]) == 0
    assert json.loads(capsys.readouterr().out)["allocator"] == want


def test_allocator_changes_the_placement(tmp_path, capsys):
    from uvmprefetch.trace import READ, TraceBuilder
    b = TraceBuilder({"gpu": "h100-pcie"})
    xs = [b.alloc((1 << 20) + 512) for _ in range(5)]
    b.launch("k", [(x, 0, (1 << 20) + 512, READ) for x in xs], duration=1e-4, flops=1e6)
    path = tmp_path / "five.uvmt"
    save(b.build(), path)
    fp = {}
    for a in ("caching", "first-fit"):
        assert main(["replay", str(path), "--capacity", "64MiB", "--policy", "demand", "--json",
                     "--allocator", a]) == 0
        fp[a] = json.loads(capsys.readouterr().out)["footprint_bytes"]
    # caching: each large request rounded to its own 2 MiB (5 blocks); first-fit packs them at 512 B (3 blocks)
    assert fp == {"caching": 5 << 21, "first-fit": 3 << 21}


def test_bad_allocator_is_one_line(trace_path, capsys):
    rc = main(["replay", str(trace_path), "--oversub", "2", "--policy", "demand", "--allocator", "best-fit"])
    err = capsys.readouterr().err
    assert rc != 0 and "--allocator 'best-fit'" in err and len(err.strip().splitlines()) == 1


def test_per_iteration_traffic_adds_up_to_the_totals(trace_path, capsys):
    # GIVEN a trace whose launches all belong to an iteration, replayed under memory pressure
    assert main(["replay", str(trace_path), "--oversub", "2", "--policy", "uvmprefetch", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    # THEN each per-iteration counter has one entry per iteration, and they add up to the run's total
    for f in ("bytes_htod", "bytes_dtoh", "stall_s", "faults"):
        per = r["iteration_" + f]
        assert len(per) == len(r["iteration_times_s"]) == 2, f
        assert sum(per) == pytest.approx(r[f], rel=1e-12, abs=1e-12), f
        assert min(per) >= 0, f
    assert r["bytes_htod"] > 0 and r["iteration_bytes_htod"][0] > 0
    # AND the human output prints them under the iteration times
    assert main(["replay", str(trace_path), "--oversub", "2", "--policy", "uvmprefetch"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = next(k for k, line in enumerate(out) if line.startswith("iterations "))
    assert out[i + 1].startswith(" H2D") and out[i + 1].endswith("GiB") and len(out[i + 1].split()) == 4
    assert out[i + 2].startswith(" D2H") and out[i + 3].startswith(" stall") and out[i + 4].startswith(" faults")
