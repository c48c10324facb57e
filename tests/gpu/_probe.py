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
            d = mv.discard([[(p, n)]], after=moved)
            z = torch.full((1 << 22,), 3.0, device="cuda")  # reuses the discarded memory
            mv.prefetch([(p, n)], to_device=True, after=d)  # a move of it after the discard
            out["discard_reuse_ok"] = z.data_ptr() == p and z.sum().item() == 3.0 * (1 << 22)
        out["cuda_calls"] = mv.calls
    elif what == "liveness":  # with UVMPREFETCH_DISCARD=1: deaths from the caching allocator's own events
        import numpy as np
        be = s.backend
        out["feed"], out["why"] = be.feed is not None, be.liveness_why
        if be.feed is not None:
            bs = be.block_size
            x = torch.ones(1 << 22, device="cuda")  # 16 MiB
            p, n = x.data_ptr(), x.numel() * 4
            nums = np.arange(-(-p // bs), (p + n) // bs, dtype=np.int64)  # the blocks x covers completely
            del x
            torch.cuda.synchronize()
            be.feed.pump()
            dead = be.feed.liveness.dead_mask
            out["dead_after_free"] = bool(nums.size and dead(nums).all())
            others = []  # the same memory, handed out with no op the runtime sees (as cuBLAS takes its workspace)
            raw = torch.cuda.caching_allocator_alloc(n)
            while raw != p and len(others) < 8:
                others.append(raw)
                raw = torch.cuda.caching_allocator_alloc(n)
            for o in others:
                torch.cuda.caching_allocator_delete(o)
            cudart.cudaMemset(raw, 7, n)
            out["raw_reuses_memory"] = raw == p
            be.feed.pump()
            out["live_while_raw"] = not dead(nums).any()
            torch.cuda.synchronize()
            torch.cuda.caching_allocator_delete(raw)
            be.feed.pump()
            out["dead_once_freed"] = bool(dead(nums).all())
            out["stats"] = be.feed.stats()
    elif what == "host_backing":  # does the driver keep a page's host copy once the page is back on the GPU?
        mv = s.backend.mover
        free, _ = torch.cuda.mem_get_info()
        n = min(2 << 30, free // 8) // (2 << 20) * (2 << 20)
        x = torch.ones(n // 4, device="cuda")  # first touch on the GPU: no host pages yet
        torch.cuda.synchronize()
        out["bytes"], out["managed"] = n, ptr_type(x) == "managed"
        out["limit"] = s.backend.memory.as_dict()
        avail = []
        for to_device in (None, False, True):  # before, after evicting to the host, after prefetching back
            if to_device is not None:
                mv.prefetch([(x.data_ptr(), n)], to_device=to_device)
                mv.synchronize()
            avail.append(mem_available())
        out["sum_ok"] = x.sum().item() == n // 4
        del x
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the caching allocator frees its segment: cudaFree through the shim
        avail.append(mem_available())
        out["host_used"] = [avail[0] - a for a in avail[1:]]  # after evict, after prefetch back, after free
    print(json.dumps(out))


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))


if __name__ == "__main__":
    main(sys.argv[1])
