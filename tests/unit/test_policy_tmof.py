"""``tmof``: Capuchin's swapping with TMOF's contention avoidance across data-parallel GPUs."""

from pathlib import Path

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.policy import make_policy
from uvmprefetch.policy.tmof import _backlog
from uvmprefetch.sim.multigpu import replay_multi
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace.format import load

TRACE = Path(__file__).resolve().parents[2] / "traces" / "resnet-50-b2i64.uvmt"
FIELDS = ("time_s", "faults", "bytes_htod", "bytes_dtoh", "iteration_times_s")


@pytest.fixture(scope="module")
def trace():
    return load(TRACE)


def test_one_gpu_is_capuchin(trace):
    """With one GPU there is no one to contend with: the same plan, the same replay."""
    a = replay(trace, "capuchin", "h100-pcie-lit", oversub=1.5)
    b = replay(trace, "tmof", "h100-pcie-lit", oversub=1.5)
    assert all(a[k] == b[k] for k in FIELDS)
    assert b["policy_report"]["world"] == 1


def test_without_contention_avoidance_it_is_capuchin_on_every_gpu(trace):
    a = replay_multi(trace, "capuchin", "h100-pcie-lit", 3, oversub=1.5)
    b = replay_multi(trace, "tmof:disjoint=false", "h100-pcie-lit", 3, oversub=1.5)
    assert all(a[k] == b[k] for k in FIELDS)


def test_higher_ranks_plan_around_the_lower_ranks(trace):
    """Rank 0 ranks the gaps as Capuchin does; rank 1 ranks the gaps rank 0 swaps, and those whose copies wait
    behind rank 0's, lower (never higher)."""
    from uvmprefetch.gpus import get_profile
    from uvmprefetch.policy._swapplan import IterationProfiler, gaps
    from uvmprefetch.policy.capuchin import CapuchinPolicy
    from uvmprefetch.sim.engine import GpuModel
    from uvmprefetch.sim.layout import build_layout

    lay = build_layout(trace)
    cap = lay.footprint_blocks * lay.block_size * 2 // 3
    pol = [make_policy("tmof") for _ in range(2)]
    for k, p in enumerate(pol):
        p.rank, p.world = k, 2
        GpuModel(get_profile("h100-pcie-lit"), cap, lay.block_size, lay.max_blocks, p)  # starts the policy
    prof = IterationProfiler()  # iteration 1, as the policy measures it
    for i in np.flatnonzero(trace.launch_iter == 1):
        prof.launch(lay.launch_blocks(i), float(trace.launch_dur[i]))
    pr = prof.profile()
    g = gaps(pr)
    base, _ = CapuchinPolicy._priority(pol[0], g, pr)
    p0, _ = pol[0]._priority(g, pr)
    p1, _ = pol[1]._priority(g, pr)
    assert np.array_equal(p0, base)
    assert (p1 <= base).all() and (p1 < base).any()


def test_contended_multi_gpu_replay_keeps_the_invariants(trace):
    r = replay_multi(trace, "tmof", "h100-pcie-lit", 2, oversub=1.5, check=True)
    assert r["time_s"] >= r["ideal_s"] and r["policy_report"]["world"] == 2


def test_backlog_of_a_fifo_link():
    """Positions start at 0, 1, 2 s (3 s iteration). 1.5 s of copies at position 0: position 1 waits 0.5 s,
    position 2 none. Add 4 s at position 2: they run 2 s .. 6 s, i.e. 3 s into the next lap, so there
    position 0 waits 3 s, position 1 waits 4.5 - 1 = 3.5 s (the 1.5 s queued at 0 ran 3 .. 4.5 s) and
    position 2 waits 4.5 - 2 = 2.5 s (the second lap is the one reported)."""
    t0 = np.array([0.0, 1.0, 2.0, 3.0])
    assert _backlog(t0, np.array([1.5, 0.0, 0.0])).tolist() == [0.0, 0.5, 0.0]
    b = _backlog(t0, np.array([1.5, 0.0, 4.0]))
    assert b.tolist() == pytest.approx([3.0, 3.5, 2.5])


def test_bad_weight_is_named():
    with pytest.raises(ConfigError, match="weight"):
        make_policy("tmof:weight=-1")
