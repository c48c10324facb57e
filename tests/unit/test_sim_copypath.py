"""The copy path (``--evict copy|auto``, ``sim/copypath.py``): golden cases derived by hand, eligibility, mirror
memory, the host's costs, and the engine's invariants under random decisions.

Notation (``h100-pcie``, the calibrated default, 2 MiB blocks; the UVMSmart curve
bw(n) = a * 2/pi * atan(0.0729 * n / 1024)):

- ``TD`` = 2 MiB / bw(2 MiB) at a = 7.5e9 (UVM's eviction of one block, 280.8177 us); ``TH`` the same at
  a = 50e9 (one prefetched block, 42.1227 us);
- copy path (the profile's research/assumed figures): ``CO`` = 10 us + 4 MiB / 55e9 (one copy of a 2-block run,
  86.2601 us either way), ``DI`` = ``RE`` = 20 us + 2 * 2 us (one discard or repopulate call of 2 blocks).

The scenario (``golden_trace``): allocations A (blocks 0-1), B (2-3), C (4-5), capacity 4 blocks. Three warm-up
launches of 1 ms write C, A, B; at the third the policy evicts C (so C is off the GPU, clean: written back under
``uvm``, copied into its mirror under ``copy``). Then, measured from the end of the warm-up (``t = 0``):

| launch | touches | decision at the launch |
| --- | --- | --- |
| L0 | A (reads and writes) | evict B, prefetch C |
| L1 | C | evict A, prefetch B |
| L2 | B | (``clean_again``: evict C) |

The host model is ``blocking_evict`` alone: the thread waits for the UVM write-backs its decision queued.
"""

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_sim_properties import SETTINGS, Chaos, traces, widest
from test_sim_ssd_tier import Scripted

from uvmprefetch.cli import main
from uvmprefetch.errors import ConfigError
from uvmprefetch.gpus import get_profile
from uvmprefetch.policy.base import Advice, Decision, EvictPath, Policy
from uvmprefetch.sim.copypath import EvictModel, copy_eligible, parse_evict
from uvmprefetch.sim.host import HostModel
from uvmprefetch.sim.layout import build_layout
from uvmprefetch.sim.replay import replay
from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace import READ, WRITE, TraceBuilder, save

MiB = 1 << 20
GPU = get_profile("h100-pcie")
D = 1e-3


def bw(a, n):
    return a * 2 / math.pi * math.atan(0.0729 * n / 1024)


TD = 2 * MiB / bw(7.5e9, 2 * MiB)
TH = 2 * MiB / bw(50e9, 2 * MiB)
CO = 10e-6 + 4 * MiB / 55e9
DI = RE = 20e-6 + 2 * 2e-6
BLOCKING = HostModel(blocking_evict=True)


def dec(**kw):
    """A Decision from lists of block ids (``evict_path``: ``EvictPath`` values)."""
    return Decision(**{k: np.array(v, dtype=np.int8 if k == "evict_path" else np.int64) for k, v in kw.items()})


PLAN = {2: dec(evict=[4, 5]), 3: dec(evict=[2, 3], prefetch=[4, 5]), 4: dec(evict=[0, 1], prefetch=[2, 3])}


def golden_trace(d):
    """The scenario: the warm-up is iteration 0, L0-L2 iteration 1 (a host that syncs at iteration ends starts
    L0's decision at t = 0)."""
    b = TraceBuilder()
    a, bb, c = (b.alloc(4 * MiB, "activation") for _ in range(3))
    b.iteration = 0
    for name, x in (("w0", c), ("w1", a), ("w2", bb)):
        b.launch(name, [(x, 0, 4 * MiB, WRITE)], duration=D)
    b.iteration = 1
    b.launch("l0", [(a, 0, 4 * MiB, READ | WRITE)], duration=d)
    b.launch("l1", [(c, 0, 4 * MiB, READ)], duration=d)
    b.launch("l2", [(bb, 0, 4 * MiB, READ)], duration=d)
    return b.build()


def run(d, evict, plan=PLAN, host=BLOCKING, **kw):
    """Replay the golden scenario; returns (result, ends of L0, L1, L2 measured from the warm-up's end)."""
    r = replay(golden_trace(d), Scripted(plan), GPU, capacity_bytes=8 * MiB, host=host, evict=evict, check=True,
               timeline=True, **kw)
    comp = r["timeline"]["compute"]
    t0 = comp[2][1]
    return r, [e - t0 for _, e, _, _ in comp[3:]]


