"""The ``oracle`` policy on hand-derived micro-traces (notation as in ``test_sim_golden.py``).

h100-pcie-lit, 2 MiB blocks: ``T`` = 2 MiB / bw(2 MiB) is one prefetched block on H2D, ``d`` = 1 ms a launch.
"""

import math

import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.gpus import get_profile
from uvmprefetch.policy.oracle import OracleParams, OraclePolicy
from uvmprefetch.sim.layout import build_layout
from uvmprefetch.sim.replay import replay
from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace import READ, TraceBuilder

MiB = 1 << 20
GPU = get_profile("h100-pcie-lit")
D = 1e-3
T = 2 * MiB / (52e9 * 2 / math.pi * math.atan(0.0729 * 2048))
OLD = "oracle:refetch=false,stall_aware=false"  # the oracle before refetch / stall_aware


def evicted_then_needed():
    """Capacity 2 blocks; A, B, C one block each. L0 reads A, B; L1 reads A; L2 reads C; L3 reads B."""
    b = TraceBuilder()
    a, bb, c = (b.alloc(2 * MiB, "activation") for _ in range(3))
    b.launch("l0", [(a, 0, 2 * MiB, READ), (bb, 0, 2 * MiB, READ)], duration=D)
    b.launch("l1", [(a, 0, 2 * MiB, READ)], duration=D)
    b.launch("l2", [(c, 0, 2 * MiB, READ)], duration=D)
    b.launch("l3", [(bb, 0, 2 * MiB, READ)], duration=D)
    return b.build()


def test_block_evicted_in_a_walk_is_queued_again_where_the_walk_reaches_its_next_use():
    """Decision 0: A, B queued (arrive T, 2T); C has no victim (nothing resident yet). L0 runs 2T .. 2T + d.

    Decision 1 (A, B resident, link idle): L2 needs C; the Belady victim is B (next use L3, A's is L1 = now).
    The walk then reaches L3, which needs B again: no victim is left (A is the running launch's), so the
    horizon stays at L3. Decision 2: A is never used again -> evicted, B queued at 2T + 2d, arrives
    before L3 starts at 2T + 3d. Time 2T + 4d, late stall 2T (L0 only); H2D: A, B, C, B.

    The old walk counted B present at L3 (it was resident when the decision began): the horizon passed L3
    and B came back only when L3 ran: one more T of late stall.
    """
    t = evicted_then_needed()
    r = replay(t, "oracle", GPU, capacity_bytes=4 * MiB, check=True)
    assert r["time_s"] == pytest.approx(2 * T + 4 * D, rel=1e-12)
    assert r["late_stall_s"] == pytest.approx(2 * T, rel=1e-12)
    assert r["faults"] == 0 and r["bytes_htod"] == 8 * MiB and r["writebacks"] == 0
    old = replay(t, OLD, GPU, capacity_bytes=4 * MiB, check=True)
    assert old["time_s"] == pytest.approx(3 * T + 4 * D, rel=1e-12)
    assert old["late_stall_s"] == pytest.approx(3 * T, rel=1e-12)
    assert old["faults"] == 0 and old["bytes_htod"] == 8 * MiB


def test_refetch_alone_fixes_it():
    r = replay(evicted_then_needed(), "oracle:stall_aware=false", GPU, capacity_bytes=4 * MiB, check=True)
    assert r["time_s"] == pytest.approx(2 * T + 4 * D, rel=1e-12)


def misses_behind_horizon(t, pol, **kw):
    """Blocks missing (neither resident nor in flight) at launches the oracle's horizon had already passed:
    such a block is fetched only when its launch runs, i.e. late."""
    missed = []
    on_launch = pol.on_launch

    def spy(info, state):
        if hasattr(pol, "horizon") and info.index < pol.horizon:
            blk = info.blocks
            missed.append(int((~state.resident[blk] & ~state.in_flight[blk]).sum()))
        return on_launch(info, state)

    pol.on_launch = spy
    replay(t, pol, GPU, check=True, **kw)
    return sum(missed)


@pytest.mark.parametrize("oversub", [1.5, 2.0, 3.0])
def test_nothing_goes_missing_behind_the_horizon(oversub):
    """Invariant of the walk: a launch the horizon has passed has all its blocks resident or in flight
    (a victim's next use is queued again, also behind the horizon when it was evicted for launch i)."""
    t = training_trace(layers=6, param_bytes=6 << 20, act_bytes=4 << 20, iterations=3)
    assert misses_behind_horizon(t, OraclePolicy(), oversub=oversub, layout=build_layout(t)) == 0
    assert misses_behind_horizon(evicted_then_needed(), OraclePolicy(), capacity_bytes=4 * MiB) == 0
    # The old walk loses B behind the horizon (L3 in the micro-trace above).
    old = OraclePolicy(refetch=False, stall_aware=False)
    assert misses_behind_horizon(evicted_then_needed(), old, capacity_bytes=4 * MiB) == 1


def test_old_behaviour_is_reachable_and_params_validate():
    p = OracleParams()
    assert p.refetch and p.stall_aware and p.pace and p.lead_s == 0
    with pytest.raises(ConfigError):
        OracleParams(lead_s=-1)
