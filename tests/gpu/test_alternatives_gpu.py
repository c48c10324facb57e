"""The memory-saving methods of bench/gpu/train_worker.py on a real GPU (skipped without one; see conftest.py):
GIVEN a small GPT-2 WHEN trained plain, with checkpointing, with saved activations offloaded, with FSDP2 CPU
offload, each held to a memory cap THEN each stays within the cap, the offloading ones pin host memory, the
deterministic ones are bit-equal to plain, and a cap below the model runs out of memory as a result (exit 3),
not a crash. These are the paths alternatives.py times on GPT-2 large; this checks them in about a minute."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "bench" / "gpu" / "train_worker.py"
sys.path.insert(0, str(REPO / "bench" / "gpu"))
from _common import child_env  # noqa: E402 - every child keeps the shared-GPU rule (UVMPREFETCH_MANAGED_LIMIT=gpu-free)

CAP = 2 << 30  # far above the small model's needs: the cap is applied but does not bind


def train(tmp_path, name, *flags, expect_rc=0):
    out = tmp_path / f"{name}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(HF_HUB_OFFLINE="1", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    r = subprocess.run([sys.executable, str(WORKER), "--config", "mini", "--batch", "4", "--seq", "128", "--iters",
                        "3", "--deterministic", "--device", "cuda", "--out", str(out), *flags], env=child_env(base=env),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == expect_rc, f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_each_method_trains_within_its_cap_and_matches_plain(tmp_path):
    plain = train(tmp_path, "plain")
    runs = {m: train(tmp_path, m, *flags, "--memory-cap", str(CAP)) for m, flags in {
        "checkpoint": ["--checkpoint"], "offload": ["--offload-activations"],
        "fsdp-offload": ["--fsdp-offload"]}.items()}
    for m, r in runs.items():
        assert r["oom"] is None and 0 < r["peak_reserved_bytes"] <= r["memory_cap_bytes"] <= CAP, m
        assert r["losses_hex"][0] == plain["losses_hex"][0], m  # the same forward from the same weights
    # deterministic kernels: recomputation and host copies change no bit; FSDP's AdamW steps on the CPU
    assert runs["checkpoint"]["losses_hex"] == plain["losses_hex"]
    assert runs["offload"]["losses_hex"] == plain["losses_hex"]
    assert max(abs(a - b) / a for a, b in zip(runs["fsdp-offload"]["losses"], plain["losses"])) < 1e-3
    assert runs["offload"]["host_pinned_peak_bytes"] > 0 and runs["fsdp-offload"]["host_pinned_peak_bytes"] > 0
    # checkpointing keeps fewer activations on the GPU, FSDP offload no parameters or AdamW state (allocated
    # bytes: reserved ones move in whole segments and may tie on a model this small)
    assert runs["checkpoint"]["peak_allocated_bytes"] < plain["peak_allocated_bytes"]
    assert runs["fsdp-offload"]["peak_allocated_bytes"] < plain["peak_allocated_bytes"]


def test_a_cap_below_the_model_is_an_out_of_memory_result(tmp_path):
    r = train(tmp_path, "tight", "--memory-cap", str(8 << 20), expect_rc=3)
    assert r["oom"] and "out of memory" in r["oom"]["message"].lower()
    assert r["losses"] == [] and r["peak_reserved_bytes"] <= 8 << 20
