"""Run under UVMPREFETCH=1 (the cuda backend, shim preloaded) by test_runtime_gpu.py; prints one JSON object."""

import json
import sys

import torch
from cuda.bindings import runtime as cudart

import uvmprefetch.runtime as rt


def ptr_type(t):
    err, attrs = cudart.cudaPointerGetAttributes(t.data_ptr())
    assert err == cudart.cudaError_t.cudaSuccess, err
    return "managed" if attrs.type == cudart.cudaMemoryType.cudaMemoryTypeManaged else str(attrs.type)


def last_prefetch(ptr, size):
    attr = cudart.cudaMemRangeAttribute.cudaMemRangeAttributeLastPrefetchLocation
    err, val = cudart.cudaMemRangeGetAttribute(4, attr, ptr, size)
    assert err == cudart.cudaError_t.cudaSuccess, err
    return int(val)


def main(what):
    s = rt.current()
    out = {"session": s is not None, "shim_mode": getattr(s.backend, "shim_mode", None) if s else None}
    if what == "alloc":
        shim0 = s.backend.shim.stats()
        xs = [torch.empty(1 << 20, device="cuda") for _ in range(64)]  # 64 x 4 MiB tensors
        out["types"] = sorted({ptr_type(x) for x in xs})
        reserved0, n_alloc0 = torch.cuda.memory_reserved(), s.backend.shim.stats()["n_alloc"]
        del xs[10]
        y = torch.empty(1 << 20, device="cuda")  # the caching allocator serves it from its cached segments
        # (not necessarily at the freed pointer: on the H100 it picked another free piece of a segment)
        out["reused"] = torch.cuda.memory_reserved() == reserved0 and s.backend.shim.stats()["n_alloc"] == n_alloc0
        out["allocated"] = torch.cuda.memory_allocated()
        out["reserved"] = torch.cuda.memory_reserved()
        st = s.backend.shim.stats()
        out["shim_allocs"] = st["n_alloc"] - shim0["n_alloc"]
        out["stats_ok"] = "allocated_bytes.all.current" in torch.cuda.memory_stats()
    elif what == "move":
        mv = s.backend.mover
        x = torch.arange(1 << 22, device="cuda", dtype=torch.float32)  # 16 MiB
        ref = x.sum().item()
        torch.cuda.synchronize()
        ranges = [(x.data_ptr(), x.numel() * 4)]
        mv.prefetch(ranges, to_device=False)
        mv.synchronize()
        out["after_evict"] = last_prefetch(*ranges[0])
        mv.prefetch(ranges, to_device=True)
        mv.synchronize()
        out["after_prefetch"] = last_prefetch(*ranges[0])
        out["sum_ok"] = x.sum().item() == ref
        out["batch_api"] = mv.can_discard
        if mv.can_discard:
            dead = torch.ones(1 << 22, device="cuda")
            p, n = dead.data_ptr(), dead.numel() * 4
            mv.prefetch([(p, n)], to_device=False)  # an eviction still on the move stream when it dies
            moved = mv.mark_moves()
            del dead
            # ordered after the queued kernels and that eviction, before the next kernels
            d = mv.discard([(p, n)], after=moved)
            z = torch.full((1 << 22,), 3.0, device="cuda")  # reuses the discarded memory
            mv.prefetch([(p, n)], to_device=True, after=d)  # a move of it after the discard
            out["discard_reuse_ok"] = z.data_ptr() == p and z.sum().item() == 3.0 * (1 << 22)
        out["cuda_calls"] = mv.calls
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
