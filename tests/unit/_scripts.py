"""Running a ``bench/gpu`` script as a user would, for the tests of its CPU paths (``--dry-run``, bad input)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_script(script: Path, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """``python script args...`` from the repository root, with this checkout importable, no ``UVMPREFETCH*``
    variable and no GPU visible (these tests are about the CPU paths, even on a GPU machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
