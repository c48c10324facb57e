"""How the tests build ``kernels/alloc_tracker.cpp``: find a CUDA build of torch and compile against it.

Shared by ``tests/unit/test_alloc_tracker_native.py`` (compile and link on any machine that has such a torch)
and ``tests/gpu/test_alloc_tracker_gpu.py`` (the tracker on a real GPU). The command is the one the .cpp's
header comment shows; the runtime's native builder (the C++ observer's) is to use the same flags.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "kernels"

_PROBE = """
import json, os, torch
root = os.path.dirname(torch.__file__)
site = os.path.dirname(root)
inc = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include"), "/usr/local/cuda/include"]
inc += [os.path.join(site, "nvidia", d, "include") for d in ("cu13", "cuda_runtime")]
whole = lambda d: all(os.path.exists(os.path.join(d, f)) for f in ("cuda_runtime_api.h", "crt/host_config.h"))
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "root": root,
                  "abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
                  "cuda_include": next((d for d in inc if whole(d)), None),
                  "has_c10_cuda": os.path.exists(os.path.join(root, "lib", "libc10_cuda.so"))}))
"""


def cuda_torch(pythons: list) -> tuple[str, dict]:
    """(python, facts) of the first interpreter in ``pythons`` whose torch is a CUDA build and for which CUDA
    runtime headers are found; skips the test otherwise, saying what each candidate lacked."""
    tried = []
    for py in filter(None, pythons):
        r = subprocess.run([py, "-c", _PROBE], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            tried.append(f"{py}: torch does not import")
            continue
        info = json.loads(r.stdout.strip().splitlines()[-1])
        if info["has_c10_cuda"] and info["cuda_include"]:
            return py, info
        tried.append(f"{py}: torch {info['version']} " + ("has no libc10_cuda.so" if not info["has_c10_cuda"]
                                                          else "and no CUDA runtime headers found"))
    pytest.skip("no CUDA build of torch to compile the tracker against (set UVMPREFETCH_CUDA_PYTHON to a Python "
                "whose torch has libc10_cuda.so): " + "; ".join(tried))


def build_command(cxx: str, info: dict, out: Path) -> list[str]:
    """The compile and link command of ``kernels/alloc_tracker.cpp`` against one torch (``info``)."""
    root = info["root"]
    return [cxx, "-std=c++20", "-O2", "-DNDEBUG", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
            f"-D_GLIBCXX_USE_CXX11_ABI={info['abi']}", f'-DUVM_TORCH_VERSION="{info["version"]}"',
            "-isystem", f"{root}/include", "-isystem", info["cuda_include"], f"-I{KERNELS}",
            str(KERNELS / "alloc_tracker.cpp"), f"-L{root}/lib", "-lc10_cuda", "-lc10", f"-Wl,-rpath,{root}/lib",
            "-Wl,--no-undefined", "-o", str(out)]
