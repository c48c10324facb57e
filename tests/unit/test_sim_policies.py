"""Every registered policy (baselines and the prefetchers as they exist) through the simulator.

GIVEN a synthetic training loop WHEN each available policy replays it THEN the engine's invariants hold
(``check=True``), at oversub 1.0 it is within the cold first-touch cost of ``ideal``, and under
oversubscription it is never faster than ideal and moves at least every first-touched byte."""

import pytest

from uvmprefetch.policy import available
from uvmprefetch.sim.layout import build_layout
from uvmprefetch.sim.replay import replay
from uvmprefetch.sim.synthetic import training_trace

TRACE = training_trace(layers=6, param_bytes=6 << 20, act_bytes=4 << 20, iterations=3)
LAYOUT = build_layout(TRACE)


@pytest.mark.parametrize("name", available())
def test_oversub_one_is_ideal_within_cold_cost(name):
    r = replay(TRACE, name, "h100-pcie-lit", oversub=1.0, layout=LAYOUT, check=True)
    assert r["ideal_s"] - 1e-12 <= r["time_s"] <= r["ideal_s"] + r["cold_first_touch_s"] + 1e-12


@pytest.mark.parametrize("name", [n for n in available() if n != "ideal"])
@pytest.mark.parametrize("oversub", [1.5, 3.0])
def test_invariants_under_oversubscription(name, oversub):
    r = replay(TRACE, name, "h100-pcie-lit", oversub=oversub, layout=LAYOUT, check=True)
    assert r["peak_used_blocks"] <= r["capacity_bytes"] // LAYOUT.block_size
    assert r["time_s"] >= r["ideal_s"] - 1e-12
    assert r["bytes_htod"] + r["remote_bytes"] >= r["cold_first_touch_bytes"]
    assert r["prefetch_useful_bytes"] <= r["prefetch_issued_bytes"]
    assert len(r["iteration_times_s"]) == 3


def test_empty_trace():
    from uvmprefetch.trace import TraceBuilder
    t = TraceBuilder().build()
    r = replay(t, "demand", "h100-pcie-lit", oversub=2.0)
    assert r["time_s"] == 0 and r["n_launches"] == 0
