"""Reference systems as policies (``vdnn``, ``capuchin``, ``sentinel``, ``autotm``, ``swapadvisor``) on the
shared hook interface.

GIVEN the synthetic training loop and the shipped small ResNet-50 trace WHEN each reference policy replays
it with the engine's invariants checked THEN capacity holds, at oversub 1.0 it is within the cold
first-touch cost of ideal (nothing is moved that need not be), and under oversubscription its steady
iteration beats ``demand`` where the paper's mechanism applies; bad parameters are refused by name."""

from pathlib import Path

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.policy import available, make_policy, policy_class
from uvmprefetch.policy._swapplan import IterationProfiler, gaps
from uvmprefetch.sim.layout import build_layout
from uvmprefetch.sim.replay import replay
from uvmprefetch.sim.synthetic import training_trace
from uvmprefetch.trace.format import load

REF = ("vdnn", "capuchin", "sentinel", "autotm", "swapadvisor")
OFFLINE = ("vdnn", "autotm", "swapadvisor")
SYN = training_trace(layers=6, param_bytes=6 << 20, act_bytes=4 << 20, iterations=3)
SYN_LAYOUT = build_layout(SYN)
RESNET = load(Path(__file__).resolve().parents[2] / "traces" / "resnet-50-b2i64.uvmt")
RESNET_LAYOUT = build_layout(RESNET)
_cache: dict = {}


def run(trace_name: str, spec: str, oversub: float) -> dict:
    key = (trace_name, spec, oversub)
    if key not in _cache:
        t, lay = (SYN, SYN_LAYOUT) if trace_name == "syn" else (RESNET, RESNET_LAYOUT)
        _cache[key] = replay(t, spec, "h100-pcie-lit", oversub=oversub, layout=lay, check=True)
    return _cache[key]


@pytest.mark.parametrize("name", REF)
def test_registered(name):
    assert name in available()
    cls = policy_class(name)
    assert cls.name == name and cls.description
    assert cls.offline == (name in OFFLINE)


@pytest.mark.parametrize("trace_name", ["syn", "resnet"])
@pytest.mark.parametrize("spec", list(REF) + ["capuchin:reprofile=never", "sentinel:reprofile=always"])
def test_oversub_one_is_ideal_within_cold_cost(trace_name, spec):
    r = run(trace_name, spec, 1.0)
    assert r["ideal_s"] - 1e-12 <= r["time_s"] <= r["ideal_s"] + r["cold_first_touch_s"] + 1e-12
    assert r["policy_evictions"] == 0


def test_vdnn_all_offloads_even_with_enough_memory():
    """vDNN_all offloads whatever the memory: at oversub 1 it costs time (the paper's overhead on CNNs),
    vDNN_dyn does not offload when everything fits."""
    r_all = run("resnet", "vdnn:mode=all", 1.0)
    r_dyn = run("resnet", "vdnn", 1.0)
    assert r_all["policy_report"]["mode"] == "all" and r_dyn["policy_report"]["mode"] == "none"
    assert r_all["policy_report"]["offloaded_blocks"] > 0
    assert r_all["steady_slowdown"] > 1.0 + 1e-6
    assert r_dyn["steady_slowdown"] == pytest.approx(1.0)


def test_vdnn_conv_offloads_a_subset_of_all():
    a = run("resnet", "vdnn:mode=all", 1.5)["policy_report"]
    c = run("resnet", "vdnn:mode=conv", 1.5)["policy_report"]
    assert 0 < c["offload_pairs"] < a["offload_pairs"]


@pytest.mark.parametrize("trace_name", ["syn", "resnet"])
@pytest.mark.parametrize("name", REF)
@pytest.mark.parametrize("oversub", [1.5])
def test_invariants_under_oversubscription(trace_name, name, oversub):
    r = run(trace_name, name, oversub)
    lay = SYN_LAYOUT if trace_name == "syn" else RESNET_LAYOUT
    assert r["peak_used_blocks"] <= r["capacity_bytes"] // lay.block_size
    assert r["time_s"] >= r["ideal_s"] - 1e-12
    assert r["bytes_htod"] + r["remote_bytes"] >= r["cold_first_touch_bytes"]
    assert len(r["iteration_times_s"]) == 3
    assert r["policy_report"]["planning_s"] < 20


# Where the mechanism applies (ResNet-50: activations kept from forward to backward, long weight reuse
# gaps): the steady iteration beats the driver alone. Measured at 1.5: demand 5.42; vdnn 4.86,
# capuchin 4.14, sentinel 5.20, autotm 3.43, swapadvisor 3.73 (oracle 3.16). Tolerance: at least 5 %
# faster than demand (sentinel: faster; its 8-launch migration intervals fit this small trace badly once
# the online profile sees the frees between iterations: 4.13 before, when it missed them), and not faster
# than the oracle.
@pytest.mark.parametrize("name", REF)
def test_steady_iteration_beats_demand_on_resnet(name):
    d = run("resnet", "demand", 1.5)["steady_slowdown"]
    r = run("resnet", name, 1.5)["steady_slowdown"]
    o = run("resnet", "oracle", 1.5)["steady_slowdown"]
    assert o <= r <= (0.99 if name == "sentinel" else 0.95) * d


@pytest.mark.parametrize("name", ["capuchin", "sentinel"])
def test_profiled_policies_do_nothing_in_the_profiled_iteration(name):
    """The first iteration is measured, not acted on: it runs exactly like the driver with free invalidation."""
    r = run("resnet", name, 1.5)
    base = replay(RESNET, "deepum:prefetch=false,pre_evict=false", "h100-pcie-lit", oversub=1.5, layout=RESNET_LAYOUT)
    assert r["iteration_times_s"][0] == pytest.approx(base["iteration_times_s"][0], rel=1e-9)
    assert r["policy_report"]["evicted_blocks"] > 0 and r["policy_report"]["prefetched_blocks"] > 0


