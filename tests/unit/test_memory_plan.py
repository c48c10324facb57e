"""The managed limit and the budget the cuda backend runs with, and the line that says why (runtime/memory.py).

The limit dicts come from the real shim (``Shim.plan_limit``: the same C code that enforces the limit at the first
allocation) reading a fake ``/proc/meminfo`` under ``UVMPREFETCH_SHIM_SYSROOT``; only the device figures are
given, as ``cudaMemGetInfo`` would give them.
"""

import os
import shutil

import pytest

from uvmprefetch.config import Budget
from uvmprefetch.errors import DeviceError
from uvmprefetch.runtime.memory import (GPU_RESERVE_DIV, default_budget, describe_limit, limit_why,
                                        plan_memory)
from uvmprefetch.runtime.shim import Shim, shim_path

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

MiB, GiB = 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    d = tmp_path_factory.mktemp("shim")
    os.environ["UVMPREFETCH_SHIM_DIR"] = str(d)
    try:
        return Shim(shim_path())
    finally:
        del os.environ["UVMPREFETCH_SHIM_DIR"]


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host with ``MemAvailable`` = the given bytes and no cgroup limit."""
    def make(avail):
        (tmp_path / "proc" / "self").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc" / "meminfo").write_text(f"MemAvailable: {avail // 1024} kB\n")
        monkeypatch.setenv("UVMPREFETCH_SHIM_SYSROOT", str(tmp_path))
    return make


def test_the_budget_default_keeps_back_what_the_gpu_free_limit_keeps_back(shim, host):
    host(8 * GiB)
    for free in (64 * MiB, 79 * GiB + 12345, 141 * GiB):
        assert shim.plan_limit(free, 2 * free, "gpu-free")["gpu_cap"] == default_budget(free)
    assert default_budget(80 * GiB) == 80 * GiB - 80 * GiB // GPU_RESERVE_DIV == 76 * GiB


def test_model_bigger_than_the_gpu_the_default_plan(shim, host):
    # GIVEN an 80 GiB GPU with 78 GiB free and a host with 200 GiB available, no variable set
    host(200 * GiB)
    lim = shim.plan_limit(78 * GiB, 80 * GiB, None)
    plan = plan_memory(None, lim, 78 * GiB, 80 * GiB)
    # THEN managed memory may reach what the host backs (200 - 20), the budget is the GPU's free memory - 5 %
    assert lim["limit_bytes"] == 180 * GiB and plan.oversubscribed
    assert plan.budget_bytes == default_budget(78 * GiB)
    line = plan.line()
    assert line.startswith("uvmprefetch: managed memory up to 180.00 GiB (default: what the host can back: ")
    assert "200.00 GiB available - 20.00 GiB margin" in line
    why = "(default: the GPU's free memory 78.00 GiB - 5 %)"
    assert f"budget {plan.budget_bytes / GiB:.2f} GiB on the GPU {why}" in line
    assert "\n" not in line
    d = plan.as_dict()
    assert d["oversubscribed"] and d["managed_limit"]["limit_bytes"] == 180 * GiB
    assert d["budget_why"].startswith("default")


def test_gpu_free_and_a_small_host(shim, host):
    host(8 * GiB)
    lim = shim.plan_limit(78 * GiB, 80 * GiB, "gpu-free")
    plan = plan_memory(Budget(fraction=0.5), lim, 78 * GiB, 80 * GiB)
    assert not plan.oversubscribed and plan.budget_bytes == 40 * GiB
    assert "gpu-free" in plan.line() and "UVMPREFETCH_BUDGET=50% of device memory" in plan.line()
    # default limit on a host that backs less than the GPU has free: the GPU's free memory - 5 % stays
    lim = shim.plan_limit(78 * GiB, 80 * GiB, None)
    assert lim["limit_bytes"] == default_budget(78 * GiB)
    assert not plan_memory(None, lim, 78 * GiB, 80 * GiB).oversubscribed
    assert limit_why(lim).startswith("default: the GPU's free memory - 5 %, more than what the host can back")


def test_an_explicit_limit_above_what_the_host_backs_is_said_to_be_risky(shim, host):
    host(8 * GiB)
    lim = shim.plan_limit(78 * GiB, 80 * GiB, "1TiB")
    assert lim["limit_bytes"] == 1 << 40 and lim["mode"] == "bytes"
    assert "the kernel may end the run" in limit_why(lim)
    assert "the kernel" not in limit_why(shim.plan_limit(78 * GiB, 80 * GiB, "7GiB"))


def test_a_budget_above_free_memory_is_refused(shim, host):
    host(8 * GiB)
    lim = shim.plan_limit(10 * GiB, 80 * GiB, None)
    with pytest.raises(DeviceError, match="UVMPREFETCH_BUDGET=.*above the free device memory"):
        plan_memory(Budget(nbytes=20 * GiB), lim, 10 * GiB, 80 * GiB)
    assert plan_memory(Budget(nbytes=20 * GiB), lim, 10 * GiB, 80 * GiB, managed_now=12 * GiB).budget_bytes == 20 * GiB


def test_the_books_follow_the_limit(shim, host):
    host(200 * GiB)
    bs = 2 * MiB
    plan = plan_memory(None, shim.plan_limit(78 * GiB, 80 * GiB, None), 78 * GiB, 80 * GiB)
    assert plan.book_blocks(80 * GiB, bs) == 2 * 180 * GiB // bs + 1024  # 180 GiB of managed memory can be seen
    small = plan_memory(None, shim.plan_limit(78 * GiB, 80 * GiB, "gpu-free"), 78 * GiB, 80 * GiB)
    assert small.book_blocks(80 * GiB, bs) == 2 * 80 * GiB // bs + 1024  # never fewer than the device's
    huge = plan_memory(None, shim.plan_limit(78 * GiB, 80 * GiB, "1000TiB"), 78 * GiB, 80 * GiB)
    assert huge.book_blocks(80 * GiB, bs) == 2 * 64 * 80 * GiB // bs + 1024


def test_doctor_words_without_a_gpu(shim, host):
    host(20 * GiB)
    text = describe_limit(shim.plan_limit(0, 0, None), gpu_known=False)
    assert text.startswith("host (default): up to 18.00 GiB, what the host can back: 20.00 GiB available")
    assert "(no GPU here)" in text and "out-of-memory" in text
    assert describe_limit(shim.plan_limit(0, 0, "gpu-free"), gpu_known=False).startswith("gpu-free")
    text = describe_limit(shim.plan_limit(80 * GiB, 80 * GiB, None), gpu_known=False)
    assert "(at most 76.00 GiB here)" in text
