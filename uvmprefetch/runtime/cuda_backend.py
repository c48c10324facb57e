"""act (live, real GPU): the ``cuda`` backend.

Memory: every PyTorch CUDA allocation is managed memory (the LD_PRELOAD shim turns the caching allocator's
``cudaMalloc`` into ``cudaMallocManaged``). This backend runs the policy hooks for each observed launch and
moves blocks with cuda-python (``cuda.bindings.runtime``, CUDA 13 ``cudaMemLocation`` API):

- prefetches to the device and evictions to the host go on a dedicated non-blocking stream, one
  ``cudaMemPrefetchAsync`` per range (cheaper per range than ``cudaMemPrefetchBatchAsync`` on the H100; the
  batch path stays behind ``Mover(batch_prefetch=True)``), issued from the mover thread (``MoveThread``)
  with the C++ observer (this backend's hooks then run on the planner thread) or with
  ``UVMPREFETCH_MOVER=thread``, else from the thread that runs the hooks;
- discards (dead data, no write-back) are off by default: a Decision's discards are issued as evictions,
  which free the same room and keep the data. With ``UVMPREFETCH_DISCARD=1`` (and the batch API) deaths come
  from the CUDA caching allocator itself (``alloc_feed.py``: its trace tracker's events into ``Liveness``): a
  block is a candidate only while every allocation that overlapped it is FREE_COMPLETED and nothing reused it
  (its ticket). An allocation no observed op touches (a cuBLAS workspace, which lay in blocks the dispatcher's
  ops alone made look dead and whose discard lost data on an H100 and an H200) keeps its blocks live. The
  mover issues each batch in order (``Mover.discard``): after the queued kernels, with the compute stream
  gated, the tickets checked again against every allocator event so far, then ``cudaMemDiscardBatchAsync``
  on a second stream after the moves of the same blocks, then the gate opened; later moves of those blocks
  wait for it (CUDA: a prefetch during a discard of the same range is undefined behaviour; ``cuda_discards.py``).
  Off by default
  until a GPU run shows the losses bit-equal (``bench/gpu/discards.py``);
- the budget (``Residency``) evicts the least recently migrated blocks, never those of the running launch
  or of launches still queued on the GPU (``GpuProgress``).

The launch hook's host seconds, by stage, are in the report (``host_time``, ``HostTime``): on the H100 the
eviction and discard calls held the training thread when the Python observer ran them there.

Any CUDA error raises ``CudaCallError``; the session logs it once and switches the prefetcher off, leaving
plain managed memory (still correct: the driver pages on demand).
The calls themselves, their streams and the mover thread are in ``mover.py``.
"""

from __future__ import annotations

import bisect
import ctypes
import dataclasses
import sys
import time

import numpy as np

from ..errors import DeviceError
from ..gpus import PROFILES
from ..policy.base import EMPTY, Advice, LaunchInfo, Policy, PolicyContext
from .mover import REAL, CudaApi, CudaCallError, MoverError, MoveThread, Mover, StreamMarks  # noqa: F401 - re-exported
from .cuda_discards import AllocatorDiscards
from .memory import plan_memory
from .residency import Residency, count, union_ids

BLOCK_SIZE = 2 << 20


def profile_for(name: str, total_bytes: int):
    """The closest GPU profile for a device name, with the device's real memory size."""
    n = name.lower()
    for key, prof in (("gh200", "gh200-c2c"), ("h200", "h200"), ("h100", "h100-sxm" if "sxm" in n else "h100-pcie"),
                      ("a100", "a100-pcie"), ("v100", "v100-pcie")):
        if key in n and prof in PROFILES:
            return PROFILES[prof].with_overrides(memory_bytes=int(total_bytes))
    return PROFILES["h100-pcie"].with_overrides(name=f"generic ({name})", memory_bytes=int(total_bytes))


