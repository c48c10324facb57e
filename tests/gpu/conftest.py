"""tests/gpu: need an NVIDIA GPU, a CUDA build of torch and cuda-python; skipped cleanly otherwise."""

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def why_skip() -> str | None:
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")):
        return "no NVIDIA GPU device on this machine"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU (CPU-only build or no driver)"
    if importlib.util.find_spec("cuda.bindings") is None:
        return "cuda-python is not installed (pip install 'uvmprefetch[cuda]')"
    return None


def pytest_collection_modifyitems(config, items):
    mine = [it for it in items if HERE in Path(str(it.fspath)).resolve().parents]
    if not mine:
        return
    why = why_skip()
    for it in mine:
        it.add_marker(pytest.mark.gpu)
        if why:
            it.add_marker(pytest.mark.skip(reason=why))
