"""The SSD tier (docs/tiers.md): golden micro-traces, tier-off equality, the g10 / flashneuron policies, errors.

Golden notation as in ``test_sim_golden.py`` (h100-pcie-lit, 2 MiB blocks): ``d`` the launch duration, ``lat`` =
45 us per fault batch, ``T`` one prefetched block over the link, ``Td`` one block D2H, ``Tf`` one faulted
block (32 x 64 KiB pieces). The SSD tier of these tests: read ``R`` = 2 MiB / 7e9 B/s, write ``W`` = 2 MiB /
5e9 B/s, ``s`` = 50 us per request batch. The model (docs/tiers.md): GPU -> SSD is the D2H link then the SSD
write (store-and-forward per block), the GPU room is free when the write ends; SSD -> GPU is the SSD read
then the link; the SSD is one FIFO queue; host memory holds evicted data up to ``host_capacity_bytes`` (a
value under one block = no room at all), the rest goes to the SSD.
"""

import argparse
import math

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.gpus import SSD_PRESETS, get_profile
from uvmprefetch.policy import make_policy
from uvmprefetch.policy.base import Decision, Policy
from uvmprefetch.sim.replay import replay
from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace import READ, WRITE, TraceBuilder
from uvmprefetch.trace.format import load

MiB = 1 << 20
GPU = get_profile("h100-pcie-lit")
A = 52e9
LAT = 45e-6
D = 1e-3
SSD = dict(ssd_bw=7e9, ssd_write_bw=5e9, ssd_latency_s=50e-6)
R = 2 * MiB / 7e9
W = 2 * MiB / 5e9
S = 50e-6


def bw(n):
    return A * 2 / math.pi * math.atan(0.0729 * n / 1024)


T = 2 * MiB / bw(2 * MiB)
TD = T
TF = 32 * (64 * 1024) / bw(64 * 1024)


class Quiet(Policy):
    name = "quiet"


class Scripted(Policy):
    """Returns the Decision given for a launch index."""
    name = "scripted"

    def __init__(self, plan):
        super().__init__()
        self.plan = plan

    def on_launch(self, info, state):
        return self.plan.get(info.index)


def abc_a(d=D):
    """A, B, C one block each (blocks 0, 1, 2). L0 writes A, L1 reads B, L2 reads C, L3 reads A."""
    b = TraceBuilder()
    a, bb, c = (b.alloc(2 * MiB, "activation") for _ in range(3))
    b.launch("l0", [(a, 0, 2 * MiB, WRITE)], duration=d)
    b.launch("l1", [(bb, 0, 2 * MiB, READ)], duration=d)
    b.launch("l2", [(c, 0, 2 * MiB, READ)], duration=d)
    b.launch("l3", [(a, 0, 2 * MiB, READ)], duration=d)
    return b.build()


def test_driver_eviction_spills_to_ssd_and_faults_back():
    """Capacity 2 blocks, no host room (host_capacity_bytes = 1 byte), no decisions.

    end0 = lat + Tf + d (A faults);  end1 = end0 + lat + Tf + d (B).
    L2: C needs room; the driver evicts A (least recently migrated, dirty). No host room: A crosses the link
    (D2H, end1 .. end1 + Td) and is written to the SSD, which starts at end1 + s:
        w_end = max(end1 + s, end1 + Td) + W     (A's room is free then)
    C's fault batch ends at end1 + lat; its copy waits for the room: end2 = max(end1 + lat, w_end) + Tf + d.
    L3: A is needed; the driver evicts B (clean: dropped). A is read from the SSD (queue free since w_end <
    end2): ready = end2 + s + R; its faulted copy starts at max(end2 + lat, ready) = ready:
        end3 = end2 + s + R + Tf + d.
    4 faults (8 MiB over the link H2D), 2 MiB D2H = the 2 MiB to the SSD, 2 MiB from the SSD.
    """
    gpu = GPU.with_overrides(**SSD, host_capacity_bytes=1)
    r = replay(abc_a(), Quiet(), gpu, capacity_bytes=4 * MiB, check=True)
    end0 = LAT + TF + D
    end1 = end0 + LAT + TF + D
    w_end = max(end1 + S, end1 + TD) + W
    end2 = max(end1 + LAT, w_end) + TF + D
    assert S + R > LAT
    end3 = end2 + S + R + TF + D
    assert r["time_s"] == pytest.approx(end3, rel=1e-12)
    assert r["faults"] == 4 and r["bytes_htod"] == 8 * MiB and r["bytes_dtoh"] == 2 * MiB
    assert r["bytes_to_ssd"] == 2 * MiB and r["bytes_from_ssd"] == 2 * MiB
    assert r["writebacks"] == 1 and r["drops"] == 1  # A written to the SSD at L2, B dropped at L3
    assert r["ssd_busy_s"] == pytest.approx(S + W + S + R, rel=1e-12)
    assert r["host_capacity_blocks"] == 0 and r["peak_host_blocks"] == 0