class HostTime:
    """Where the launch hook spends the training thread's time, by stage: the policy's ``on_launch``, the
    books (the GPU-progress query, plan, budget victims), each CUDA call kind, and "after" (the books' touch,
    the policy's ``on_fault`` / ``on_evict``, recording the launch's GPU-progress event). The hook runs on the thread that launches the kernels, so
    a call that blocks (a prefetch the driver performs synchronously, say) starves the GPU; these totals show
    it next to the iteration times. Cost: eight ``perf_counter`` reads per launch."""

    STAGES = ("policy", "books", "discard", "evict", "advise", "prefetch", "after")

    def __init__(self) -> None:
        self.total = [0.0] * len(self.STAGES)
        self.worst = [0.0] * len(self.STAGES)
        self.n = 0

    def add(self, *stamps: float) -> None:
        self.n += 1
        tot, worst = self.total, self.worst
        prev = stamps[0]
        for i, t in enumerate(stamps[1:]):
            d = t - prev
            prev = t
            tot[i] += d
            if d > worst[i]:
                worst[i] = d

    def result(self) -> dict:
        return {"launches": self.n, "total_s": dict(zip(self.STAGES, self.total)),
                "hook_s": sum(self.total), "max_ms": {k: v * 1e3 for k, v in zip(self.STAGES, self.worst)},
                "note": "host seconds inside the launch hook, by stage, over the whole run"}


