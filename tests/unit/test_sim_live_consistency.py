"""The simulator's replay of a live dryrun trace reproduces the live run (docs/simulator.md "Footprint").

A tiny GPT-2 trains under ``UVMPREFETCH=1`` with the dryrun backend, a 24 MiB budget, a trace and a report; the
trace is replayed at the report's capacity with the same policy and GPU. Both sides drive the same
``GpuModel`` with the same launches and the same recorded durations (same GPU: no roofline re-estimate), and
the replay's default allocator for a dryrun trace is the runtime's own first-fit address space, so the two
must agree to float rounding: the tolerances below are exact for integers (blocks, bytes, faults) and 1e-9
relative for seconds (sums of the same float durations in the same order; any real divergence, e.g. one
block placed elsewhere, moves the time by at least one fault batch, ~1e-5 s on a ~1e-2 s run).
"""

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from uvmprefetch.errors import SimError, UvmPrefetchError
from uvmprefetch.sim.layout import _FirstFit, build_layout
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace import load

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt2.py"
BUDGET = 24 << 20  # the example's peak managed address space is ~41 MiB: oversubscribed ~1.7x


@pytest.fixture(scope="module", params=["demand", "uvmprefetch"])
def live(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"live-{request.param}")
    report, trace = tmp / "report.json", tmp / "run.uvmt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", UVMPREFETCH="1", UVMPREFETCH_BACKEND="dryrun",
               UVMPREFETCH_BUDGET=str(BUDGET), UVMPREFETCH_POLICY=request.param, UVMPREFETCH_REPORT=str(report),
               UVMPREFETCH_TRACE=str(trace))
    r = subprocess.run([sys.executable, str(EXAMPLE), "--iters", "3"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(report.read_text())
    assert rep["policy"] == request.param and rep["errors"] == [] and not rep["degraded"]
    t = load(trace)
    res = replay(t, rep["policy"], gpu=rep["gpu"], capacity_bytes=rep["capacity_bytes"],
                 discards=rep["backend_result"]["discards_issued"])
    return rep, t, res


def test_same_footprint_and_oversubscription(live):
    rep, t, res = live
    be = rep["backend_result"]
    bs = rep["block_size"]
    assert res["allocator"] == "first-fit"  # chosen for a dryrun trace
    # the same address space: the replay's allocator high-water mark is the live one, byte for byte
    assert res["reserved_bytes"] == rep["peak_managed_bytes"]
    # the same footprint definition on both sides: distinct blocks launches touched / whole capacity blocks
    assert res["footprint_bytes"] == be["footprint_bytes"]
    assert res["capacity_bytes"] == rep["capacity_bytes"] // bs * bs
    assert res["oversub"] == pytest.approx(be["oversub"], rel=1e-12)
    assert res["oversub"] > 1.2  # the case is really oversubscribed
    # footprint vs peak managed bytes: whole blocks, never more than the address space rounded up
    assert res["footprint_bytes"] <= math.ceil(rep["peak_managed_bytes"] / bs) * bs


def test_same_modelled_time_and_traffic(live):
    rep, t, res = live
    be = rep["backend_result"]
    assert res["compute_s"] == pytest.approx(be["compute_s"], rel=1e-9)  # same durations: no compute gap
    assert res["ideal_s"] == pytest.approx(float(np.sum(t.launch_dur)), rel=1e-9)
    assert res["time_s"] == pytest.approx(rep["model_time_s"], rel=1e-9)
    assert res["iteration_times_s"] == pytest.approx(rep["model_iter_s"], rel=1e-9)
    for k in ("faults", "bytes_htod", "bytes_dtoh", "evictions", "prefetch_issued_bytes", "prefetch_useful_bytes"):
        assert res[k] == be[k], k
    assert res["faults"] + res["prefetch_useful_bytes"] > 0 and res["bytes_dtoh"] > 0  # blocks really moved


def test_caching_model_is_a_different_allocator(live):
    """The caching-allocator model stays available for a live trace (it is what a real GPU's PyTorch would do,
    modelled); it places tensors elsewhere, so its figures are not the live run's (that is why auto = first-fit)."""
    rep, t, _ = live
    lay = build_layout(t, allocator="caching")
    assert lay.allocator == "caching"
    ff = build_layout(t)
    assert ff.allocator == "first-fit" and ff.reserved_bytes == rep["peak_managed_bytes"]
    assert not np.array_equal(lay.base, ff.base)


def test_first_fit_model_is_the_runtimes_virtual_layout():
    from uvmprefetch.runtime.observe import ALIGN, VirtualLayout
    rng = random.Random(7)
    ours, theirs = _FirstFit(), VirtualLayout()
    live = []
    for _ in range(3000):
        if live and rng.random() < 0.45:
            addr, n = live.pop(rng.randrange(len(live)))
            ours.free(addr, max(ALIGN, -(-n // ALIGN) * ALIGN))
            theirs.free(addr, n)
        else:
            n = rng.choice([1, 511, 512, 4096, 1 << 20, 3 << 20, rng.randrange(1, 9 << 20)])
            a = theirs.alloc(n)
            assert ours.alloc(max(ALIGN, -(-n // ALIGN) * ALIGN)) == a
            live.append((a, n))
        assert ours.top == theirs.top and ours.peak_top == theirs.peak_top


def test_sim_error_is_in_the_hierarchy():
    from uvmprefetch.sim.engine import SimError as EngineSimError
    assert EngineSimError is SimError
    assert issubclass(SimError, UvmPrefetchError) and issubclass(SimError, RuntimeError)
    assert isinstance(SimError.exit_code, int) and SimError.exit_code not in (0, 1, 2, 3, 4, 5, 6)
