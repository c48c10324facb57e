"""GIVEN bench/gpu/replay_gpu.py (issue 38: a trace replayed on a GPU with touch kernels under the live runtime)
WHEN it runs on this CPU over the fake CUDA driver (bench/gpu/_replay_fake.py) THEN every launch touches exactly its
bytes, once, in trace order, the policy's moves reach the driver through the runtime's Mover, the figures and the
simulator's prediction land in the result and the baseline file, and bad input is one line.

Only the CUDA boundary is fake (cuda-python's calls, torch.cuda's streams and events, the driver probe); the
replay loop, the touch plan, the cuda backend with its policy, books and Mover are the real ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "bench" / "gpu"
SCRIPT = GPU / "replay_gpu.py"
sys.path.insert(0, str(GPU))

from _replay_core import CHUNK, READ, TABLE_DTYPE, WRITE, Run, replay_on_device, self_test, touch_plan  # noqa: E402
from _replay_fake import FakeDevice, check_log, installed  # noqa: E402
from _replay_runtime import make_runtime  # noqa: E402
from _scripts import run_script  # noqa: E402

from uvmprefetch.gpus import get_profile  # noqa: E402
from uvmprefetch.sim.layout import build_layout  # noqa: E402
from uvmprefetch.sim.replay import capacity_for, launch_durations  # noqa: E402
from uvmprefetch.trace.format import TraceBuilder, load  # noqa: E402
from uvmprefetch.trace.scale import scale_trace  # noqa: E402

TRACES = REPO / "traces"


def _run(*args: str, timeout: float = 1200.0) -> subprocess.CompletedProcess:
    return run_script(SCRIPT, *args, timeout=timeout)


def _plan_as_log(plan):
    """The chunks of a touch plan in the shape of ``FakeTouchKernels.log`` (one entry per launch)."""
    return [(plan.off[a:b].astype(np.int64), plan.length[a:b].astype(np.int64), plan.mode[a:b].astype(np.int64))
            for a, b in zip(plan.ptr[:-1], plan.ptr[1:])]


def test_touch_plan_golden():
    b = TraceBuilder()
    x, y = b.alloc(1 << 20), b.alloc(3 << 20)
    b.launch("overlap", [(x, 0, 100, READ), (x, 50, 100, WRITE)], duration=1e-6)
    b.launch("twice", [(x, 0, 64, READ), (x, 0, 64, READ), (x, 64, 64, READ)], duration=1e-6)
    b.launch("none", [], duration=1e-6)
    b.launch("big", [(y, 1, (3 << 20) - 1, READ | WRITE)], duration=1e-6)
    t = b.build()
    base = np.array([0, 4 << 20])
    plan = touch_plan(t, base)
    chunks = lambda i: list(zip(plan.off[plan.ptr[i]:plan.ptr[i + 1]].tolist(),  # noqa: E731
                                plan.length[plan.ptr[i]:plan.ptr[i + 1]].tolist(),
                                plan.mode[plan.ptr[i]:plan.ptr[i + 1]].tolist()))
    assert chunks(0) == [(0, 50, READ), (50, 50, READ | WRITE), (100, 50, WRITE)]
    assert chunks(1) == [(0, 128, READ)]  # the same range twice is touched once; neighbours merge
    assert chunks(2) == []
    big = chunks(3)
    assert [c[1] for c in big] == [CHUNK, CHUNK, CHUNK - 1] and big[0][0] == (4 << 20) + 1
    assert all(m == READ | WRITE for *_, m in big)
    assert plan.launch_bytes().tolist() == [150, 128, 0, (3 << 20) - 1]


@pytest.mark.parametrize("name", ["gpt2-small-b2s128", "resnet-50-b2i64"])
def test_touch_plan_matches_the_slow_reference(name):
    t = scale_trace(load(TRACES / f"{name}.uvmt"), 1 / 4)
    lay = build_layout(t)
    plan = touch_plan(t, lay.base)
    assert (plan.length >= 1).all() and (plan.length <= CHUNK).all()
    ok, what = check_log(_plan_as_log(plan), t, lay.base, 0)
    assert ok, what
    # and the reference itself sees a difference: one byte less in one launch
    log = _plan_as_log(plan)
    i = next(k for k, (_, ln, _) in enumerate(log) if ln.size)
    log[i] = (log[i][0], log[i][1] - np.eye(1, log[i][1].size, 0, dtype=np.int64)[0], log[i][2])
    assert not check_log(log, t, lay.base, 0)[0]


def test_self_test_passes_on_the_fake_and_catches_a_byte_visited_twice():
    dev = FakeDevice()
    ok, what = self_test(dev)
    assert ok, what
    twice = dev.kernels.touch_count

    def count_twice(*a):
        twice(*a)
        twice(*a)
    dev.kernels.touch_count = count_twice
    ok, what = self_test(dev)
    assert not ok and "visited 2 times" in what


def test_a_chunk_outside_its_allocation_is_an_illegal_address():
    dev = FakeDevice()
    buf = dev.cuda.device(4096)
    t = np.zeros(1, dtype=TABLE_DTYPE)
    t["addr"], t["len"], t["mode"] = buf + 4000, 200, WRITE
    with pytest.raises(RuntimeError, match="illegal address"):
        dev.kernels.touch(dev.upload(t), 0, 1, 0, 1)


def _fake_run(policy: str, oversub: float = 1.5, scale: float = 1 / 8, trace: str = "resnet-50-b2i64"):
    t = scale_trace(load(TRACES / f"{trace}.uvmt"), scale)
    lay = build_layout(t)
    prof = get_profile("h100-pcie-cal")
    dur = launch_durations(t, prof)
    run = Run(t, lay, touch_plan(t, lay.base), dur, np.maximum(dur - prof.launch_overhead_s, 0),
              capacity_for(lay, None, oversub), policy)
    dev = FakeDevice()
    meas = replay_on_device(dev, run, make_runtime, time.monotonic() + 600)
    return dev, run, meas


@pytest.mark.parametrize("policy", ["deepum", "uvmprefetch"])
def test_replay_touches_every_launch_once_in_order_and_moves_go_through_the_mover(policy):
    dev, run, meas = _fake_run(policy)
    assert not meas["cut"] and meas["launches"] == run.trace.n_launches
    ok, what = check_log(dev.kernels.log, run.trace, run.layout.base, meas["arena_base"])
    assert ok, what
    base, size = meas["arena_base"], run.arena_bytes
    calls = dev.rt.prefetches
    assert calls[0] == (base, size, False)  # the arena starts on the host
    moves = calls[1:]
    to_gpu = [n for p, n, g in moves if g]
    to_host = [n for p, n, g in moves if not g]
    assert all(base <= p and p + n <= base + size and p % (2 << 20) == 0 and n % (2 << 20) == 0 for p, n, _ in moves)
    # every byte the runtime's books say it prefetched or evicted went to the driver as a call, and nothing else;
    # except (uvmprefetch) blocks the policy prefetched before the runtime had numbered them: booked resident, but
    # with no address the Mover drops them, and later their evictions (3 blocks on this trace)
    phantom = meas["prefetch_issued_bytes"] - sum(to_gpu)
    assert to_gpu and to_host
    assert phantom == 0 if policy == "deepum" else 0 <= phantom <= 4 * (2 << 20)
    assert 0 <= meas["books_bytes_dtoh"] - sum(to_host) <= phantom
    assert (meas["budget_evictions"] + meas["policy_evictions"]) * (2 << 20) == meas["books_bytes_dtoh"]
    # the fake driver's own counts: what it migrated and faulted
    assert meas["bytes_dtoh"] > 0 and meas["faults"] > 0 and meas["measured_by"].startswith("the fake driver")
    assert len(meas["iteration_times_s"]) == run.trace.iterations and meas["time_s"] > meas["stall_s"] > 0


def test_demand_at_one_issues_no_moves():
    dev, run, meas = _fake_run("demand", oversub=1.0)
    assert dev.rt.prefetches[1:] == [] and meas["prefetch_issued_bytes"] == 0
    assert meas["budget_evictions"] == 0 and meas["bytes_dtoh"] == 0
    # every block came in by a fault, once: the footprint
    assert meas["faults"] == run.layout.footprint_blocks


def test_the_fake_boundary_is_restored():
    import torch

    import uvmprefetch.runtime.device as device
    before = (torch.cuda.Stream, torch.cuda.Event, torch.cuda.current_stream, device.require_cuda,
              sys.modules.get("cuda.bindings"))
    dev = FakeDevice()
    with installed(dev.rt):
        assert torch.cuda.Stream is not before[0] and torch.cuda.is_available()
        from cuda.bindings import runtime
        assert runtime is dev.rt
    assert (torch.cuda.Stream, torch.cuda.Event, torch.cuda.current_stream, device.require_cuda,
            sys.modules.get("cuda.bindings")) == before


def test_dry_run_writes_results_and_baseline(tmp_path):
    base = tmp_path / "gpu.json"
    proc = _run("--dry-run", "--quiet", "--out", str(tmp_path), "--baseline", str(base))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "replay_gpu: PASS" and any(ln.startswith("| check |") for ln in lines)
    res = json.loads((tmp_path / "replay_gpu.json").read_text())
    assert res["env"]["dry_run"] is True and res["device_kind"] == "fake" and "partial" not in res
    names = [c["name"] for c in res["cases"]]
    assert names == ["replay/gpt2-small-b2s128/demand/1.5", "replay/gpt2-small-b2s128/uvmprefetch/1.5"]
    checks = {c["name"]: c for c in res["checks"]}
    for n in names:
        assert checks[f"{n} touched each launch's bytes once, in order"]["ok"] is True
        assert checks[f"{n} moves issued by the runtime's mover"]["ok"] is True
        assert checks[f"{n} written data intact after the moves"]["ok"] is True
        assert checks[f"{n} prediction"]["ok"] is None  # the fake's timings are not a GPU's: reported, not judged
    for c in res["cases"]:
        m, p = c["measured"], c["predicted"]
        for k in ("time_s", "ideal_s", "stall_s", "faults", "bytes_htod", "bytes_dtoh", "host_us_per_launch"):
            assert m[k] is not None, k
        assert p["time_s"] > 0 and c["error"] == pytest.approx(p["time_s"] / m["time_s"] - 1)
        assert c["scale"] == 0.125 and 1.45 < c["oversub"] < 1.55
    entry = json.loads(base.read_text())["cpu (dry-run)"]
    got = {c["name"]: c for c in entry["cases"]}
    assert set(got) == set(names)
    for c in got.values():
        assert c["predicted_time_s"] > 0 and c["time_s"] > 0 and c["discards"] is False and c["scale"] == 0.125


def test_a_trace_too_big_for_the_cap_is_scaled_to_fit(tmp_path):
    proc = _run("--dry-run", "--scale", "1", "--max-fraction", "0.2", "--policies", "demand", "--no-baseline",
                "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    case = json.loads((tmp_path / "replay_gpu.json").read_text())["cases"][0]
    assert case["scale"] < 1 and "to fit" in case["scale_note"]
    assert case["measured"]["arena_bytes"] <= 0.2 * (3 << 30)
    assert "halving the scale" in proc.stderr


@pytest.mark.parametrize("args, words", [
    (["--oversub", "0.5"], "--oversub"),
    (["--policies", "oracle"], "simulator baseline"),
    (["--policies", "nosuch"], "--policies"),
    (["--scale", "2"], "--scale"),
    (["--host", "warp=9"], "host"),
    (["no/such/file.uvmt"], "neither a trace file"),
])
def test_bad_input_is_one_line(tmp_path, args, words):
    proc = _run("--dry-run", "--no-baseline", "--out", str(tmp_path), *args, timeout=300)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "Traceback" not in proc.stderr, proc.stderr


def test_the_data_check_sees_a_move_that_loses_data():
    dev, run, meas = _fake_run("demand")
    assert meas["data"]["checked"] > 100 and meas["data"]["wrong"] == 0
    # GIVEN a driver whose eviction to the host loses what it moves
    dev = FakeDevice()
    migrate = dev.rt._migrate

    def losing(a, off, n, to_gpu):
        if not to_gpu:
            a.buf[off:off + n] = 0
        return migrate(a, off, n, to_gpu)
    dev.rt._migrate = losing
    meas = replay_on_device(dev, run, make_runtime, time.monotonic() + 600)
    # THEN the written bytes read back wrong
    assert meas["data"]["wrong"] > 0 and meas["data"]["first_wrong"]["got"] == 0


def test_the_hook_order_decides_whether_a_launch_finds_its_own_prefetches():
    # GIVEN the live order (the runtime sees a launch after its kernel was queued) and the what-if (before it)
    faults = {}
    for after in (True, False):
        t = scale_trace(load(TRACES / "gpt2-small-b2s128.uvmt"), 1 / 8)
        lay = build_layout(t)
        prof = get_profile("h100-pcie-cal")
        dur = launch_durations(t, prof)
        run = Run(t, lay, touch_plan(t, lay.base), dur, np.maximum(dur - prof.launch_overhead_s, 0),
                  capacity_for(lay, None, 1.5), "uvmprefetch", hook_after_launch=after)
        dev = FakeDevice()
        meas = replay_on_device(dev, run, make_runtime, time.monotonic() + 600)
        assert check_log(dev.kernels.log, t, lay.base, meas["arena_base"])[0] and meas["data"]["wrong"] == 0
        faults[after] = meas["faults"]
    # THEN on the fake (a kernel runs when it is launched) the policy's prefetches for the launch itself come too
    # late in the live order: several times the faults (634 vs 68 when measured)
    assert faults[True] > 3 * faults[False]
