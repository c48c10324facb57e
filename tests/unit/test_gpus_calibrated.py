"""The calibrated profiles (``h100-pcie``, ``h200``; the default names) against the measurements they were fitted to
(``tests/data/calibrate-h100.json`` and ``tests/data/calibrate-h200.json``, ``bench/gpu/calibrate.py`` on each
card): the simulator's own fault and link formulas must reproduce the measured times within the tolerances
their comments in ``uvmprefetch/gpus.py`` state."""

import json
import sys
from pathlib import Path

import pytest

from uvmprefetch.gpus import PROFILES

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))

# profile, measurement, device name, tolerance of the fault model (dense, sparse touch), of the eviction bandwidth
CASES = [
    ("h100-pcie", "tests/data/calibrate-h100.json", "H100", (0.18, 0.15), 0.35),
    ("h200", "tests/data/calibrate-h200.json", "H200", (0.25, 0.25), 0.26),
]


def measured(path: str, device: str) -> dict:
    cal = json.loads((REPO / path).read_text())
    assert device in cal["env"]["device"] and not cal["env"]["dry_run"]
    return cal["raw"]


@pytest.mark.parametrize("name,path,device,fault_tol,_", CASES)
def test_fault_model_fits_the_measured_touches(name, path, device, fault_tol, _):
    from calibrate import fault_model
    g = PROFILES[name]
    raw = measured(path, device)
    for pattern, tol in zip(("full", "sparse"), fault_tol):
        for nb, t_fault, t_resident in raw["touch"][pattern]:
            batches, link = fault_model(nb, pattern, g.link_htod_bw, g.fault_batch_size)
            pred, y = batches * g.fault_batch_latency_s + link, t_fault - t_resident
            assert abs(pred - y) / y <= tol, (pattern, nb, pred, y)


@pytest.mark.parametrize("name,path,device,_,evict_tol", CASES)
def test_eviction_and_large_prefetch_bandwidths_fit(name, path, device, _, evict_tol):
    g = PROFILES[name]
    raw = measured(path, device)
    for n, t in raw["prefetch"]["dtoh"]:
        if n >= 2 << 20:  # the eviction path: blocks of 2 MiB and up
            assert abs(g.transfer_time(n, "dtoh") - t) / t <= evict_tol, n
    for n, t in raw["prefetch"]["htod"]:
        if n >= 128 << 20:  # large prefetches; small ones carry ~60 us per call that the profile leaves out
            assert abs(g.transfer_time(n, "htod") - t) / t <= 0.05, n
    # the point of the calibration: faults and evictions are far dearer than the literature profile says
    lit = PROFILES[f"{name}-lit"]
    assert g.transfer_time(2 << 20, "dtoh") > 5 * lit.transfer_time(2 << 20, "dtoh")


def test_plain_names_are_calibrated_and_lit_names_the_literature():
    """GIVEN the profile table WHEN a card was measured THEN its plain name carries the measurement and NAME-lit the
    literature's numbers with the same compute; the earlier ``-cal`` names still resolve to the plain ones."""
    from uvmprefetch.gpus import DEFAULT_GPU, get_profile
    assert DEFAULT_GPU == "h100-pcie" and PROFILES[DEFAULT_GPU].calibrated
    for name in ("h100-pcie", "h100-sxm", "h200"):
        cal, lit = PROFILES[name], PROFILES[f"{name}-lit"]
        assert cal.calibrated and not lit.calibrated
        assert (cal.flops, cal.hbm_bw, cal.memory_bytes) == (lit.flops, lit.hbm_bw, lit.memory_bytes)
        assert (lit.fault_batch_latency_s, lit.fault_batch_size, lit.copy_dtoh_bw) == (45e-6, 256, 0.0)
        assert get_profile(f"{name}-cal") is cal
    for name in ("a100-pcie", "v100-pcie", "gh200-c2c"):  # not measured: literature under both names
        assert not PROFILES[name].calibrated
        assert PROFILES[name] == PROFILES[f"{name}-lit"].with_overrides(name=name)


def test_the_lit_profile_replays_exactly_as_the_literature_default_did():
    """GIVEN the shipped trace WHEN it is replayed on ``h100-pcie-lit`` with no host model THEN every figure is what
    the literature profile gave when it was the default ``h100-pcie`` (its definition, written out here: datasheet
    compute, 52 GB/s both ways, 45 us per 256-entry fault batch, no copy path), for every baseline policy; and the
    calibrated default does differ. (``bench/baselines/replay.json`` keeps that run's tables under
    ``h100-pcie-lit host=free``.)"""
    import dataclasses

    from uvmprefetch.gpus import GB, GiB, TFLOPS, GpuProfile
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.format import load
    old = GpuProfile(name="h100-pcie", memory_bytes=80 * GiB, hbm_bw=2.0e12,
                     flops={"fp32": 51 * TFLOPS, "tf32": 378 * TFLOPS, "bf16": 756 * TFLOPS, "fp16": 756 * TFLOPS},
                     link_htod_bw=52 * GB, link_dtoh_bw=52 * GB)
    lit = PROFILES["h100-pcie-lit"]
    skip = {"name", "sources"}
    assert {f.name: getattr(lit, f.name) for f in dataclasses.fields(lit) if f.name not in skip} == \
        {f.name: getattr(old, f.name) for f in dataclasses.fields(old) if f.name not in skip}
    (path,) = sorted((REPO / "traces").glob("*.uvmt"))[:1]
    t = load(path)
    keys = ("time_s", "faults", "bytes_htod", "bytes_dtoh", "iteration_times_s", "prefetch_issued_bytes")
    for pol in ("demand", "oracle", "deepum", "uvmprefetch"):
        a = replay(t, pol, lit, oversub=1.5, evict="auto")
        b = replay(t, pol, old, oversub=1.5, evict="auto")
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, pol
    cal = replay(t, "demand", "h100-pcie", oversub=1.5)
    assert cal["time_s"] > 1.5 * replay(t, "demand", lit, oversub=1.5)["time_s"]
