"""The allocator tracker on a real GPU (skipped without one; see conftest.py), no runtime session involved.

GIVEN ``kernels/alloc_tracker.cpp`` built against this torch and attached right after CUDA initialises, in a
fresh process
WHEN tensors are allocated and freed, a matmul takes cuBLAS's workspace from the caching allocator, a tensor
used on a side stream is freed with ``record_stream``, and ``empty_cache`` runs
THEN the drained events are the allocator's (addresses and sizes of the tensors), a ``Liveness`` fed with them
keeps the workspace's and every live tensor's blocks live, calls a block dead only where
``torch.cuda.memory_snapshot()`` has no active allocation, waits for FREE_COMPLETED of the ``record_stream``
tensor, and reports the released segment; its books equal a rebuild from the snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from alloc_tracker_build import build_command, cuda_torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
from _common import child_env  # noqa: E402 - every child keeps the shared-GPU rule (UVMPREFETCH_MANAGED_LIMIT=gpu-free)

SCRIPT = r"""
import ctypes, json, sys
import numpy as np
import torch
from uvmprefetch.runtime import liveness as L

MB2 = 2 << 20
torch.cuda.init()
reserved_before = torch.cuda.memory_reserved()
lib = ctypes.CDLL(sys.argv[1])
lib.uvm_alloc_tracker_error.restype = ctypes.c_char_p
lib.uvm_alloc_tracker_drain.restype = ctypes.c_size_t
lib.uvm_alloc_tracker_dropped.restype = ctypes.c_uint64
rc = lib.uvm_alloc_tracker_attach()
assert rc == 0, lib.uvm_alloc_tracker_error().decode()
buf = np.zeros(1 << 16, dtype=L.EVENT_DTYPE)
tr = L.Liveness(complete_from_start=reserved_before == 0, device=torch.cuda.current_device())
events = []

def drain():
    n = lib.uvm_alloc_tracker_drain(buf.ctypes.data_as(ctypes.c_void_p), buf.size)
    ev = buf[:n].copy()
    events.extend(ev.tolist())
    return tr.feed(ev)

def dead(addr, size):
    blocks = np.arange(addr // MB2, (addr + size - 1) // MB2 + 1)
    return tr.dead_mask(blocks).tolist()

out = {"reserved_before": reserved_before}
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
y = torch.randn(2048, 2048, device="cuda")
z = y @ y  # cuBLAS takes its workspace from the caching allocator
torch.cuda.synchronize()
drain()
known = {x.data_ptr(), y.data_ptr(), z.data_ptr()}
allocs = [(a, s) for (_, a, s, _, act, _) in events if act & 0xFF == L.ALLOC]
out["tensor_allocs_seen"] = sorted(t in {a for a, _ in allocs} for t in known)
out["x_event_size"] = next(s for a, s in allocs if a == x.data_ptr())
freed = {a for (_, a, _, _, act, _) in events if act & 0xFF in (L.FREE_REQUESTED, L.FREE_COMPLETED)}
foreign = [(a, s) for a, s in allocs if a not in known and a not in freed]  # never freed: the workspace
out["foreign_allocs"] = foreign
out["foreign_live"] = [not any(dead(a, s)) for a, s in foreign]
xa, xs = x.data_ptr(), x.numel()
out["x_aligned"] = xa % MB2 == 0 and xs % MB2 == 0
del x
d = drain()
out["x_dead_after_free"] = dead(xa, xs)
out["x_blocks_reported"] = sorted(set(d.blocks.tolist()) & set(range(xa // MB2, (xa + xs - 1) // MB2 + 1)))
# record_stream: the free completes only after the side stream's use, when the allocator next looks
side = torch.cuda.Stream()
w = torch.ones(32 << 20, dtype=torch.uint8, device="cuda")
wa, ws = w.data_ptr(), w.numel()
out["w_aligned"] = wa % MB2 == 0
with torch.cuda.stream(side):
    torch.cuda._sleep(50_000_000)
    w.add_(1)
w.record_stream(side)
del w
drain()
out["w_live_while_side_stream_runs"] = not any(dead(wa, ws))
side.synchronize()
tmp = torch.empty(1024, device="cuda")  # an allocation makes the allocator process its pending frees
del tmp
drain()
out["w_dead_after_side_stream"] = dead(wa, ws)
# every block called dead holds no active allocation in the allocator's own snapshot
snap = torch.cuda.memory_snapshot()
active = [(b["address"], b["requested_size"] if "requested_size" in b else b["size"])
          for g in snap for b in g["blocks"] if b["state"] != "inactive"]
n = int(tr._meta[L.M_NIDS])
dead_blocks = tr._blk[:n][tr.dead_mask(tr._blk[:n])].tolist()
out["dead_blocks"] = len(dead_blocks)
out["dead_but_active"] = [b for b in dead_blocks if any(a < (b + 1) * MB2 and b * MB2 < a + s for a, s in active)]
ref = L.Liveness(device=tr.device)
ref.quiescent(lambda: snap)
out["live_equal_snapshot"] = tr.live_blocks().tolist() == ref.live_blocks().tolist()
del y, z
torch.cuda.synchronize()
torch.cuda.empty_cache()
d = drain()
out["released"] = int(d.released.size)
last = ctypes.c_uint64(0)
out["dropped"] = lib.uvm_alloc_tracker_dropped(ctypes.byref(last))
out["stats"] = tr.stats()
print(json.dumps(out))
"""


def test_real_allocator_events_keep_live_blocks_live(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed on a GPU machine"
    _, info = cuda_torch([sys.executable])
    so = tmp_path / "libuvmalloc.so"
    r = subprocess.run(build_command(cxx, info, so), env=child_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(so)], capture_output=True, text=True, timeout=300,
                       env=child_env(base=env))
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    s = got["stats"]
    assert got["reserved_before"] == 0 and s["unknown"] is None and got["dropped"] == 0, got
    assert got["tensor_allocs_seen"] == [True, True, True] and got["x_event_size"] == 64 << 20
    assert got["foreign_allocs"], "no allocation besides the tensors: where is cuBLAS's workspace?"
    assert all(got["foreign_live"]), got["foreign_allocs"]
    if got["x_aligned"]:
        assert all(got["x_dead_after_free"]) and len(got["x_blocks_reported"]) == 32
    assert got["w_live_while_side_stream_runs"], got
    if got["w_aligned"]:
        assert all(got["w_dead_after_side_stream"]), got
    assert got["dead_blocks"] > 0 and got["dead_but_active"] == [], got
    assert got["live_equal_snapshot"], got
    assert got["released"] > 0 and s["allocations_seen"] >= 4 and s["free_completed"] >= 3