@pytest.mark.parametrize("d", [1e-3, 100e-6])
def test_uvm_eviction_holds_the_thread(d):
    """``uvm``: L0's decision writes B back (0 .. TD .. 2 TD; the thread waits for it), so L0 runs 2 TD .. 2 TD + d;
    C comes in as the rooms free (TD + TH, 2 TD + TH). L1 writes A back the same way: e1 = e0 + 2 TD + d. B arrives
    at e0 + 2 TD + TH < e1, so e2 = e1 + d. With d = 1 ms: 4123.27 us (1.374 x ideal); 100 us: 1423.27 us (4.744 x)."""
    r, (e0, e1, e2) = run(d, "uvm")
    assert e0 == pytest.approx(2 * TD + d, rel=1e-9)
    assert e1 == pytest.approx(e0 + 2 * TD + d, rel=1e-9)
    assert e2 == pytest.approx(e1 + d, rel=1e-9)
    assert e2 * 1e6 == pytest.approx({1e-3: 4123.27, 100e-6: 1423.27}[d], abs=0.01)
    assert r["bytes_dtoh"] == 12 * MiB and r["writebacks"] == 6 and r["copy_path"] is False
    assert "copy_out_bytes" not in r


def test_copy_path_hides_behind_long_launches():
    """``copy``, d = 1 ms: L0's decision copies B out (0 .. CO), discards it (.. CO + DI); C is repopulated and
    copied in (.. CO + DI + RE + CO = 220.52 us < d). Nothing holds the thread: L0 runs 0 .. d. L1's decision does
    the same for A and B, inside L1. Total 3 d = ideal; the same bytes as ``uvm``."""
    r, ends = run(1e-3, "copy")
    assert ends == pytest.approx([D, 2 * D, 3 * D], rel=1e-12)
    assert r["bytes_dtoh"] == r["copy_out_bytes"] == 12 * MiB and r["copy_in_bytes"] == 8 * MiB
    assert (r["copy_evictions"], r["writebacks"], r["copy_in_gated"]) == (6, 0, 0)
    assert (r["copy_calls"], r["discard_calls"], r["repopulate_calls"]) == (3 + 2, 3, 2)
    assert r["mirror_peak_bytes"] == 12 * MiB and r["copy_path"] is True


def test_copy_path_with_short_launches_waits_for_the_copy_in():
    """``copy``, d = 100 us: L0 runs 0 .. d; C is back at X = CO + DI + RE + CO = 220.52 us, so L1 runs X .. X + d.
    L1's decision (at d) copies A out when the D2H engine is free (CO + DI .. 2 (CO + DI) = 220.52) and brings B
    back after C's copy-in and A's discard: 220.52 + RE + CO = 330.78; L2 runs from there: 430.78 us, 1.436 x."""
    r, (e0, e1, e2) = run(100e-6, "copy")
    x = CO + DI + RE + CO
    assert e0 == pytest.approx(100e-6, rel=1e-12)
    assert e1 == pytest.approx(x + 100e-6, rel=1e-12)
    assert e2 == pytest.approx(max(x, 2 * (CO + DI)) + RE + CO + 100e-6, rel=1e-12)
    assert e2 * 1e6 == pytest.approx(430.7802, abs=1e-4)


def test_clean_block_with_a_current_mirror_is_only_discarded():
    """L2 evicts C again; C came back by copy-in and L1 only read it. ``copy``: its mirror is current, so one
    discard call (DI, on the D2H engine, inside L2) and no bytes: e2 = 3 d. ``uvm`` drops a clean block for free (the
    model's dirty tracking): e2 = e1 + d; with ``writeback_clean`` (the driver has no dirty tracking) both blocks are
    written back and the thread waits: e2 = e1 + 2 TD + d."""
    plan = dict(PLAN)
    plan[5] = dec(evict=[4, 5])
    r, ends = run(D, "copy", plan)
    assert ends[2] == pytest.approx(3 * D, rel=1e-12)
    assert r["discard_only_evictions"] == 2 and r["copy_evictions"] == 6 and r["copy_out_bytes"] == 12 * MiB
    r, (e0, e1, e2) = run(D, "uvm", plan)
    assert e2 == pytest.approx(e1 + D, rel=1e-9) and r["bytes_dtoh"] == 12 * MiB
    r, (e0, e1, e2) = run(D, "uvm", plan, writeback_clean=True)
    assert e2 == pytest.approx(e1 + 2 * TD + D, rel=1e-9) and r["bytes_dtoh"] == 16 * MiB