class CudaBackend(AllocatorDiscards):
    """The live GPU backend (see the module docstring).

    Raises
    ------
    DeviceError
        No GPU / cuda-python, CUDA already initialised without the shim in front of libcudart, or a budget
        above the free device memory.
    """

    name = "cuda"
    virtual_addresses = False
    device_type = "cuda"
    api: CudaApi = REAL  # where the CUDA calls come from (a fake on a CPU: tests/unit/fake_cuda.py)
    _native_lib = None  # the C++ observer, when it runs (attach_native)
    _gate = None  # (late, fault) dense ids the gate saw for the next launch (note_gate)
    copy = None  # the copy path (copyout.py), started with the C++ observer under UVMPREFETCH_EVICT=auto
    copy_status = "off (UVMPREFETCH_EVICT=uvm)"
    counts_unknown = False  # the shim counts kernels no recorded op accounts for (with the C++ observer)
    feed = None  # the caching allocator's events (alloc_feed.py): with UVMPREFETCH_DISCARD=1 or UVMPREFETCH_EVICT=auto
    _copy_books, _copy_books_why = False, "the allocator's events are not attached"
    _prot_buf = None  # the protected mask's buffer, made on first use (_protected_mask)

    def __init__(self, cfg, policy: Policy, *, shim=None, api: CudaApi = REAL) -> None:
        self.api, self.device_type = api, api.device_type
        drv = api.require_cuda()
        torch = api.torch
        from .shim import Shim, preloaded, shim_path
        path = preloaded()
        self.shim_mode = "LD_PRELOAD"
        if path is None:
            if torch.cuda.is_initialized():
                raise DeviceError("CUDA is already initialised and the shim is not in front of libcudart: start the "
                                  "program with UVMPREFETCH=1 or `uvmprefetch run`, or call uvmprefetch.enable() "
                                  "before importing torch")
            path = str(shim_path())
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)  # in front of libcudart only if torch loads it later
            self.shim_mode = "RTLD_GLOBAL (late)"
        self.shim = shim or Shim(path)
        if not torch.cuda.is_available():
            raise DeviceError("torch sees no CUDA device (a CPU-only torch build?); the cuda backend needs one")
        self.device = torch.cuda.current_device()
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info(self.device)
        self.device_name = torch.cuda.get_device_name(self.device)
        self.gpu = profile_for(self.device_name, total)
        self.block_size = BLOCK_SIZE
        # the shim's managed limit (fixed now if no allocation has yet) and the budget, with their reasons
        self.memory = plan_memory(cfg.budget, self.shim.limit(), free, total, self.shim.stats()["managed_bytes"])
        self.capacity_bytes = self.memory.budget_bytes
        if cfg.log != "quiet":
            print(self.memory.line(), file=sys.stderr)
        cap_blocks = max(1, self.capacity_bytes // self.block_size)
        self.max_blocks = self.memory.book_blocks(total, self.block_size)
        self.res = Residency(cap_blocks, self.max_blocks, self.block_size)
        self.res.n_ids = 0  # dense ids, assigned by block_ids
        self.mover = Mover(self.device, drv.batch_api, api=api)
        if cfg.mover == "thread":
            # at most 1/16 of the budget waits in the mover's queue (~2 GiB at a 32 GiB budget: ~0.3 s of D2H)
            self.mover.start_thread(max(self.capacity_bytes // 16, 64 * BLOCK_SIZE))
        self.driver = drv
        self.policy = policy
        self._attach_feed(cfg)
        self._ids: dict[int, int] = {}
        self._addr = np.zeros(self.max_blocks, dtype=np.int64)  # dense id -> block address
        self._segments: list[tuple[int, int]] = []
        self._seg_starts: list[int] = []
        self._seg_version = -1
        self._checked_swap = False
        self._t0 = time.perf_counter()
        self.captured_launches = 0
        self._capturing = torch.cuda.is_current_stream_capturing
        from .observe import GpuProgress
        self.progress = GpuProgress(self.max_blocks, event_factory=torch.cuda.Event)
        self.iter_events: list = []
        self.host = HostTime()
        self.shim_launches = 0
        self.cupti = None
        self.cupti_status = "cupti-python not installed"
        from .cupti import CuptiObserver, available
        ok, why = available()
        if ok:
            try:
                self.cupti = CuptiObserver(self.device)
                self.cupti_status = "active"
            except RuntimeError as e:  # optional: say why in the report, go on without it
                self.cupti_status = str(e)
        else:
            self.cupti_status = why
        # (the Python observer without the mover thread issues the moves itself; under ``auto`` the session says so
        # with ``observer_fallback`` once it knows the C++ observer is unavailable)
        self.policy_ctx = PolicyContext(block_size=self.block_size, capacity_blocks=cap_blocks,
                                        max_blocks=self.max_blocks, gpu=self.gpu, live=True,
                                        discards=self.discard_on, copy_path=cfg.evict == "auto",
                                        populates=self.discard_on,
                                        sync_moves=cfg.observer == "python" and cfg.mover != "thread")
        policy.on_start(self.policy_ctx)

    def observer_fallback(self) -> None:
        """The session runs the Python observer where the C++ one was wanted but is unavailable (before any op was
        seen): without the mover thread the moves are issued by the thread that decides, so the policy starts again,
        told so (``PolicyContext.sync_moves``)."""
        if self.mover.thread is None and not self.policy_ctx.sync_moves:
            self.policy_ctx = dataclasses.replace(self.policy_ctx, sync_moves=True)
            self.policy.on_start(self.policy_ctx)

    def attach_native(self, lib) -> None:
        """Run under the C++ observer (``native_observer.py``): the hooks run on the planner thread, every move
        goes through the mover thread and into the pre-op gate (``GateBook``), and GPU progress comes from the
        events the observer records on the ops' streams (``NativeProgress``); captured CUDA graphs are skipped by
        the observer itself."""
        from .mover import GateBook
        import os
        cudart = os.environ.get("UVMPREFETCH_CUDART")  # as the shim: the library to take the CUDA calls from
        if lib.lib.uvmgate_init(cudart.encode() if cudart else None) != 0:
            raise CudaCallError("libcudart not found by the gate: ops cannot wait for moves in flight")
        self.progress = self.api.native_progress(lib, self.max_blocks)
        self.mover.gate = GateBook(lib, self.block_size)
        if self.mover.thread is None:
            self.mover.start_thread(max(self.capacity_bytes // 16, 64 * BLOCK_SIZE))
        self.mover.thread.idle = self.mover.gate.settle
        self._capturing = lambda: False
        self._native_lib = lib
        self.counts_unknown = self.shim.count_unknown_kernels(lib.lib)  # (cuda_discards.liveness_result)
        if self._cfg.evict == "auto":
            from . import copyout
            self.copy, self.copy_status = copyout.start(self, lib, self._cfg)
            if self.copy is not None:
                self.mover.thread.service = self.copy.serve
            if self._cfg.log in ("info", "debug") or self.copy is None:
                print(f"uvmprefetch: copy path {self.copy_status}", file=sys.stderr)

    def allocator_events(self, events: np.ndarray) -> None:
        """The caching allocator's events (``liveness.EVENT_DTYPE``), in sequence order: the copy path's book of
        which allocations are fully observed. The book is whole only while the feed has covered every allocation
        since start (attached before the first one, never a gap): after a gap it stays incomplete for the run."""
        if self.copy is None:
            return
        if self._copy_books and self.feed is not None and self.feed.liveness.unknown is not None:
            self._copy_books = False
            self._copy_books_why = f"the allocator's events have a hole: {self.feed.liveness.unknown}"
        self.copy.book.set_complete(self._copy_books, "" if self._copy_books else self._copy_books_why)
        self.copy.book.feed(events[events["device"] >= 0] if len(events) else events)

    def gap(self) -> None:
        """The observer dropped records (a full ring): the policy's view has a hole; no block reported dead before it
        is discarded after it (each needs a death seen after the gap; the allocator's own ring has its own): the
        batch waiting for its gate is evicted instead."""
        self.ticket[:] = 0
        self._drop_batch("unknown")

    def thread_init(self) -> None:
        """On the planner thread, before its first launch: this backend's device is its current device (events and
        queries it makes go to the right context)."""
        torch = self.api.torch
        torch.cuda.set_device(self.device)

    def note_gate(self, late: list[int], fault: list[int]) -> None:
        """What the gate saw when the op about to be planned was issued (block numbers): blocks still in flight
        to the GPU, and blocks neither resident nor on their way (they faulted). The next ``launch`` feeds these
        to the policy instead of what its books infer."""
        get = self._ids.get
        ids = lambda bs: np.asarray([i for i in map(get, bs) if i is not None], dtype=np.int64)  # noqa: E731
        self._gate = (ids(late), ids(fault))

    def monitor(self) -> dict:
        """Cumulative counts of the monitor: late prefetches and faults as the gate saw them (C++ observer), else
        the books' expected faults; prefetched blocks evicted before any use (the books)."""
        m = self.res.m
        if self._native_lib is not None:
            c = self._native_lib.counters()
            return {"late_blocks": c["gate_late"], "fault_blocks": c["gate_fault"],
                    "evicted_unused_blocks": m["evicted_unused"], "source": "gate"}
        return {"late_blocks": None, "fault_blocks": m["expected_faults"], "evicted_unused_blocks": m["evicted_unused"],
                "source": "books"}

    def note_seq(self, seq: int) -> None:
        """The observer's sequence number of the launch the next ``launch`` call plans (GPU progress)."""
        self.progress.seq = seq

    # ------------------------------------------------------------------------------------ addresses
    def block_ids(self, start: int, length: int) -> np.ndarray:
        bs = self.block_size
        first, last = start // bs, (start + max(length, 1) - 1) // bs
        get = self._ids.get
        if first == last:  # (most ranges lie in one block)
            i = get(first)
            return np.array((self._new_id(first) if i is None else i,), dtype=np.int64)
        out = []
        for blk in range(first, last + 1):
            i = get(blk)
            out.append(self._new_id(blk) if i is None else i)
        return np.array(out, dtype=np.int64)

    def _new_id(self, blk: int) -> int:
        """The next dense id, for block number ``blk`` (first seen)."""
        i = len(self._ids)
        if i >= self.max_blocks:
            raise CudaCallError(f"more than {self.max_blocks} distinct 2 MiB blocks seen: address books full")
        self._ids[blk] = i
        self._addr[i] = blk * self.block_size
        self.res.n_ids = i + 1
        return i

    def _refresh_segments(self) -> None:
        st = self.shim.stats()
        version = st["n_alloc"] + st["n_free"]
        if version != self._seg_version:
            self._segments = self.shim.segments()
            self._seg_starts = [p for p, _ in self._segments]
            self._seg_version = version

    def ranges(self, blocks: np.ndarray, keep_order: bool = False) -> list[tuple[int, int]]:
        """Managed address ranges covering ``blocks``, clipped to live managed allocations; a range that
        continues the previous one in the same allocation is merged into it (never across two allocations
        that happen to touch: a range must lie in one managed allocation; on the H100 batched prefetches under
        a budget failed with cudaErrorInvalidValue, for which such merged ranges are the likeliest cause).
        ``keep_order``: in the order given (prefetches: soonest-needed first), else by address (fewest
        ranges)."""
        if not blocks.size:
            return []
        self._refresh_segments()
        out: list[list[int]] = []
        last_seg = -1
        bs = self.block_size
        addrs = self._addr[blocks].tolist()
        if not keep_order:
            addrs.sort()
        for a in addrs:
            j = bisect.bisect_right(self._seg_starts, a) - 1
            j = max(j, 0)
            while j < len(self._segments) and self._segments[j][0] < a + bs:
                p, s = self._segments[j]
                lo, hi = max(a, p), min(a + bs, p + s)
                if lo < hi:
                    if out and last_seg == j and out[-1][0] + out[-1][1] == lo:
                        out[-1][1] += hi - lo
                    else:
                        out.append([lo, hi - lo])
                    last_seg = j
                j += 1
        return [(p, s) for p, s in out]

    def _mapped(self, blocks: np.ndarray) -> np.ndarray:
        """A bool per block id: part of it lies in a live managed allocation (a move of it moves something)."""
        self._refresh_segments()
        starts, segs, bs = self._seg_starts, self._segments, self.block_size
        out = []
        for a in self._addr[blocks].tolist():
            j = bisect.bisect_right(starts, a + bs - 1) - 1  # the last allocation starting inside or before
            out.append(j >= 0 and segs[j][0] + segs[j][1] > a)  # (allocations do not overlap)
        return np.array(out, dtype=bool)

    # ------------------------------------------------------------------------------------ hooks
    def _dense(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dense ids, positions in ``blocks``) of the block numbers (``address // block_size``) that have an id (a
        block no launch touched has none: nothing to tell)."""
        get = self._ids.get
        pairs = [(i, k) for k, i in enumerate(map(get, blocks.tolist())) if i is not None]
        if not pairs:
            return EMPTY, EMPTY
        a = np.asarray(pairs, dtype=np.int64)
        return a[:, 0], a[:, 1]

    def free(self, blocks: np.ndarray) -> None:
        """Blocks no live tensor the observer saw touches any more (the session's storage tracker: the Python
        observer's finalizers), numbered ``address // block_size``. The policy is told; they never become discard
        candidates (an allocation no op touched may lie there). With the allocator feed its deaths replace these."""
        if self.feed is not None:
            return
        dense, _ = self._dense(blocks)
        if dense.size and self.copy is not None:
            self.copy.forget(dense)
        if dense.size:
            self.res.free(dense)
            self.policy.on_free(dense)

    def _check_swap(self) -> None:
        """Once: are PyTorch's allocations really managed? (the shim may sit behind libcudart)"""
        torch = self.api.torch
        if torch.cuda.memory_reserved(self.device) > 0:
            self._checked_swap = True
            if self.shim.stats()["n_alloc"] == 0:
                raise CudaCallError("PyTorch allocates but the shim saw no cudaMalloc: the shim is not in front of "
                                    f"libcudart ({self.shim_mode}); start with UVMPREFETCH=1 or `uvmprefetch run`")

    def launch(self, info: LaunchInfo) -> None:
        if self._capturing():
            # inside CUDA graph capture every call on the capturing stream is recorded into the graph and
            # event queries fail: stay out; the replayed graph reuses the addresses the books already hold
            self.captured_launches += 1
            return
        if not self._checked_swap:
            self._check_swap()
        res = self.res
        clock = time.perf_counter
        t0 = clock()
        # Policies pace prefetches against ``state.now`` (their link-queue model is in seconds): wall-clock
        # since start is the live clock. It runs ahead of the GPU by the queued launches, which only makes the
        # policy's link model look less busy than it is; the budget still caps what lands on the GPU.
        res.now = t0 - self._t0
        gate, self._gate = self._gate, None
        if gate is not None and gate[0].size:  # exact: in flight when the op was issued (a late prefetch)
            res.in_flight[gate[0]] = True
        dec = self.policy.on_launch(info, res)
        if gate is not None and gate[0].size:
            res.in_flight[gate[0]] = False
        t1 = clock()
        running = info.blocks
        if running.size:
            if self.feed is not None:  # (tickets are only ever set from the allocator's deaths)
                self.ticket[running] = 0  # in use again (the allocator handed the memory out)
            if self._queued_n:
                self._reused(running)
        # Launches still queued on the GPU keep their blocks. The mask is a pass over every numbered block: built
        # only when something is to leave (most launches when the model fits: none), the queue polled every launch.
        self.progress.poll()
        mask = None

        def protected():
            nonlocal mask
            if mask is None:
                mask = self._protected_mask(running)
            return mask
        discard, evict, pf = res.plan(dec, protected, self._mapped)
        if discard.size:
            discard, evict = self._safe_discards(discard, evict, info.index)
        if discard.size or evict.size:
            res.apply(discard, evict, EMPTY)  # books first: what the Decision frees counts for the budget
        incoming = running.size - count(res.resident, running)
        victims = res.victims(incoming + pf.size, protected)
        if victims.size:
            res.evict_for_budget(victims)
        if pf.size:
            res.apply(EMPTY, EMPTY, pf)
        t2 = clock()
        mv = self.mover
        out = union_ids(evict, victims)
        if self.copy is not None and out.size:  # the copy path takes what it can; the rest leaves by UVM
            out = self._copy_out(out, dec)
        on = self.discard_on  # each block's last move and discard (see Mover); no discard is left when off
        if on:  # into the batch; the batch goes behind one gate closure (cuda_discards.py)
            self._queue_discards(discard, (out, pf))
        t3 = clock()
        if out.size:  # (no block, no range: the Mover has nothing to do)
            mv.prefetch(self.ranges(out), to_device=False, after=self._after_discards(out) if on else 0)
        t4 = clock()
        if dec is not None:
            for blocks, advice in dec.advise:
                blocks = np.asarray(blocks, dtype=np.int64)
                if self.copy is not None and advice == Advice.PREFER_HOST:
                    self.copy.advise_host(blocks)  # read on the host from now on: mirrors back first, never copied
                mv.advise(self.ranges(blocks), Advice(advice))
        t5 = clock()
        if self.copy is not None and pf.size and self.copy.mirrors:
            back = self.copy.mirrored(pf)
            if back.any():
                self.copy.bring_in(pf[back])  # copy-ins, in the policy's order, on the same stream
                pf = pf[~back]
        if on and dec is not None and dec.populate.size and pf.size:
            pf = self._populate(pf, dec.populate)
        # the policy's order: soonest-needed first
        if pf.size:
            mv.prefetch(self.ranges(pf, keep_order=True), to_device=True, after=self._after_discards(pf) if on else 0)
        if on and (out.size or pf.size):
            m = mv.mark_moves()
            self._move_mark[out] = m
            self._move_mark[pf] = m
        t6 = clock()
        missing = res.touch(info.blocks)
        if gate is not None:
            missing = gate[1]  # what the driver faulted, as the gate saw it (the books' guess otherwise)
        if missing.size:
            self.policy.on_fault(info, missing)
        if victims.size:
            self.policy.on_evict(victims)  # budget evictions are "the driver's" from the policy's point of view
        self.progress.record(info.index, info.blocks)
        self.host.add(t0, t1, t2, t3, t4, t5, t6, clock())

    def _protected_mask(self, running: np.ndarray) -> np.ndarray:
        """``progress.protected_mask(running, poll=False)`` over the numbered blocks only (ids from ``n_ids`` on are
        never pinned, running or resident: False), into one buffer reused launch after launch: a pass over the
        ids in use, not over every id the books could hold (~83 k for 80 GiB of managed memory)."""
        n = self.res.n_ids
        buf = self._prot_buf
        if buf is None:
            buf = self._prot_buf = np.zeros(self.max_blocks, dtype=bool)
        np.greater(self.progress.pins[:n], 0, out=buf[:n])
        buf[running] = True
        return buf

    def _copy_out(self, out: np.ndarray, dec) -> np.ndarray:
        """The evictions ``out`` the copy path does not take (copyout.py): the policy's choice per block, as the
        simulator applies it under ``--evict auto``."""
        from .copyout import copy_wanted
        from ..policy.base import EvictPath
        default = getattr(self.policy, "evict_path", EvictPath.COPY) == EvictPath.COPY
        if dec is not None and dec.evict_path.size:
            want = copy_wanted(out, np.asarray(dec.evict, dtype=np.int64), dec.evict_path, default)
        else:
            want = np.full(out.shape[0], default)
        self.copy.book.upto = self.progress.seq
        return self.copy.evict(out, self._addr[out], want)

    def end_iteration(self, k: int) -> None:
        torch = self.api.torch
        self.discards_iteration_end()
        if self.feed is not None:  # incomplete books (an overflow, a late attach) are rebuilt here
            self.feed.quiescent(lambda: torch.cuda.memory_snapshot())
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.iter_events.append(ev)
        self.shim_launches += len(self.shim.read_launches())
        if self.cupti is not None:
            self.cupti.flush()
        self.policy.on_iteration(k)

    def resident_bytes(self) -> int:
        return self.res.n_resident * self.block_size

    def result(self) -> dict:
        r = self.res.result()
        st = self.shim.stats()
        self.shim_launches += len(self.shim.read_launches())
        times = []
        try:
            if len(self.iter_events) > 1:
                self.iter_events[-1].synchronize()
                times = [a.elapsed_time(b) / 1e3 for a, b in zip(self.iter_events, self.iter_events[1:])]
        except Exception:  # noqa: BLE001 - timing is best effort at exit
            times = []
        cup = None
        if self.cupti is not None:
            try:
                self.cupti.flush()
                cup = self.cupti.result()
            except Exception as e:  # noqa: BLE001
                self.cupti_status = f"flush failed: {e}"
        r.update(gpu=self.device_name, faults=cup["gpu_page_fault_groups"] if cup else None, cupti=cup,
                 cupti_status=self.cupti_status, peak_managed_bytes=st["peak_managed_bytes"],
                 managed_bytes_end=st["managed_bytes"], managed_limit_bytes=st["limit_bytes"],
                 shim=st, shim_mode=self.shim_mode, shim_launches_seen=self.shim_launches,
                 mover="thread" if self.mover.thread is not None else "sync",
                 mover_calls_on_training_thread=dict(self.mover.on_main or {"to_gpu": 0, "to_host": 0}),
                 mover_wait_s=self.mover.thread.waited_s if self.mover.thread is not None else 0.0,
                 batch_prefetch=self.mover.batch, discard_api=self.mover.can_discard, cuda_calls=self.mover.calls,
                 discards_issued=self.discard_on, discards_as_evictions=self.discards_as_evictions,
                 refused_discards=sum(self.refused.values()), liveness=self.liveness_result(),
                 captured_launches_skipped=self.captured_launches, host_time=self.host.result(),
                 copy_path=self.copy.result() if self.copy is not None else {"on": False, "status": self.copy_status},
                 driver_version=self.driver.version, gpu_iter_s_between_steps=times,
                 note="faults: CUPTI GPU page-fault groups (null without cupti-python); expected_faults counts "
                      "blocks launches used that the books did not hold resident")
        return r

    def settle(self) -> None:
        """At stop, before the report: the batch of discards issued, then wait until every queued move call was
        made; raises the mover's error. (Without it, as after a failure, the batch is never discarded: data kept.)"""
        if self.discard_on:
            self._issue_discards()
        if self.mover.thread is not None:
            self.mover.thread.drain()

    def close(self) -> None:
        if self.counts_unknown:
            self.shim.count_unknown_kernels(None)
        if self.copy is not None:
            self.mover.synchronize()
            self.copy.close()  # the mirrors back into their ranges: the program may go on using them
        if self.feed is not None:
            self.feed.lib.lib.uvm_alloc_tracker_enable(0)  # (torch has no detach: the callback stays, and returns)
        self.mover.synchronize()
        if self.mover.thread is not None:
            self.mover.thread.close()
        if self.cupti is not None:
            self.cupti.close()


__all__ = ["CudaBackend", "CudaCallError", "HostTime", "MoveThread", "Mover", "StreamMarks", "profile_for", "EMPTY"]
