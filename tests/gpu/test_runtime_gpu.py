"""The live runtime on a real GPU (skipped without one; see conftest.py). Each case runs in a subprocess
started with UVMPREFETCH=1, so the start-up hook re-executes it with the shim in LD_PRELOAD as users get it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
from _common import child_env  # noqa: E402 - every child keeps the shared-GPU rule (UVMPREFETCH_MANAGED_LIMIT=gpu-free)

EXAMPLE = REPO / "examples" / "train_gpt2.py"
PROBE = Path(__file__).resolve().parent / "_probe.py"
SIZE = ["--layers", "4", "--embd", "256", "--heads", "4", "--batch", "8", "--seq", "128", "--vocab", "8192"]


def run(args, tmp_path, name, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(HF_HUB_OFFLINE="1", CUBLAS_WORKSPACE_CONFIG=":4096:8", **env_extra)
    r = subprocess.run([sys.executable, *map(str, args)], env=child_env(base=env), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r


def probe(tmp_path, what, **env):
    r = run([PROBE, what], tmp_path, what, UVMPREFETCH="1", UVMPREFETCH_LOG="quiet", **env)
    return json.loads(r.stdout.strip().splitlines()[-1])


def train(tmp_path, name, iters=3, **env):
    out = tmp_path / f"{name}.json"
    run([EXAMPLE, "--iters", iters, "--deterministic", "--device", "cuda", "--out", out, *SIZE], tmp_path, name, **env)
    return json.loads(out.read_text())


def test_managed_allocation_under_pytorch_with_caching_intact(tmp_path):
    d = probe(tmp_path, "alloc")
    assert d["session"] and d["shim_mode"] == "LD_PRELOAD"
    assert d["types"] == ["managed"]  # every tensor lives in managed memory
    assert d["reused"]  # the caching allocator still reuses its blocks
    assert 0 < d["allocated"] <= d["reserved"] and d["stats_ok"]  # memory stats still work
    assert d["shim_allocs"] < 64  # 64 tensors, fewer cudaMalloc calls: caching sits on top of the shim


def test_prefetch_and_discard_calls(tmp_path):
    d = probe(tmp_path, "move")
    assert d["after_evict"] == -1  # cudaCpuDeviceId: the range was prefetched to the host
    assert d["after_prefetch"] == 0  # back on GPU 0
    assert d["sum_ok"] and d["cuda_calls"] >= 2
    if d["batch_api"]:
        assert d["discard_reuse_ok"]


def test_discards_see_memory_an_unobserved_allocation_holds_as_live(tmp_path):
    # GIVEN discards on (the allocator tracker attached), a tensor that died, and its memory handed out by the
    # caching allocator with no op the runtime sees (as cuBLAS takes its workspace)
    d = probe(tmp_path, "liveness", UVMPREFETCH_DISCARD="1")
    if not d["feed"]:
        pytest.skip(f"no allocator feed here: {d['why']}")
    assert d["dead_after_free"] and d["raw_reuses_memory"]
    # THEN its blocks are live while that allocation lives, and dead again once it is freed
    assert d["live_while_raw"] and d["dead_once_freed"]
    assert d["stats"]["unknown"] is None and d["stats"]["allocations_seen"] >= 2


def test_losses_equal_with_and_without_runtime_and_budget_enforced(tmp_path):
    plain = train(tmp_path, "plain")
    plain2 = train(tmp_path, "plain2")
    ws = plain["peak_reserved_bytes"]
    rep_free, rep_budget = tmp_path / "free.json", tmp_path / "budget.json"
    live = train(tmp_path, "live", UVMPREFETCH="1", UVMPREFETCH_REPORT=str(rep_free))
    budget = ws // 2
    tight = train(tmp_path, "tight", UVMPREFETCH="1", UVMPREFETCH_BUDGET=str(budget), UVMPREFETCH_REPORT=str(rep_budget))
    if plain["losses_hex"] == plain2["losses_hex"]:  # deterministic here: demand bit equality
        assert live["losses_hex"] == plain["losses_hex"] and tight["losses_hex"] == plain["losses_hex"]
    else:
        for a, b in zip(plain["losses"], tight["losses"]):
            assert abs(a - b) <= 1e-5 * abs(a)
    r = json.loads(rep_free.read_text())
    assert not r["degraded"] and r["iterations"] == 3 and r["launches_by_phase"]["backward"] > 0
    mem = r["memory"]  # the shared-GPU rule reached the child; no budget: the GPU's free memory - 5 %
    assert mem["managed_limit"]["mode"] == "gpu-free" and not mem["oversubscribed"]
    assert mem["budget_why"].startswith("default") and mem["budget_bytes"] == r["capacity_bytes"]
    assert r["peak_managed_bytes"] >= ws // 2
    b = json.loads(rep_budget.read_text())
    assert not b["degraded"], b["errors"]
    assert b["memory"]["budget_bytes"] == budget and b["memory"]["budget_why"].startswith("UVMPREFETCH_BUDGET=")
    assert b["budget_bytes"] == budget and b["working_set_bytes"] > budget
    assert b["peak_resident_bytes"] <= budget  # the books never held more than the budget
    bt = b["backend_result"]
    assert bt["budget_evictions"] > 0 and b["bytes_dtoh"] > 0  # it had to evict to stay under
    assert bt["over_budget_launches"] == 0
    if b["observer"]["kind"] == "native":  # the shim counts kernels no recorded op accounts for (a lower bound)
        uk = bt["liveness"]["unknown_kernels"]
        assert uk is not None and bt["liveness"]["unknown_kernels_seen"] == uk["launches"] + uk["graph_launches"]


def test_budget_above_free_memory_is_a_clear_startup_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(UVMPREFETCH="1", UVMPREFETCH_BUDGET="100TiB")
    r = subprocess.run([sys.executable, "-c", "import torch; print('ran')"], env=child_env(base=env),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 5 and "ran" not in r.stdout
    assert "UVMPREFETCH_BUDGET" in r.stderr and "free device memory" in r.stderr


def test_the_driver_keeps_the_host_copy_of_a_page_until_cudafree(tmp_path):
    # The default managed limit (UVMPREFETCH_MANAGED_LIMIT=host) counts host memory alone, not device + host,
    # because nvidia-uvm frees a block's CPU pages only when the block is destroyed (uvm_va_block.c): a page that
    # was evicted once keeps its host page after it returns to the GPU. This checks that on the driver here;
    # if it fails (host pages released on the way back), the limit could count the device's memory too.
    d = probe(tmp_path, "host_backing")
    n, (evicted, back, freed) = d["bytes"], d["host_used"]
    assert d["managed"] and d["sum_ok"] and d["limit"]["managed_limit"]["mode"] == "gpu-free"
    assert evicted > 0.7 * n, f"evicting {n} bytes took {evicted} bytes of host memory: the measurement is off"
    assert back > 0.7 * n, f"host memory held after the pages came back: {back} of {n} bytes"
    assert freed < 0.3 * n, f"host memory still held after cudaFree: {freed} of {n} bytes"