@pytest.mark.parametrize("name", ["capuchin", "sentinel"])
def test_replan_only_when_the_iteration_changes(name):
    """The synthetic loop's first step creates gradients and Adam state (it differs), the next ones repeat:
    ``changed`` plans twice (step 0, step 1), ``always`` after every step, ``never`` once."""
    t = training_trace(layers=6, param_bytes=6 << 20, act_bytes=4 << 20, iterations=5)
    plans = {m: replay(t, f"{name}:reprofile={m}", "h100-pcie-lit", oversub=1.5, check=True)["policy_report"]["plans"]
             for m in ("never", "changed", "always")}
    assert plans == {"never": 1, "changed": 2, "always": 5}


def test_gaps_wrap_and_free():
    """Block 5 used at positions 0 and 2 of a 4-launch iteration: gaps 0->2 and 2->4 (wraps to the next
    iteration's 0); a free of 5 before position 3 makes the second gap dead from position 3."""
    prof = IterationProfiler()
    for blocks in ([5, 7], [7], [5], [7]):
        if len(prof._blocks) == 3:
            prof.free(np.array([5]))
        prof.launch(np.array(blocks, dtype=np.int64), 1e-3)
    g = gaps(prof.profile())
    five = g.blk == 5
    assert g.p[five].tolist() == [0, 2] and g.q[five].tolist() == [2, 4]
    assert g.dead_at[five].tolist() == [-1, 3]
    assert g.gap_s[five] == pytest.approx([1e-3, 1e-3])
    assert g.uses[five].tolist() == [2, 2]


def test_autotm_solves_its_program():
    """HiGHS finds the optimum well inside the time limit (no greedy fallback) and the plan moves data."""
    rep = run("resnet", "autotm", 1.5)["policy_report"]
    assert rep["plan_fallback"] is False and "Optimal" in rep["plan_status"]
    assert rep["plans"] == 3 and rep["planning_s"] < 20
    assert rep["plan_swapped_gaps"] > 0


def test_swapadvisor_search_keeps_its_best_and_is_deterministic():
    r1 = run("resnet", "swapadvisor:generations=30", 1.5)
    rep = r1["policy_report"]
    assert rep["plan_best_fitness"] <= rep["plan_seed_fitness"]
    assert rep["plan_generations"] == 30
    r2 = replay(RESNET, "swapadvisor:generations=30", "h100-pcie-lit", oversub=1.5, layout=RESNET_LAYOUT)
    assert r2["time_s"] == r1["time_s"]


@pytest.mark.parametrize("spec,param", [
    ("autotm:time_limit_s=0", "time_limit_s"),
    ("autotm:mip_gap=1", "mip_gap"),
    ("swapadvisor:population=1", "population"),
    ("swapadvisor:mutation=2", "mutation"),
    ("swapadvisor:volume_weight=-1", "volume_weight"),
    ("vdnn:mode=fast", "mode"),
    ("capuchin:lead_s=-1", "lead_s"),
    ("capuchin:headroom=-2", "headroom"),
    ("capuchin:profile_iter=-1", "profile_iter"),
    ("capuchin:reprofile=sometimes", "reprofile"),
    ("capuchin:lead_blocks=-1", "lead_blocks"),
    ("sentinel:interval=0", "interval"),
    ("sentinel:max_uses=-1", "max_uses"),
    ("sentinel:short_s=-0.5", "short_s"),
    ("sentinel:windowz=3", "windowz"),
])
def test_bad_params_name_the_parameter(spec, param):
    with pytest.raises(ConfigError, match=param):
        make_policy(spec)


@pytest.mark.parametrize("name", OFFLINE)
def test_offline_policies_need_the_trace(name):
    from uvmprefetch.gpus import get_profile
    from uvmprefetch.policy.base import PolicyContext
    p = make_policy(name)
    with pytest.raises(ConfigError, match=name):
        p.on_start(PolicyContext(block_size=2 << 20, capacity_blocks=10, max_blocks=10, gpu=get_profile("h100-pcie-lit")))


@pytest.mark.parametrize("name", ("capuchin", "sentinel", "tmof"))
def test_online_profile_keeps_frees_between_iterations(name):
    """Data freed after one iteration's last launch and before the next one's first (PyTorch frees gradients
    and temporaries there) is dead from position 0 in the online profile, as in the offline one: the frees
    reach ``on_free`` before the new iteration's first ``on_launch``."""
    from uvmprefetch.policy._swapplan import iteration_profiles
    from uvmprefetch.trace import READ, WRITE, TraceBuilder

    b = TraceBuilder()
    w = b.alloc(2 << 20, "param")
    for k in range(3):
        tmp = b.alloc(2 << 20, "activation")
        b.launch("a", [(tmp, 0, 2 << 20, WRITE), (w, 0, 2 << 20, READ)], duration=1e-3, iteration=k)
        b.launch("b", [(w, 0, 2 << 20, READ)], duration=1e-3, iteration=k)
        b.free(tmp)  # after the iteration's last launch
    t = b.build()
    seen = []
    pol = make_policy(f"{name}:reprofile=always")
    orig = pol._priority

    def spy(g, prof):
        seen.append(int(prof.free_blk.size))
        return orig(g, prof)

    pol._priority = spy
    replay(t, pol, "h100-pcie-lit", oversub=1.0, check=True)
    offline = [int(p.free_blk.size) for p in iteration_profiles(t, build_layout(t)).values()]
    assert offline[1:] == [1, 1]
    assert seen == offline
