"""Data-parallel GPUs sharing one host link (``uvmprefetch.sim.multigpu``).

Notation as in ``test_sim_golden.py``: ``lat`` = 45 us per fault batch, ``Tf`` = one faulted 2 MiB block
(32 pieces of 64 KiB at the UVMSmart curve of 52 GB/s), ``d`` the launch duration.
"""

import math
from pathlib import Path

import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.gpus import get_profile
from uvmprefetch.sim.multigpu import replay_multi
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace import WRITE, TraceBuilder
from uvmprefetch.trace.format import load

MiB = 1 << 20
GPU = get_profile("h100-pcie-lit")
LAT, D = 45e-6, 1e-3
TRACES = Path(__file__).resolve().parents[2] / "traces"


def bw(n):
    return 52e9 * 2 / math.pi * math.atan(0.0729 * n / 1024)


TF = 32 * (64 * 1024) / bw(64 * 1024)


def one_block_step():
    """One iteration of one launch that writes one 2 MiB block (cold: it faults)."""
    b = TraceBuilder()
    x = b.alloc(2 * MiB, "activation")
    b.iteration = 0
    b.launch("k", [(x, 0, 2 * MiB, WRITE)], duration=D)
    return b.build()


def test_two_gpus_fault_one_after_the_other_on_a_shared_link():
    """Both GPUs fault their block at t = 0. The shared link migrates GPU 0's block in [lat, lat + Tf] and
    GPU 1's only after it, in [lat + Tf, lat + 2 Tf]: GPU 1 ends at lat + 2 Tf + d, and at the step's
    barrier GPU 0 waits Tf for it. With a link each, both end at lat + Tf + d and nobody waits."""
    t = one_block_step()
    r = replay_multi(t, "demand", GPU, 2, capacity_bytes=4 * MiB, check=True)
    assert r["time_s"] == pytest.approx(LAT + 2 * TF + D, rel=1e-12)
    assert [g["time_s"] for g in r["per_gpu"]] == pytest.approx([LAT + 2 * TF + D] * 2, rel=1e-12)
    assert r["sync_wait_s"] == pytest.approx(TF, rel=1e-9)
    assert r["faults"] == 2 and r["bytes_htod"] == 4 * MiB
    assert r["link_busy_htod"] == pytest.approx(2 * TF / (LAT + 2 * TF + D), rel=1e-9)
    own = replay_multi(t, "demand", GPU, 2, capacity_bytes=4 * MiB, shared_link=False)
    assert own["time_s"] == pytest.approx(LAT + TF + D, rel=1e-12) and own["sync_wait_s"] == 0


@pytest.mark.parametrize("policy", ["demand", "oracle", "uvmprefetch", "deepum"])
def test_one_gpu_is_the_single_gpu_replay(policy):
    t = load(TRACES / "resnet-50-b2i64.uvmt")
    a = replay(t, policy, GPU, oversub=1.5)
    b = replay_multi(t, policy, GPU, 1, oversub=1.5)
    for k in ("time_s", "faults", "bytes_htod", "bytes_dtoh", "stall_s", "iteration_times_s", "steady_slowdown"):
        assert b[k] == a[k], k


def test_own_links_are_independent_copies_and_a_shared_one_is_contended():
    t = load(TRACES / "resnet-50-b2i64.uvmt")
    one = replay(t, "uvmprefetch", GPU, oversub=1.5)
    own = replay_multi(t, "uvmprefetch", GPU, 3, oversub=1.5, shared_link=False, check=True)
    assert own["time_s"] == one["time_s"] and own["bytes_htod"] == 3 * one["bytes_htod"]
    assert own["sync_wait_s"] == 0
    shared = replay_multi(t, "uvmprefetch", GPU, 3, oversub=1.5, check=True)
    assert shared["time_s"] > own["time_s"]
    # One link serves three GPUs' traffic: never more than busy all the time.
    assert 0 < shared["link_busy_htod"] <= 1 + 1e-9
    assert len(shared["per_gpu"]) == 3 and shared["n_gpus"] == 3


def test_ranks_are_given_to_the_policies():
    from uvmprefetch.policy.base import Policy
    seen = []

    class Spy(Policy):
        name = "spy"

        def on_start(self, ctx):
            seen.append((self.rank, self.world))
            super().on_start(ctx)

    import uvmprefetch.sim.multigpu as M
    orig = M.make_policy
    M.make_policy = lambda spec: Spy()
    try:
        replay_multi(one_block_step(), "spy", GPU, 3, capacity_bytes=4 * MiB)
    finally:
        M.make_policy = orig
    assert seen == [(0, 3), (1, 3), (2, 3)]


@pytest.mark.parametrize("n", [0, -1, 2.5, True, 65])
def test_bad_gpu_count_is_a_clear_error(n):
    with pytest.raises(ConfigError, match="n_gpus"):
        replay_multi(one_block_step(), "demand", GPU, n, capacity_bytes=4 * MiB)


def test_replay_cli_with_gpus(tmp_path):
    import json
    import subprocess
    import sys
    tr = str(TRACES / "resnet-50-b2i64.uvmt")
    cmd = [sys.executable, "-m", "uvmprefetch", "replay", tr, "--oversub", "1.5", "--policy", "demand"]
    r = subprocess.run(cmd + ["--gpus", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["n_gpus"] == 2 and d["shared_link"] and len(d["per_gpu"]) == 2
    r = subprocess.run(cmd + ["--gpus", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "one shared host link" in r.stdout
    for bad, msg in ((["--gpus", "two"], "--gpus"), (["--own-links"], "--own-links"),
                     (["--gpus", "2", "--plot", str(tmp_path / "p.png")], "one GPU only")):
        r = subprocess.run(cmd + bad, capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and msg in r.stderr and "Traceback" not in r.stderr


def test_bench_with_gpus_marks_offline_policies(tmp_path):
    from uvmprefetch.sim import bench as B
    t = load(TRACES / "resnet-50-b2i64.uvmt")
    rows = B.run_bench([("r50", t)], ["demand", "oracle", "tmof"], [1.5], GPU, progress=False, n_gpus=2)
    by = {r["policy"]: r for r in rows}
    assert by["oracle"]["offline"] and not by["tmof"]["offline"] and by["tmof"]["n_gpus"] == 2
    assert by["tmof"]["time_s"] == replay_multi(t, "tmof", GPU, 2, oversub=1.5)["time_s"]
    md = B.markdown(rows, [1.5])
    assert md.startswith("2 data-parallel GPUs") and "| r50 | oracle (offline) |" in md and "planning s" in md


def test_capacity_under_one_block_with_the_ideal_policy():
    """``ideal`` ignores the capacity (replay accepts any): the multi-GPU replay too, with no oversub figure
    instead of a division by zero."""
    t = one_block_step()
    single = replay(t, "ideal", "h100-pcie-lit", capacity_bytes=1000)
    r = replay_multi(t, "ideal", "h100-pcie-lit", 2, capacity_bytes=1000, check=True)
    assert r["oversub"] is None and single["oversub"] is None
    assert r["time_s"] == pytest.approx(single["time_s"], rel=1e-12)
