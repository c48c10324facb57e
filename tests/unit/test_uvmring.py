"""The observer's and allocator tracker's ring (``kernels/uvmring.h``), compiled and stressed on the CPU.

GIVEN four producer threads publishing runs of one to five records through a ring of 1024 cells, far too
small for what they publish, and one consumer draining it,
WHEN they race (also under ThreadSanitizer where the compiler has it),
THEN every run arrives whole and in its producer's order, every accepted record is drained exactly once, and
what did not fit is counted as dropped rather than lost silently.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parents[1] / "kernels"
CXX = shutil.which("g++") or shutil.which("c++")

pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")


def _build(tmp_path: Path, *flags: str) -> Path | None:
    exe = tmp_path / ("ring" + "".join(f.replace("=", "_") for f in flags))
    r = subprocess.run([CXX, "-O2", "-std=c++17", *flags, f"-I{KERNELS}", str(HERE / "native" / "ring_stress.cpp"),
                        "-o", str(exe), "-lpthread"], capture_output=True, text=True)
    if r.returncode != 0:
        return None if flags else pytest.fail(f"ring_stress.cpp does not compile:\n{r.stderr}")
    return exe


def _run(exe: Path) -> dict:
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{exe.name}: {r.stdout}{r.stderr}"
    words = r.stdout.split()
    return {words[i]: int(words[i + 1]) for i in range(0, len(words) - 1, 2)}


def test_ring_delivers_whole_runs_and_counts_what_it_drops(tmp_path):
    out = _run(_build(tmp_path))
    assert out["bad"] == 0
    assert out["got"] == out["pushed"] > 0
    assert out["dropped"] > 0  # the ring is far smaller than what is published: overflow must have happened
    assert out["pushed"] + out["dropped"] == 4 * 200000 * 3  # runs of 1..5 records: 3 on average


def test_ring_is_race_free_under_thread_sanitizer(tmp_path):
    exe = _build(tmp_path, "-fsanitize=thread")
    if exe is None:
        pytest.skip("this compiler has no ThreadSanitizer runtime")
    out = _run(exe)
    assert out["bad"] == 0 and out["got"] == out["pushed"]
