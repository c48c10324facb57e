"""The calibrated profile (``h100-pcie-cal``) against the H100 measurement it was fitted to
(``bench/results/calibrate.json``): the simulator's own fault and link formulas must reproduce the measured
times within the tolerances its comment in ``uvmprefetch/gpus.py`` states."""

import json
import sys
from pathlib import Path

from uvmprefetch.gpus import PROFILES

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))


def measured():
    return json.loads((REPO / "bench" / "results" / "calibrate.json").read_text())


def test_fault_model_fits_the_measured_touches():
    from calibrate import fault_model
    g = PROFILES["h100-pcie-cal"]
    cal = measured()
    raw = cal["raw"]
    assert "H100" in cal["env"]["device"] and not cal["env"]["dry_run"]
    for pattern, tol in (("full", 0.18), ("sparse", 0.15)):
        for nb, t_fault, t_resident in raw["touch"][pattern]:
            batches, link = fault_model(nb, pattern, g.link_htod_bw, g.fault_batch_size)
            pred, y = batches * g.fault_batch_latency_s + link, t_fault - t_resident
            assert abs(pred - y) / y <= tol, (pattern, nb, pred, y)


def test_eviction_and_large_prefetch_bandwidths_fit():
    g = PROFILES["h100-pcie-cal"]
    raw = measured()["raw"]
    for n, t in raw["prefetch"]["dtoh"]:
        if n >= 2 << 20:  # the eviction path: blocks of 2 MiB and up
            assert abs(g.transfer_time(n, "dtoh") - t) / t <= 0.35, n
    for n, t in raw["prefetch"]["htod"]:
        if n >= 128 << 20:  # large prefetches; small ones carry ~60 us per call that the profile leaves out
            assert abs(g.transfer_time(n, "htod") - t) / t <= 0.05, n
    # the point of the calibration: faults and evictions are far dearer than the literature profile says
    lit = PROFILES["h100-pcie"]
    assert g.transfer_time(2 << 20, "dtoh") > 5 * lit.transfer_time(2 << 20, "dtoh")
