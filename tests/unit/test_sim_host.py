"""The simulator's host clock (``HostModel``, docs/simulator.md "Host clock"): the thread that issues the
launches. Expected times are derived by hand from the h100-pcie-lit profile, as in test_sim_golden.py."""

import time

import numpy as np
import pytest

from test_sim_golden import steps_trace

from uvmprefetch.errors import ConfigError
from uvmprefetch.gpus import get_profile
from uvmprefetch.policy.base import Decision, Policy
from uvmprefetch.sim.host import HOST_PRESETS, HostModel, parse_host
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace import READ, WRITE, TraceBuilder

MiB = 1 << 20
GPU = get_profile("h100-pcie-lit")
D = 1e-3


def resident_trace(n=6):
    """One 2 MiB tensor written by the first launch and read by the next ``n - 1``: after the first fault
    nothing moves, so the time is faults + compute + what the host adds."""
    b = TraceBuilder()
    x = b.alloc(2 * MiB, "activation")
    b.launch("w", [(x, 0, 2 * MiB, WRITE)], duration=D)
    for i in range(n - 1):
        b.launch(f"r{i}", [(x, 0, 2 * MiB, READ)], duration=D)
    return b.build()


def test_no_host_and_a_free_host_agree():
    t = resident_trace()
    a = replay(t, "demand", GPU, capacity_bytes=8 * MiB, check=True)
    b = replay(t, "demand", GPU, capacity_bytes=8 * MiB, check=True, host=HostModel())
    assert b["time_s"] == a["time_s"] and b["host_stall_s"] == 0.0
    assert a.get("host") is None and b["host"]["decision_s"] == 0.0


def test_host_bound_launches_wait_for_the_host():
    """A decision of 3 ms per launch against 1 ms kernels: launch i is issued at (i + 1) * 3 ms. Launch 0
    starts at 3 ms and ends at 3 ms + fault + 1 ms, before 6 ms; every later launch starts when the host
    issues it, so the last of 6 starts at 18 ms and ends at 19 ms."""
    t = resident_trace(6)
    r = replay(t, "demand", GPU, capacity_bytes=8 * MiB, check=True, host="decision_s=3e-3")
    assert r["time_s"] == pytest.approx(6 * 3e-3 + D, rel=1e-9)
    assert r["host_decision_s"] == pytest.approx(6 * 3e-3)
    free = replay(t, "demand", GPU, capacity_bytes=8 * MiB)
    assert r["host_stall_s"] == pytest.approx(r["time_s"] - free["time_s"], rel=1e-9)


