"""The allocator tracker's native side: ``kernels/uvmevents.h`` and ``kernels/alloc_tracker.cpp``.

GIVEN the C record the tracker pushes and its NumPy mirror (``liveness.EVENT_DTYPE``)
WHEN a tiny program compiled from the header prints its offsets and action numbers
THEN they are the mirror's, field for field.

GIVEN a CUDA build of torch (this interpreter's, or the one ``UVMPREFETCH_CUDA_PYTHON`` names: a Python whose
torch ships ``libc10_cuda.so``; skipped without one)
WHEN ``alloc_tracker.cpp`` is compiled and linked against its headers and ``libc10_cuda.so`` (no undefined
symbol allowed) and loaded
THEN it exports the C entry points, reports 40-byte records and the torch version it was built for, numbers
from the shared sequence, and -- before CUDA is initialised -- refuses to attach with one line saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from alloc_tracker_build import build_command, cuda_torch
from uvmprefetch.runtime import liveness as L

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parents[1] / "kernels"
CXX = shutil.which("g++") or shutil.which("c++")

ENTRY_POINTS = ("uvm_alloc_tracker_attach", "uvm_alloc_tracker_enable", "uvm_alloc_tracker_drain",
                "uvm_alloc_tracker_dropped", "uvm_alloc_tracker_seen", "uvm_alloc_tracker_next_seq",
                "uvm_alloc_tracker_barrier", "uvm_alloc_tracker_error", "uvm_alloc_tracker_built_for",
                "uvm_alloc_tracker_record_size", "uvm_alloc_tracker_capacity", "uvm_alloc_tracker_quiesce")

needs_cxx = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")


@needs_cxx
def test_event_dtype_and_actions_match_the_c_header(tmp_path):
    exe = tmp_path / "layout"
    r = subprocess.run([CXX, "-std=c++17", f"-I{KERNELS}", str(HERE / "native" / "alloc_event_layout.cpp"), "-o",
                        str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines():
        name, *nums = line.split()
        out[name] = [int(x) for x in nums]
    dt = L.EVENT_DTYPE
    assert out["itemsize"] == [dt.itemsize] == [40]
    for name in dt.names:
        fmt, off = dt.fields[name]
        assert out[name] == [off, fmt.itemsize], name
    for name in ("ALLOC", "FREE_REQUESTED", "FREE_COMPLETED", "SEGMENT_ALLOC", "SEGMENT_FREE", "SEGMENT_MAP",
                 "SEGMENT_UNMAP", "SNAPSHOT", "OOM", "ANNOTATE", "UNKNOWN", "PRIVATE_POOL"):
        assert out[name] == [getattr(L, name)], name
    assert L.PRIVATE_POOL > L.ACTION_MASK >= L.UNKNOWN


# --------------------------------------------------------------------------------- against a CUDA torch

_LOAD = """
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
for f in ("uvm_alloc_tracker_error", "uvm_alloc_tracker_built_for"):
    getattr(lib, f).restype = ctypes.c_char_p
for f in ("uvm_alloc_tracker_record_size", "uvm_alloc_tracker_capacity", "uvm_alloc_tracker_drain"):
    getattr(lib, f).restype = ctypes.c_size_t
for f in ("uvm_alloc_tracker_next_seq", "uvm_alloc_tracker_dropped", "uvm_alloc_tracker_seen"):
    getattr(lib, f).restype = ctypes.c_uint64
buf = (ctypes.c_char * (40 * 16))()
last = ctypes.c_uint64(7)
seqs = [lib.uvm_alloc_tracker_next_seq() for _ in range(3)]
attach = lib.uvm_alloc_tracker_attach()
print(json.dumps({"record_size": lib.uvm_alloc_tracker_record_size(), "capacity": lib.uvm_alloc_tracker_capacity(),
                  "built_for": lib.uvm_alloc_tracker_built_for().decode(), "seqs": seqs, "attach": attach,
                  "error": lib.uvm_alloc_tracker_error().decode(), "drained": lib.uvm_alloc_tracker_drain(buf, 16),
                  "dropped": lib.uvm_alloc_tracker_dropped(ctypes.byref(last)), "last_dropped": last.value,
                  "seen": lib.uvm_alloc_tracker_seen()}))