def test_policy_evict_ssd_and_prefetch_back():
    """Capacity 4 blocks (no driver eviction), unlimited host; d = 0.1 ms so that A's return is late.

    L0: A faults: end0 = lat + Tf + d.
    L1: Decision(evict_ssd=[A]): A (dirty) crosses the link from end0 (D2H ends end0 + Td) and is written to
        the SSD: we = max(end0 + s, end0 + Td) + W. B faults: end1 = end0 + lat + Tf + d.
    L2: Decision(prefetch=[A]): the SSD read waits for the queue (A's write):
        ready = max(we, end1) + s + R; the link copy follows: arrive = max(end1, ready) + T.
        C faults at L2; faults go ahead of queued prefetches: A's arrival slips by Tf.
        end2 = end1 + lat + Tf + d.
    L3: reads A: start3 = max(end2, arrive + Tf); end3 = start3 + d.
    """
    d = 1e-4
    gpu = GPU.with_overrides(**SSD)
    pol = Scripted({1: Decision(evict_ssd=np.array([0])), 2: Decision(prefetch=np.array([0]))})
    r = replay(abc_a(d), pol, gpu, capacity_bytes=8 * MiB, check=True)
    end0 = LAT + TF + d
    we = max(end0 + S, end0 + TD) + W
    end1 = end0 + LAT + TF + d
    ready = max(we, end1) + S + R
    arrive = max(end1, ready) + T + TF
    end2 = end1 + LAT + TF + d
    start3 = max(end2, arrive)
    assert arrive > end2  # the SSD round trip is not hidden: a late prefetch
    assert r["time_s"] == pytest.approx(start3 + d, rel=1e-12)
    assert r["faults"] == 3 and r["late_blocks"] == 1
    assert r["bytes_to_ssd"] == 2 * MiB and r["bytes_from_ssd"] == 2 * MiB and r["bytes_dtoh"] == 2 * MiB
    assert r["bytes_htod"] == 8 * MiB and r["policy_evictions"] == 1


def test_host_room_first_then_ssd():
    """Capacity 1 block, host room for 1 block: every launch evicts the previous, dirty block. L0 writes A,
    L1 writes B (A -> host: the room is there), L2 writes C (B -> SSD: host full), L3 reads A (C -> SSD;
    A comes from host memory: no SSD read). 2 blocks to the SSD, none from it; peak host occupancy 1."""
    b = TraceBuilder()
    a, bb, c = (b.alloc(2 * MiB, "activation") for _ in range(3))
    for x in (a, bb, c):
        b.launch("w", [(x, 0, 2 * MiB, WRITE)], duration=D)
    b.launch("r", [(a, 0, 2 * MiB, READ)], duration=D)
    gpu = GPU.with_overrides(**SSD, host_capacity_bytes=2 * MiB)
    r = replay(b.build(), Quiet(), gpu, capacity_bytes=2 * MiB, check=True)
    assert r["bytes_to_ssd"] == 4 * MiB and r["bytes_from_ssd"] == 0 and r["bytes_dtoh"] == 6 * MiB
    assert r["peak_host_blocks"] == 1 and r["host_capacity_blocks"] == 1


# Figures of the engine before the SSD tier existed (h100-pcie-lit, 2 MiB blocks unless noted), captured
# with replay(t, policy, "h100-pcie-lit", oversub=1.5): the tier-off engine must reproduce them exactly. The oracle
# rows run the oracle as it was then (refetch and stall_aware came later: tests/unit/test_oracle.py). The deepum
# rows are of the deepum that treats a block a launch uses as live again (docs/reference-systems.md); they pin the
# engine with that deepum, not the pre-tier one.
BEFORE = {
    ("gpt2-small-b2s128", "demand", 1.5, 2 * MiB): (0.3081530314566884, 4818, 10104078336, 7486832640, [0.12611570330951144, 0.09067220154164818, 0.09136512660552876]),
    ("gpt2-small-b2s128", "oracle:refetch=false,stall_aware=false", 1.5, 2 * MiB): (0.18627840017381234, 0, 7337934848, 5486149632, [0.08449615777979085, 0.050789864825500644, 0.05099237756852085]),
    ("gpt2-small-b2s128", "deepum", 1.5, 2 * MiB): (0.2956914686930281, 3880, 10053746688, 7077888000, [0.12611570330951144, 0.07996949668105494, 0.08960626870246172]),
    ("resnet-50-b2i64", "demand", 1.5, 2 * MiB): (0.06380007830494187, 936, 1962934272, 1346371584, [0.031239153850665308, 0.014988609361115651, 0.017572315093160915]),
    ("resnet-50-b2i64", "oracle:refetch=false,stall_aware=false", 1.5, 2 * MiB): (0.03825759786831715, 0, 1434451968, 1214251008, [0.017740124316602768, 0.010278988050159345, 0.010238485501555039]),
    ("resnet-50-b2i64", "deepum", 1.5, 2 * MiB): (0.06544084280445325, 795, 2214592512, 1482686464, [0.031239153850665308, 0.015937906602533407, 0.01826378235125454]),
    ("resnet-50-b2i64", "oracle:refetch=false,stall_aware=false", 1.5, 64 << 10): (0.03215051811513647, 0, 1096810496, 853671936, [0.013658373009911821, 0.009246724923546579, 0.009245420181678073]),
}


