"""A process with the real shim in front of a fake libcudart that only counts launches (the true boundary: no GPU
here), for the tests of the shim's launch hooks (``test_copyout.py``, ``test_unknown_kernels.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

FAKE_CUDART = r"""
typedef struct { unsigned x, y, z; } dim3;
int fake_n_launch;
int cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, unsigned long s, void *st) {
    (void)f; (void)g; (void)b; (void)a; (void)s; (void)st; return fake_n_launch++, 0;
}
int cudaGraphLaunch(void *g, void *st) { (void)g; (void)st; return fake_n_launch++, 0; }
"""

# The head of every script: ``shim`` (the loaded ``Shim``'s library), ``fake`` (the fake runtime), ``go()`` (one
# kernel launch through the shim's cudaLaunchKernel hook), ``launched()`` (launches the fake runtime received).
PRELUDE = r"""
import ctypes, sys
from uvmprefetch.runtime.shim import Shim
fake = ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
SHIM = Shim(sys.argv[1])
shim = SHIM.lib
class dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
launch = shim.cudaLaunchKernel
launch.argtypes = [ctypes.c_void_p, dim3, dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
one = dim3(1, 1, 1)
go = lambda: launch(None, one, one, None, 0, None)
launched = lambda: ctypes.c_int.in_dll(fake, "fake_n_launch").value
"""


def run_with_shim(tmp_path, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Build the fake runtime and run ``PRELUDE + script`` in a fresh interpreter with the shim forwarding to it
    (skips without a C compiler and make)."""
    from uvmprefetch.runtime.shim import shim_path
    if shutil.which("cc") is None or shutil.which("make") is None:
        pytest.skip("needs a C compiler and make")
    (tmp_path / "fake.c").write_text(FAKE_CUDART)
    fake = tmp_path / "libcudart.so.13"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(fake), str(tmp_path / "fake.c")], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(UVMPREFETCH_CUDART=str(fake), UVMPREFETCH_LOG="quiet")
    return subprocess.run([sys.executable, "-c", PRELUDE + script, str(shim_path()), str(fake)], env=env,
                          capture_output=True, text=True, timeout=timeout)