def test_a_launch_waits_for_its_copy_in_without_fault_latency():
    """No prefetch: L0 reads C, which is only in its mirror. The block comes back gated: room first (the driver's
    victim A, copied out: 0 .. CO + DI), then repopulate + copy-in (.. + RE + CO); no fault batch. e0 = that + d."""
    plan = {2: dec(evict=[4, 5])}
    b = TraceBuilder()
    a, bb, c = (b.alloc(4 * MiB, "activation") for _ in range(3))
    for name, x in (("w0", c), ("w1", a), ("w2", bb)):
        b.launch(name, [(x, 0, 4 * MiB, WRITE)], duration=D)
    b.launch("l0", [(c, 0, 4 * MiB, READ)], duration=D)
    r = replay(b.build(), Scripted(plan), GPU, capacity_bytes=8 * MiB, host=BLOCKING, evict="copy", check=True,
               timeline=True)
    comp = r["timeline"]["compute"]
    assert comp[3][1] - comp[2][1] == pytest.approx(CO + DI + RE + CO + D, rel=1e-12)
    assert r["faults"] == 6 and r["copy_in_gated"] == 2  # (the 6 faults are the warm-up's first touches)
    assert r["copy_in_stall_s"] == pytest.approx(CO + DI + RE + CO, rel=1e-12)


def test_mirror_memory_bound_falls_back_to_uvm_and_reclaims():
    """``mirror_bytes`` = 4 MiB (2 blocks): C's copy-out fills it. At L0 B needs 2 new mirrors and no mirrored block
    is on the GPU: B leaves by UVM (written back; the thread waits: e0 = 2 TD + d). C comes back by copy-in, so at
    L1 its mirrors belong to a block on the GPU: they are reclaimed and A is copied out."""
    r, (e0, e1, e2) = run(D, "copy:mirror_bytes=4MiB")
    assert e0 == pytest.approx(2 * TD + D, rel=1e-9)
    assert (r["mirror_full_evictions"], r["mirror_reclaims"], r["writebacks"], r["copy_evictions"]) == (2, 2, 2, 4)
    assert r["mirror_peak_bytes"] == 4 * MiB


def test_auto_takes_the_path_the_policy_names():
    """``auto``: the decision at L0 names UVM for B (``evict_path``), the others take the policy's default (COPY):
    B is written back and holds the thread (e0 = 2 TD + d); A leaves by the copy path inside L1."""
    plan = dict(PLAN)
    plan[3] = dec(evict=[2, 3], evict_path=[EvictPath.UVM, EvictPath.UVM], prefetch=[4, 5])
    r, (e0, e1, e2) = run(D, "auto", plan)
    assert e0 == pytest.approx(2 * TD + D, rel=1e-9) and e1 == pytest.approx(e0 + D, rel=1e-9)
    assert (r["writebacks"], r["copy_evictions"]) == (2, 4)
    plan[3] = dec(evict=[2, 3], evict_path=[EvictPath.UVM], prefetch=[4, 5])
    with pytest.raises(ConfigError, match="evict_path has 1 entries for 2 evict blocks"):
        run(D, "auto", plan)


def test_host_costs_of_the_copy_calls():
    """``copy_call_s`` 5 us per copy or repopulate call, ``copy_discard_call_s`` 8 us per discard call and
    ``copy_discard_block_s`` 6 us per discarded block: L0's decision issues 3 such calls (copy-out, repopulate,
    copy-in) and one discard of 2 blocks: 15 + 8 + 12 = 35 us; the host waited for the GPU at the iteration's end
    (``sync_iterations``), so the launch is issued at 35 us, e0 = 35 us + d;
    L1's 35 us fall inside L0. With ``discard_waits_for_copy`` the thread waits for each decision's copy-out: L0
    starts at CO, L1 at e0 + CO, and B (back at e0 + 2 CO + DI + RE + CO) is there before L1 ends: e2 = 3 d + 2 CO."""
    _, ends = run(D, "copy", host=HostModel(blocking_evict=True, copy_call_s=5e-6, copy_discard_call_s=8e-6,
                                            copy_discard_block_s=6e-6, sync_iterations=True))
    assert ends == pytest.approx([D + 35e-6, 2 * D + 35e-6, 3 * D + 35e-6], rel=1e-12)
    r, ends = run(D, "copy", host=HostModel(discard_waits_for_copy=True, sync_iterations=True))
    assert ends == pytest.approx([D + CO, 2 * D + 2 * CO, 3 * D + 2 * CO], rel=1e-12)
    assert r["host_blocked_s"] == pytest.approx(2 * CO + CO, rel=1e-12)  # (the warm-up's copy-out of C too)