"""


@needs_cxx
def test_tracker_compiles_and_links_against_a_cuda_torch(tmp_path):
    py, info = cuda_torch([sys.executable, os.environ.get("UVMPREFETCH_CUDA_PYTHON")])
    so = tmp_path / "libuvmalloc.so"
    r = subprocess.run(build_command(CXX, info, so), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"alloc_tracker.cpp against torch {info['version']}:\n{r.stderr[-4000:]}"
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    missing = [f for f in ENTRY_POINTS if f" T {f}" not in syms]
    assert not missing, f"entry points not exported: {missing}"
    r = subprocess.run([py, "-c", _LOAD, str(so)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["record_size"] == L.EVENT_DTYPE.itemsize and got["capacity"] == 1 << 17
    assert got["built_for"] == info["version"]
    assert got["seqs"] == sorted(got["seqs"]) and len(set(got["seqs"])) == 3 and got["seqs"][0] >= 1
    assert got["drained"] == 0 and got["dropped"] == 0 and got["last_dropped"] == 0 and got["seen"] == 0
    # torch.cuda was never initialised in that process (with or without a GPU): nothing to attach to yet
    assert got["attach"] == -1 and "not initialised" in got["error"], got


_IN_OBSERVER = """
import ctypes, json, os, sys
from uvmprefetch.runtime import native
path = native.build(native.OBSERVER)
lib = ctypes.CDLL(str(path))
lib.uvm_alloc_tracker_next_seq.restype = lib.uvmobs_mark.restype = ctypes.c_uint64
lib.uvmobs_mark.argtypes = [ctypes.c_uint32, ctypes.c_uint64]
lib.uvm_alloc_tracker_error.restype = lib.uvm_alloc_tracker_built_for.restype = ctypes.c_char_p
seqs = [lib.uvm_alloc_tracker_next_seq(), lib.uvmobs_mark(0, 0), lib.uvm_alloc_tracker_next_seq()]
print(json.dumps({"path": str(path), "seqs": seqs, "quiesce": lib.uvm_alloc_tracker_quiesce(1000),
                  "attach": lib.uvm_alloc_tracker_attach(), "error": lib.uvm_alloc_tracker_error().decode(),
                  "built_for": lib.uvm_alloc_tracker_built_for().decode()}))
"""


def test_the_observer_library_carries_the_tracker_where_a_cuda_torch_is_installed(tmp_path):
    """GIVEN a CUDA torch (``UVMPREFETCH_CUDA_PYTHON``), WHEN the runtime's own builder builds the C++ observer's
    library there, THEN ``alloc_tracker.cpp`` is compiled into it (its entry points exported), its events and the
    observer's ops are numbered from one sequence, the lock-free quiesce returns at once when no event is in
    flight, and attaching before CUDA is initialised is refused with the reason."""
    py, info = cuda_torch([sys.executable, os.environ.get("UVMPREFETCH_CUDA_PYTHON")])
    env = dict(os.environ, UVMPREFETCH_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(HERE.parents[1]))
    r = subprocess.run([py, "-c", _IN_OBSERVER], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    syms = subprocess.run(["nm", "-D", "--defined-only", got["path"]], capture_output=True, text=True).stdout
    missing = [f for f in ENTRY_POINTS if f" T {f}" not in syms]
    assert not missing, f"the observer library lacks {missing}"
    assert " T uvmobs_start" in syms
    a, b, c = got["seqs"]
    assert a < b < c, got  # one counter for the allocator's events and the observer's records
    assert got["quiesce"] == 0 and got["built_for"] == info["version"]
    assert got["attach"] == -1 and "not initialised" in got["error"], got


def test_doctor_says_whether_the_tracker_is_in_the_observer_library(monkeypatch, tmp_path):
    """``uvmprefetch doctor`` runs to the end (no observer built yet included) and says whether discards can
    have the allocator's events here: with a CPU-only torch they cannot, and it names why."""
    from uvmprefetch.cli import doctor
    monkeypatch.setenv("UVMPREFETCH_CACHE_DIR", str(tmp_path / "cache"))  # (nothing built there)
    got = {c["name"]: c for c in doctor.checks()}
    t = got["allocator tracker"]
    assert not t["required"]
    import torch
    if torch.version.cuda is None:
        assert not t["ok"] and "libc10_cuda.so" in t["detail"] and "discards nothing" in t["detail"]
    assert "not built yet" in got["observer"]["detail"] or got["observer"]["ok"] is False