@pytest.fixture(scope="module")
def shipped():
    return {n: load(f"traces/{n}.uvmt") for n in ("gpt2-small-b2s128", "resnet-50-b2i64")}


@pytest.mark.parametrize("key", list(BEFORE), ids=lambda k: f"{k[0]}-{k[1]}-{k[3]}")
def test_tier_off_is_bit_identical_to_the_old_engine(shipped, key):
    name, pol, oversub, bs = key
    r = replay(shipped[name], pol, "h100-pcie-lit", oversub=oversub, block_size=bs)
    assert (r["time_s"], r["faults"], r["bytes_htod"], r["bytes_dtoh"], r["iteration_times_s"]) == BEFORE[key]
    assert "bytes_to_ssd" not in r  # tier-off results have no SSD fields


@pytest.mark.parametrize("pol", ["demand", "oracle", "uvmprefetch"])
def test_tier_on_with_unlimited_host_changes_nothing(pol):
    """With unlimited host memory nothing goes to the SSD unless a policy asks: same times as tier off."""
    t = training_trace(layers=6, iterations=2)
    off = replay(t, pol, GPU, oversub=2)
    on = replay(t, pol, GPU.with_overrides(**SSD), oversub=2, check=True)
    assert on["time_s"] == off["time_s"] and on["iteration_times_s"] == off["iteration_times_s"]
    assert on["bytes_to_ssd"] == 0 and on["bytes_from_ssd"] == 0


def small_host(t, oversub, frac=0.25, bs=2 * MiB):
    """A host capacity of ``frac`` of what the GPU cannot hold (so that the SSD tier matters)."""
    from uvmprefetch.sim.layout import build_layout
    lay = build_layout(t, bs)
    off = lay.footprint_blocks - math.ceil(lay.footprint_blocks / oversub)
    return GPU.with_overrides(**SSD, host_capacity_bytes=max(1, int(frac * off)) * bs)


@pytest.mark.parametrize("pol", ["g10", "flashneuron:keep_last=4,lookahead=2", "demand", "oracle"])
@pytest.mark.parametrize("oversub", [1.5, 3])
def test_policies_keep_the_invariants_on_a_synthetic_trace(pol, oversub):
    t = training_trace(layers=8, iterations=3)
    r = replay(t, pol, small_host(t, oversub), oversub=oversub, check=True)
    assert r["time_s"] >= r["ideal_s"] and len(r["iteration_times_s"]) == 3
    if pol.startswith("flashneuron"):
        assert r["bytes_to_ssd"] > 0 and r["policy_report"]["offloads"] > 0
    if pol == "g10":
        rep = r["policy_report"]
        assert rep["planning_s"] >= 0 and rep["periods_chosen"] > 0 and rep["prefetch"] > 0


@pytest.mark.parametrize("pol", ["g10", "flashneuron"])
def test_policies_on_a_shipped_trace(shipped, pol):
    t = shipped["resnet-50-b2i64"]
    r = replay(t, pol, small_host(t, 1.5), oversub=1.5, check=True)
    assert r["time_s"] >= r["ideal_s"] and r["bytes_to_ssd"] > 0
    if pol == "g10":
        assert r["policy_report"]["planning_s"] > 0


def test_g10_without_ssd_tier_plans_over_host_only(shipped):
    r = replay(shipped["resnet-50-b2i64"], "g10", GPU, oversub=1.5, check=True)
    assert r["policy_report"]["periods_to_ssd"] == 0 and "bytes_to_ssd" not in r
    assert r["time_s"] < BEFORE[("resnet-50-b2i64", "demand", 1.5, 2 * MiB)][0]  # better than demand paging


