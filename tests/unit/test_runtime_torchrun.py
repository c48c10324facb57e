"""``UVMPREFETCH=1 torchrun ...``: a runtime per rank (issue 12), with real torchrun, gloo and the dryrun backend.

GIVEN two ranks of GPT-2 "mini" trained with DDP by ``bench/gpu/dist_worker.py`` under
a budget below their working set WHEN torchrun starts them with ``UVMPREFETCH=1`` (or under ``uvmprefetch run``)
THEN each rank writes its own report with its launches and iterations, the budget made the runtime move data
both ways, the collectives ran inside observed ops (each rank's trace holds them), every rank's losses are
bit-equal to the same torchrun job without the runtime, and the launcher wrote no report.

The same for FSDP2 (``fully_shard``) is the dry run of ``bench/gpu/distributed.py --wrap fsdp``
(``test_gpu_scripts.py``). Each torchrun job takes ~30 s on a 2-core machine (interpreter, torch and
transformers start-up of three processes); the plain job is shared between the tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "bench" / "gpu" / "dist_worker.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TORCHRUN_SCRIPT = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
WORK = ["--device", "cpu", "--config", "mini", "--batch", "2", "--seq", "32", "--iters", "2"]
# GPT-2 mini: ~43 MB of parameters, gradients and AdamW state per rank; its biggest launch (DDP's broadcast of
# the parameters at construction) touches 22 MiB
BUDGET = "24MiB"


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra or {})
    return env


def _torchrun(wrap: str, out: Path, env: dict, prefix: tuple = ()) -> subprocess.CompletedProcess:
    cmd = [*prefix, *TORCHRUN, str(WORKER), "--wrap", wrap, *WORK, "--out", str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=out.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _runtime_env(folder: Path) -> dict:
    return {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_BUDGET": BUDGET,
            "UVMPREFETCH_LOG": "quiet", "UVMPREFETCH_REPORT": str(folder / "r.json"),
            "UVMPREFETCH_TRACE": str(folder / "t.uvmt")}


def _losses(out: Path) -> dict[int, list[str]]:
    return {r: json.loads((out / f"rank{r}.json").read_text())["losses_hex"] for r in (0, 1)}


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The same DDP job without the runtime: {rank: losses}."""
    base = tmp_path_factory.mktemp("plain")
    _torchrun("ddp", base / "out", _env())
    return _losses(base / "out")


def _check_ranks(folder: Path, out: Path, plain_losses: dict, collectives: set[str]) -> None:
    from uvmprefetch.trace.format import load
    # the launcher wrote nothing; each rank its own report and trace
    assert sorted(p.name for p in folder.glob("r*.json")) == ["r.rank0.json", "r.rank1.json"]
    assert sorted(p.name for p in folder.glob("t*.uvmt")) == ["t.rank0.uvmt", "t.rank1.uvmt"]
    pids = set()
    for r in (0, 1):
        rep = json.loads((folder / f"r.rank{r}.json").read_text())
        assert rep["rank"] == {"rank": r, "world_size": 2, "local_rank": r, "source": "env"}
        assert rep["launches"] > 0 and rep["iterations"] == 2, rep
        assert not rep["degraded"] and not rep["errors"], rep["errors"]
        assert rep["working_set_bytes"] > rep["budget_bytes"] == 24 << 20  # the budget forced moves
        assert rep["bytes_dtoh"] > 0 and rep["bytes_htod"] > 0
        names = Counter(t.names[i] for t in [load(folder / f"t.rank{r}.uvmt")] for i in t.launch_name)
        assert collectives <= set(names), sorted(n for n in names if "::" in n and not n.startswith("aten"))
        pids.add(json.loads((out / f"rank{r}.json").read_text())["pid"])
    assert len(pids) == 2
    assert _losses(out) == plain_losses  # every rank bit-equal to the plain job


def test_ddp_two_ranks_each_own_a_runtime(plain, tmp_path):
    _torchrun("ddp", tmp_path / "out", _env(_runtime_env(tmp_path)))
    _check_ranks(tmp_path, tmp_path / "out", plain, {"c10d::allreduce_", "c10d::broadcast_"})


def test_uvmprefetch_run_torchrun(plain, tmp_path):
    # GIVEN `uvmprefetch run --json -- torchrun ...` THEN the same per-rank runtimes, and the JSON line lists the
    # ranks' reports (the launcher has none)
    env = _env()
    r = subprocess.run([sys.executable, "-m", "uvmprefetch", "run", "--backend", "dryrun", "--budget", BUDGET,
                        "--report", str(tmp_path / "r-{rank}.json"), "--log", "quiet", "--json", "--",
                        TORCHRUN_SCRIPT, *TORCHRUN[3:], str(WORKER), "--wrap", "ddp", *WORK,
                        "--out", str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    line = json.loads(r.stdout.strip().splitlines()[-1])
    assert line["returncode"] == 0 and line["report"] is None
    assert sorted(line["rank_reports"]) == ["0", "1"]
    for k, rep in line["rank_reports"].items():
        assert rep["rank"]["rank"] == int(k) and rep["launches"] > 0 and rep["iterations"] == 2
        assert not rep["degraded"] and rep["bytes_dtoh"] > 0
    assert sorted(p.name for p in tmp_path.glob("r*.json")) == ["r-0.json", "r-1.json"]
    assert _losses(tmp_path / "out") == plain