def two_iterations(n=3):
    """``resident_trace`` over two iterations of ``n`` launches each (one tensor: only the first launch faults)."""
    b = TraceBuilder()
    x = b.alloc(2 * MiB, "activation")
    for i in range(2 * n):
        b.launch("w" if i == 0 else f"r{i % n}", [(x, 0, 2 * MiB, WRITE if i == 0 else READ)], duration=D,
                 iteration=i // n)
    return b.build()


def test_a_host_ahead_of_the_gpu_loses_its_lead_at_each_synchronised_iteration_end():
    """0.1 ms of host time per launch against 1 ms kernels: the host runs ahead and only the first launch waits
    for it. With ``sync_iterations`` the host waits for the GPU after iteration 0, so the first launch of
    iteration 1 waits for its 0.1 ms of host time as well: the run is exactly that much longer."""
    t = two_iterations()
    free = replay(t, "demand", GPU, capacity_bytes=8 * MiB, check=True)
    ahead = replay(t, "demand", GPU, capacity_bytes=8 * MiB, check=True, host="decision_s=1e-4")
    synced = replay(t, "demand", GPU, capacity_bytes=8 * MiB, check=True, host="decision_s=1e-4,sync_iterations=true")
    assert ahead["time_s"] == pytest.approx(free["time_s"] + 1e-4, rel=1e-9)
    assert ahead["host_stall_s"] == pytest.approx(1e-4, rel=1e-9)
    assert synced["time_s"] == pytest.approx(free["time_s"] + 2e-4, rel=1e-9)
    assert synced["host_stall_s"] == pytest.approx(2e-4, rel=1e-9)
    assert synced["host"]["sync_iterations"] is True and ahead["host"]["sync_iterations"] is False


class EvictAfterUse(Policy):
    """Evicts the written block right after launch 0 (at launch 1's decision) and discards nothing."""

    name = "evict-after-use"

    def on_launch(self, info, state):
        if info.index == 1:
            return Decision(evict=np.array([0]))
        return None


def two_tensors(free_x=False):
    """``x`` written by launch 0; ``y`` read by launches 1 and 2; with ``free_x``, ``x`` is freed before launch 2."""
    return steps_trace("Ab-ab" if free_x else "Abb")


def test_blocking_evictions_hold_the_host_for_the_write_back():
    """Launch 1's decision evicts the dirty block 0: D2H takes Td. With ``blocking_evict`` the host issues
    launch 1 only after the write-back, so the run is longer by what the write-back did not overlap."""
    t = two_tensors()
    base = replay(t, EvictAfterUse(), GPU, capacity_bytes=8 * MiB, check=True, host=HostModel())
    blk = replay(t, EvictAfterUse(), GPU, capacity_bytes=8 * MiB, check=True,
                 host=HostModel(blocking_evict=True))
    td = GPU.transfer_time(2 * MiB, "dtoh")
    assert base["bytes_dtoh"] == blk["bytes_dtoh"] == 2 * MiB
    assert blk["host_blocked_s"] == pytest.approx(td, rel=1e-9)
    # launch 1 faults its block in (f1) while the write-back runs when not blocking; blocking, it starts
    # after the write-back: the difference is td (launch 1's fault starts only once the host is free)
    assert blk["time_s"] == pytest.approx(base["time_s"] + td, rel=1e-9)


class DiscardAtTwo(Policy):
    name = "discard-at-two"

    def on_launch(self, info, state):
        return Decision(discard=np.array([0])) if info.index == 2 else None


def test_discards_cost_host_time_per_block():
    """Launch 2 discards one block at 5 ms of host time; the host was idle before (no other costs), so
    launch 2 is issued at 5 ms, after launches 0 and 1 have ended (two faults + 2 ms): it runs 5..6 ms."""
    t = two_tensors()
    a = replay(t, DiscardAtTwo(), GPU, capacity_bytes=8 * MiB, check=True, host=HostModel())
    b = replay(t, DiscardAtTwo(), GPU, capacity_bytes=8 * MiB, check=True, host=HostModel(discard_block_s=5e-3))
    end1 = a["time_s"] - D
    assert end1 < 5e-3
    assert b["time_s"] == pytest.approx(5e-3 + D, rel=1e-9)
    assert b["host_stall_s"] == pytest.approx(5e-3 - end1, rel=1e-9)


class Slow(Policy):
    name = "slow"

    def on_launch(self, info, state):
        time.sleep(2e-3)
        return None


def test_measured_decision_time_is_charged():
    t = resident_trace(5)
    r = replay(t, Slow(), GPU, capacity_bytes=8 * MiB, host="measure_decision=true")
    assert r["host_decision_s"] >= 5 * 2e-3
    assert r["time_s"] >= 5 * 2e-3 + D
    half = replay(t, Slow(), GPU, capacity_bytes=8 * MiB, host="measure_decision=true,decision_scale=0")
    assert half["host_decision_s"] == 0.0


def test_parse_host_presets_overrides_and_errors():
    assert parse_host(None) is None and parse_host("none") is None
    live = parse_host("live-sync")
    assert live == HOST_PRESETS["live-sync"] and live.blocking_evict and live.measure_decision and live.sync_iterations
    assert parse_host("live-sync:decision_scale=0.5").decision_scale == 0.5
    assert parse_host("live-sync:decision_scale=0.5").blocking_evict  # the preset's other fields stay
    assert parse_host("decision_s=2e-5") == HostModel(decision_s=2e-5)


@pytest.mark.parametrize("spec, says", [
    ("fast", "unknown"), ("launch_s=-1", "launch_s must be"), ("speed=3", "unknown parameter"),
    ("planner_lag=3", "planner_lag needs planner"), ("live:planner_lag=-1", "planner_lag"),
    ("live:planner_lag=1.5", "planner_lag")])
def test_parse_host_names_what_is_wrong(spec, says):
    with pytest.raises(ConfigError, match=says):
        parse_host(spec)


def test_a_discard_of_live_data_is_refused_and_written_back():
    """Discarding block 0 at launch 2 drops it only where its tensor was freed; while ``x`` lives, the engine
    evicts it instead (the dirty block is written back): a policy gets no free eviction of live data, which
    on a GPU would lose it."""
    live = replay(two_tensors(), DiscardAtTwo(), GPU, capacity_bytes=8 * MiB, check=True)
    dead = replay(two_tensors(free_x=True), DiscardAtTwo(), GPU, capacity_bytes=8 * MiB, check=True)
    assert live["refused_discards"] == 1 and live["discards"] == 0 and live["bytes_dtoh"] == 2 * MiB
    assert dead["refused_discards"] == 0 and dead["discards"] == 1 and dead["bytes_dtoh"] == 0
    # without discards (the live default) the freed block is written back like the live one
    off = replay(two_tensors(free_x=True), DiscardAtTwo(), GPU, capacity_bytes=8 * MiB, check=True, discards=False)
    assert off["refused_discards"] == 1 and off["discards"] == 0 and off["bytes_dtoh"] == 2 * MiB


def test_without_discards_freed_memory_moves_like_live_data():
    """The shipped GPT-2 small trace at 1.5x: with discards ``uvmprefetch`` drops freed blocks and brings
    reused memory back zero-filled; without them (``discards=False``, the live cuda default) no freed
    block is dropped or zero-filled, every discard a policy asks for is an eviction (``uvmprefetch`` made to take
    frees as deaths: ``invalidate_without_discard``), and it moves more bytes both ways. By default ``uvmprefetch`` is told
    and asks for none. ``demand`` never learns of frees, so it runs the same either way."""
    from pathlib import Path

    from uvmprefetch.trace.format import load
    t = load(Path(__file__).resolve().parents[2] / "traces" / "gpt2-small-b2s128.uvmt")
    on = replay(t, "uvmprefetch:invalidate_without_discard=true", "h100-pcie-lit", oversub=1.5)
    off = replay(t, "uvmprefetch:invalidate_without_discard=true", "h100-pcie-lit", oversub=1.5, discards=False)
    assert on["discards"] > 0 and on["zero_fill_blocks"] > 0
    assert off["discards"] == 0 and off["zero_fill_blocks"] == 0
    assert off["refused_discards"] >= off["policy_report"]["discarded_blocks"] > 0
    assert off["bytes_htod"] > on["bytes_htod"] and off["bytes_dtoh"] > on["bytes_dtoh"]
    told = replay(t, "uvmprefetch", "h100-pcie-lit", oversub=1.5, discards=False)
    assert told["policy_report"]["discarded_blocks"] == 0 and told["refused_discards"] == 0
    assert told["zero_fill_blocks"] == 0 and told["bytes_dtoh"] > on["bytes_dtoh"]
    d_on = replay(t, "demand", "h100-pcie-lit", oversub=1.5)
    d_off = replay(t, "demand", "h100-pcie-lit", oversub=1.5, discards=False)
    assert (d_on["time_s"], d_on["bytes_htod"], d_on["bytes_dtoh"]) == (d_off["time_s"], d_off["bytes_htod"],
                                                                          d_off["bytes_dtoh"])