def test_an_allocation_no_launch_touches_keeps_its_block_on_uvm():
    """Two 512 KiB tensors share one small-pool block: X, written by L0, and W, which no launch touches (a library
    workspace: only kernels the runtime does not see use it). Capacity 1 block: L1 (Y) needs the room, the driver
    evicts X's block. Under ``copy`` it is written back by UVM all the same; without W it is copied out. The kind
    knob (``ineligible=activation``) makes X's own block ineligible the same way."""
    def trace(with_w):
        b = TraceBuilder()
        x = b.alloc(512 * 1024, "activation")
        if with_w:
            b.alloc(512 * 1024, "other")
        y = b.alloc(2 * MiB, "param")
        b.launch("l0", [(x, 0, 512 * 1024, WRITE)], duration=D)
        b.launch("l1", [(y, 0, 2 * MiB, WRITE)], duration=D)
        return b.build()

    t = trace(True)
    lay = build_layout(t)
    assert lay.base[1] // (2 * MiB) == lay.base[0] // (2 * MiB)  # W shares X's block
    assert copy_eligible(t, lay).tolist() == [False, True]
    assert copy_eligible(t, lay, ("param",)).tolist() == [False, False]
    r = replay(t, "oracle", GPU, capacity_bytes=2 * MiB, evict="copy", check=True)
    assert (r["writebacks"], r["copy_evictions"], r["copy_ineligible_blocks"]) == (1, 0, 1)
    r = replay(trace(False), "oracle", GPU, capacity_bytes=2 * MiB, evict="copy", check=True)
    assert (r["writebacks"], r["copy_evictions"], r["copy_ineligible_blocks"]) == (0, 1, 0)
    r = replay(trace(False), "oracle", GPU, capacity_bytes=2 * MiB, evict="copy:ineligible=activation", check=True)
    assert (r["writebacks"], r["copy_evictions"]) == (1, 0)


def test_prefer_host_restores_the_mirror():
    """PREFER_HOST for C while C is only in its mirror: kernels will read the managed range on the host, so the
    mirror goes back into it (``mirror_restores``) and L1 reads C over the link: no copy-in, no fault, L1 takes
    d + 4 MiB / 50e9 (remote reads at the link's bandwidth)."""
    plan = {2: dec(evict=[4, 5])}

    class Far(Scripted):
        def on_launch(self, info, state):
            if info.index == 3:
                return Decision(advise=((np.array([4, 5]), Advice.PREFER_HOST),))
            return super().on_launch(info, state)

    b = TraceBuilder()
    a, bb, c = (b.alloc(4 * MiB, "activation") for _ in range(3))
    for name, x in (("w0", c), ("w1", a), ("w2", bb)):
        b.launch(name, [(x, 0, 4 * MiB, WRITE)], duration=D)
    b.launch("l0", [(c, 0, 4 * MiB, READ)], duration=D)
    r = replay(b.build(), Far(plan), GPU, capacity_bytes=8 * MiB, evict="copy", check=True, timeline=True)
    comp = r["timeline"]["compute"]
    assert comp[3][1] - comp[3][0] == pytest.approx(D + 4 * MiB / 50e9, rel=1e-12)
    assert r["mirror_restores"] == 2 and r["copy_in_bytes"] == 0 and r["copy_in_gated"] == 0


def test_remote_writes_at_their_own_bandwidth():
    """``remote_write_bw``: a PREFER_HOST block a launch writes costs 2 MiB / remote_write_bw; one it only reads
    2 MiB / remote_access_bw (else the link's). 0 (every profile's value) keeps the read bandwidth for both."""
    class Far(Policy):
        name = "far"

        def on_launch(self, info, state):
            return Decision(advise=((info.blocks, Advice.PREFER_HOST),))

    b = TraceBuilder()
    x, y = b.alloc(2 * MiB), b.alloc(2 * MiB)
    b.launch("k", [(x, 0, 2 * MiB, READ), (y, 0, 2 * MiB, WRITE)], duration=D)
    t = b.build()
    r = replay(t, Far(), GPU.with_overrides(remote_access_bw=20e9, remote_write_bw=5e9), capacity_bytes=4 * MiB)
    assert r["time_s"] == pytest.approx(D + 2 * MiB / 20e9 + 2 * MiB / 5e9, rel=1e-12)
    r = replay(t, Far(), GPU, capacity_bytes=4 * MiB)
    assert r["time_s"] == pytest.approx(D + 4 * MiB / 50e9, rel=1e-12)


