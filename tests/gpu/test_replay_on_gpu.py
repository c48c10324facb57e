"""The GPU trace replay on a real GPU (skipped without one; see conftest.py): the touch kernel's self-test
(every byte of its chunks once, writes stamped), and the shipped small trace replayed at 1/8 of its size under
demand at 1.5x, every launch run, the runtime's evictions issued, the written data intact after them, measured and
predicted figures written. Whether
the prediction is within its target is the script's finding, not this test's. (demand compiles no Numba kernel:
this stays well inside run_all.sh part1's limit for tests/gpu; `run_all.sh next` runs uvmprefetch too.)"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
from _common import child_env  # noqa: E402 - every child keeps the shared-GPU rule (UVMPREFETCH_MANAGED_LIMIT=gpu-free)


def test_replay_of_the_shipped_trace(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu" / "replay_gpu.py"),
                        str(REPO / "traces" / "gpt2-small-b2s128.uvmt"), "--scale", "1/8", "--oversub", "1.5",
                        "--policies", "demand", "--no-baseline", "--out", str(tmp_path), "--quiet",
                        "--time-limit", "200", "--case-timeout", "60"],
                       env=child_env({"PYTHONPATH": str(REPO)}), capture_output=True, text=True, timeout=400)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    res = json.loads((tmp_path / "replay_gpu.json").read_text())
    checks = {c["name"]: c for c in res["checks"]}
    assert checks["touch kernel: every byte of its chunks once, writes stamped"]["ok"] is True
    assert res["device_kind"] == "gpu" and len(res["cases"]) == 1
    for c in res["cases"]:
        assert checks[f"{c['name']} ran"]["ok"] is True
        assert checks[f"{c['name']} moves issued by the runtime's mover"]["ok"] is True, checks
        assert checks[f"{c['name']} written data intact after the moves"]["ok"] is True, checks
        m = c["measured"]
        assert m["time_s"] > 0 and m["launches"] == 2267 and m["iterations"] == 3
        assert c["predicted"]["time_s"] > 0 and c["error"] is not None