def test_flashneuron_needs_the_ssd_tier():
    """With require_ssd a profile without the tier is an error naming the fields; by default FlashNeuron falls
    back to host memory (every registered policy runs on every profile) and reports it."""
    t = training_trace(layers=4, iterations=2)
    with pytest.raises(ConfigError, match="ssd_bw .and optionally ssd_write_bw, ssd_latency_s, host_capacity_bytes"):
        replay(t, "flashneuron:require_ssd=true", GPU, oversub=1.5)
    r = replay(t, "flashneuron:keep_last=4,lookahead=2", GPU, oversub=1.5, check=True)
    assert r["policy_report"]["tier"] == "host" and r["policy_report"]["offloads"] > 0


def test_evict_ssd_without_the_tier_is_a_config_error():
    pol = Scripted({1: Decision(evict_ssd=np.array([0]))})
    with pytest.raises(ConfigError, match="evict_ssd needs the SSD tier"):
        replay(abc_a(), pol, GPU, capacity_bytes=8 * MiB)


@pytest.mark.parametrize("over, msg", [
    (dict(ssd_bw=-1.0), "ssd_bw must be"),
    (dict(ssd_bw=float("nan")), "ssd_bw must be"),
    (dict(host_capacity_bytes=1 << 30), "host_capacity_bytes set but ssd_bw is 0"),
    (dict(ssd_latency_s=1e-5, ssd_write_bw=1e9), "ssd_write_bw, ssd_latency_s set but ssd_bw is 0"),
    (dict(ssd_bw=7e9, ssd_latency_s=-1e-6), "ssd_latency_s must be"),
])
def test_bad_ssd_profiles(over, msg):
    with pytest.raises(ConfigError, match=msg):
        GPU.with_overrides(**over)


def test_bad_policy_parameters():
    with pytest.raises(ConfigError, match="headroom"):
        make_policy("g10:headroom=1.5")
    with pytest.raises(ConfigError, match="lookahead"):
        make_policy("flashneuron:lookahead=0")


def test_cli_ssd_preset():
    from uvmprefetch.cli.replay import gpu_from_args
    ns = argparse.Namespace(gpu="h100-pcie-lit", gpu_set=["host_capacity_bytes=1073741824"], ssd="pcie4-nvme")
    g = gpu_from_args(ns)
    assert g.ssd_bw == SSD_PRESETS["pcie4-nvme"]["ssd_bw"] and g.host_capacity_bytes == 1 << 30 and g.ssd_tier
    with pytest.raises(ConfigError, match="unknown SSD preset"):
        gpu_from_args(argparse.Namespace(gpu="h100-pcie-lit", gpu_set=None, ssd="floppy"))


def test_cli_replay_with_the_ssd_tier(tmp_path, capsys):
    import json

    from uvmprefetch.cli import main
    from uvmprefetch.trace import save
    p = tmp_path / "syn.uvmt"
    save(training_trace(layers=4, param_bytes=4 << 20, act_bytes=4 << 20), p)
    assert main(["replay", str(p), "--oversub", "2", "--policy", "g10", "--ssd", "pcie4-nvme",
                 "--gpu-set", "host_capacity_bytes=4194304", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["policy"] == "g10" and "bytes_to_ssd" in r and r["host_capacity_blocks"] == 2


def test_host_to_ssd_waits_for_the_write_back():
    """``evict`` then ``evict_ssd`` of the same dirty block in one Decision: the block is written back to host
    memory (D2H, Td) and then moved host -> SSD; the SSD write cannot start before the data is in host
    memory, so (with no SSD latency) the run is timed exactly like the direct GPU -> SSD path, whose SSD write
    follows the same D2H copy (``test_policy_evict_ssd_and_prefetch_back``)."""
    d = 1e-4
    gpu = GPU.with_overrides(**dict(SSD, ssd_latency_s=0.0))
    direct = Scripted({1: Decision(evict_ssd=np.array([0])), 2: Decision(prefetch=np.array([0]))})
    via_host = Scripted({1: Decision(evict=np.array([0]), evict_ssd=np.array([0])), 2: Decision(prefetch=np.array([0]))})
    a = replay(abc_a(d), direct, gpu, capacity_bytes=8 * MiB, check=True)
    b = replay(abc_a(d), via_host, gpu, capacity_bytes=8 * MiB, check=True)
    assert b["host_to_ssd_bytes"] == 2 * MiB and a["host_to_ssd_bytes"] == 0
    assert b["bytes_from_ssd"] == 2 * MiB and b["late_blocks"] == 1
    assert b["time_s"] == pytest.approx(a["time_s"], rel=1e-12)


def test_g10_infinite_lead_is_a_config_error():
    """An infinite ``lead_s`` used to reach the pacing arithmetic (OverflowError in int()) mid-replay."""
    with pytest.raises(ConfigError, match="lead_s"):
        make_policy("g10:lead_s=inf")