def test_auto_is_uvm_without_a_copy_path_and_for_the_driver():
    """Where nothing can take the copy path, ``auto`` replays exactly as ``uvm``: on a profile without copy
    bandwidth, and under ``demand`` (the driver alone keeps UVM's eviction) on one with it."""
    t = training_trace(layers=4, param_bytes=4 << 20, act_bytes=4 << 20)
    skip = {"evict", "copy_path", "wall_s", "events_per_s", "block_accesses_per_s", "layout_s"}
    for gpu, pol in ((get_profile("h100-pcie-lit"), "oracle"), (GPU, "demand")):
        host = HostModel(blocking_evict=True, launch_s=5e-6, sync_iterations=True)
        u = replay(t, pol, gpu, oversub=2, host=host, evict="uvm")
        a = replay(t, pol, gpu, oversub=2, host=host, evict="auto")
        assert a["copy_path"] is (gpu is GPU) and a["evictions"] > 0
        assert {k: v for k, v in a.items() if k not in skip and not k.startswith(("copy_", "mirror_", "discard_c",
                "repopulate_", "discard_only"))} == {k: v for k, v in u.items() if k not in skip}


def test_bad_eviction_models_are_refused():
    with pytest.raises(ConfigError, match="has no copy path"):
        replay(training_trace(layers=2), "oracle", "h100-pcie-lit", oversub=2, evict="copy")
    for spec, msg in (("fast", "eviction mode 'fast' is unknown"), ("copy:mirror=1", "unknown parameter 'mirror'"),
                      ("copy:ineligible=weights", "ineligible kind"), ("copy:mirror_bytes=-3", "mirror_bytes")):
        with pytest.raises(ConfigError, match=msg):
            parse_evict(spec)
    assert parse_evict("auto:mirror_bytes=1GiB,ineligible=other+input") == EvictModel("auto", 1 << 30,
                                                                                      ("other", "input"))


def test_cli_evict_flag(tmp_path, capsys):
    p = tmp_path / "t.uvmt"
    save(training_trace(layers=4, param_bytes=4 << 20, act_bytes=4 << 20), p)
    assert main(["replay", str(p), "--oversub", "2", "--policy", "oracle", "--gpu", "h100-pcie-cal", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["evict"]["mode"] == "auto" and r["copy_path"] is True and r["copy_out_bytes"] > 0
    assert main(["replay", str(p), "--oversub", "2", "--policy", "oracle", "--gpu", "h100-pcie-cal"]) == 0
    assert "copy path  out" in capsys.readouterr().out
    assert main(["replay", str(p), "--oversub", "2", "--evict", "copy", "--gpu", "h100-pcie-lit"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--evict copy: the GPU profile h100-pcie-lit has no copy path" in err and len(err.splitlines()) == 1
    assert main(["replay", str(p), "--oversub", "2", "--evict", "quick"]) != 0
    assert "--evict 'quick'" in capsys.readouterr().err


def test_bench_setting_names_the_eviction_mode():
    from types import SimpleNamespace

    from uvmprefetch.cli.bench import setting
    a = SimpleNamespace(gpu="h100-pcie-cal", gpu_set=None, ssd=None, block_size="2MiB", writeback_clean=False,
                        discards=False, host="live-sync", own_links=False, traces=[], evict="auto")
    assert setting(a, 1, True, copy_path=True) == "h100-pcie no-discard host=live-sync evict=auto"
    assert setting(a, 1, True, copy_path=False) == "h100-pcie no-discard host=live-sync"
    a.evict = "uvm"
    assert setting(a, 1, True, copy_path=True) == "h100-pcie no-discard host=live-sync"
    a.host, a.discards, a.gpu = None, True, "h100-pcie"  # the defaults: the host model is named all the same
    assert setting(a, 1, True, copy_path=True) == "h100-pcie host=live"
    assert setting(a, 2, True, copy_path=True) == "h100-pcie host=free gpus=2"


class ChaosPaths(Chaos):
    """``Chaos`` that also names a random path for each eviction."""

    def on_launch(self, info, state):
        d = super().on_launch(info, state)
        d.evict_path = self.rng.integers(0, 3, d.evict.shape[0]).astype(np.int8)
        return d


@SETTINGS
@given(t=traces(), extra=st.integers(0, 6), seed=st.integers(0, 1000), mode=st.sampled_from(["copy", "auto"]),
       cap=st.sampled_from([0, 1, 3]), host=st.booleans(), bs=st.sampled_from([2 * MiB, 64 << 10]))
def test_invariants_with_the_copy_path(t, extra, seed, mode, cap, host, bs):
    """Capacity never exceeded with copy-outs in flight, mirrors counted and bounded, no mirror for a dead or
    written block, the room queue in order (all asserted inside the engine with ``check=True``)."""
    lay, w = widest(t, bs)
    spec = f"{mode}:mirror_bytes={cap * 2 * MiB}"
    for pol in ("demand", "oracle", ChaosPaths(seed)):
        r = replay(t, pol, GPU, capacity_bytes=(w + extra * (2 * MiB // bs)) * bs, layout=lay, check=True, evict=spec,
                   host=HostModel(blocking_evict=True, copy_call_s=1e-6, discard_waits_for_copy=True) if host else None)
        assert r["peak_used_blocks"] <= r["capacity_bytes"] // lay.block_size
        assert r["time_s"] >= r["ideal_s"] - 1e-12
        assert r["bytes_htod"] + r["remote_bytes"] >= r["cold_first_touch_bytes"]
        assert r["copy_out_bytes"] <= r["bytes_dtoh"] and r["copy_in_bytes"] <= r["bytes_htod"]
        assert cap == 0 or r["mirror_peak_bytes"] <= cap * 2 * MiB


@pytest.mark.slow
def test_gpt2_large_at_1_5x_the_copy_path_meets_the_target():
    """The issue's target: GPT-2 large (the standard trace) at 1.5x on ``h100-pcie`` with the runtime's threads as
    host model (``live``, which the copy path is built into; decisions at a fixed 200 us, the oracle's range on this
    machine, so the figure is reproducible) and no discards, steady state under ``auto`` <= 1.5 x ideal.

    The arithmetic (from the layout, so it holds for the trace as recorded): the last iteration touches W distinct
    blocks and at most C (the capacity) can be on the GPU when it starts, so at least (W - C) blocks must come in and
    as many leave. UVM's eviction writes each back in TD and holds the thread (the faithful model, without dirty
    tracking: ``writeback_clean``): the iteration takes at least (W - C) TD, more than 1.5 x its compute (1.8 x). The
    copy path moves the same blocks at 55 GB/s each way on separate engines: (W - C) * 2 MiB / 55e9 is under half
    the iteration's compute (0.37 s of 1.50 s), so with a policy that issues the moves ahead, they hide behind it.
    (The synchronous runtime, ``live-sync``, would add its 480 us of Python observation per launch on top.)"""
    from uvmprefetch.trace import load
    from uvmprefetch.trace.standard import standard_traces

    t = load(standard_traces(names=["gpt2-large"], progress=False)[0])
    lay = build_layout(t)
    host = "live:decision_s=200e-6"
    kw = dict(layout=lay, oversub=1.5, host=host, discards=False)
    last = np.flatnonzero(t.launch_iter == t.iterations - 1)
    W = np.unique(lay.blocks[lay.ptr[last[0]]:lay.ptr[last[-1] + 1]]).size
    uvm = replay(t, "oracle", GPU, evict="uvm", writeback_clean=True, **kw)
    C = uvm["capacity_bytes"] // (2 * MiB)
    ideal = uvm["ideal_iteration_times_s"][-1]
    assert W - C > 0.3 * C  # (9,704 blocks, 19 GiB each way, against C = 19,434)
    assert uvm["iteration_times_s"][-1] >= (W - C) * TD > 1.5 * ideal  # (2.73 s against 1.50 s)
    assert uvm["iteration_bytes_dtoh"][-1] >= (W - C) * 2 * MiB
    auto = replay(t, "oracle", GPU, evict="auto", **kw)
    assert (W - C) * 2 * MiB / 55e9 < 0.5 * ideal
    assert auto["iteration_bytes_dtoh"][-1] >= (W - C) * 2 * MiB and auto["writebacks"] == 0
    assert auto["steady_slowdown"] <= 1.5 < uvm["steady_slowdown"]
