"""act (live, real GPU): the ``cuda`` backend.

Memory: every PyTorch CUDA allocation is managed memory (the LD_PRELOAD shim turns the caching allocator's
``cudaMalloc`` into ``cudaMallocManaged``). This backend runs the policy hooks for each observed launch and
moves blocks with cuda-python (``cuda.bindings.runtime``, CUDA 13 ``cudaMemLocation`` API):

- prefetches to the device and evictions to the host go on a dedicated non-blocking stream, one
  ``cudaMemPrefetchAsync`` per range (cheaper per range than ``cudaMemPrefetchBatchAsync`` on the H100; the
  batch path stays behind ``Mover(batch_prefetch=True)``), issued from the training thread, or from a mover
  thread with ``UVMPREFETCH_MOVER=thread`` (``MoveThread``);
- discards (dead data, no write-back) are off by default: a Decision's discards are issued as evictions,
  which free the same room and keep the data. With ``UVMPREFETCH_DISCARD=1`` they use
  ``cudaMemDiscardBatchAsync`` on a second stream, only for blocks the runtime saw freed and no launch touched
  since, ordered (``Mover.discard``): after every queued kernel (one may still read the dead tensor) and
  before every later one (it may reuse the memory), since the hook runs after its launch is queued and cannot
  put a wait before the next; and, per block, after the moves of the same blocks already issued and before
  any later move of them (CUDA: a prefetch that runs during a discard of the same range is undefined
  behaviour). Moves of other blocks are not ordered with it: a discard no longer makes the compute stream
  wait for every queued prefetch, which had kept a GPT-2 large run at 1.5x from finishing 4 iterations in
  120 s (bench/results/gpu-20261124/, section 5). And, per block, only where no live allocation of the
  caching allocator lies (``DiscardGuard``, discard_guard.py): on an H200 (bench/results/gpu-20261127/) a run
  with that stream order still ended with a NaN loss, and a strict check found a 32 MiB allocation no
  observed op had touched (a library workspace) in blocks the runtime counted dead. Off by default because of
  those NaN losses (the H100's too: bench/results/gpu-20261123c/); the guard is not yet run on a GPU. The
  discards also held the training thread longer than the write-backs they saved;
- the budget (``Residency``) evicts the least recently migrated blocks, never those of the running launch
  or of launches still queued on the GPU (``GpuProgress``).

The launch hook's host seconds, by stage, are in the report (``host_time``, ``HostTime``): on the H100 the
eviction and discard calls held the training thread (bench/results/gpu-20261123b/README.md).

Any CUDA error raises ``CudaCallError``; the session logs it once and switches the prefetcher off, leaving
plain managed memory (still correct: the driver pages on demand).

C signatures behind the calls (CUDA 13 ``cuda_runtime_api.h``)::

    cudaMemPrefetchAsync(const void* devPtr, size_t count, cudaMemLocation location, unsigned int flags, cudaStream_t)
    cudaMemPrefetchBatchAsync(void** dptrs, size_t* sizes, size_t count, cudaMemLocation* prefetchLocs,
                              size_t* prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, cudaStream_t)
    cudaMemDiscardBatchAsync(void** dptrs, size_t* sizes, size_t count, unsigned long long flags, cudaStream_t)
    cudaMemAdvise(const void* devPtr, size_t count, cudaMemoryAdvise advice, cudaMemLocation location)
"""

from __future__ import annotations

import bisect
import ctypes
import sys
import threading
import time
from collections import deque

import numpy as np

from ..errors import DeviceError, UvmPrefetchError
from ..gpus import PROFILES
from ..policy.base import EMPTY, Advice, LaunchInfo, Policy, PolicyContext
from .discard_guard import DiscardGuard
from .memory import plan_memory
from .residency import Residency

BLOCK_SIZE = 2 << 20


class CudaCallError(UvmPrefetchError):
    """A CUDA call in the prefetch path failed."""


def profile_for(name: str, total_bytes: int):
    """The closest GPU profile for a device name, with the device's real memory size."""
    n = name.lower()
    for key, prof in (("gh200", "gh200-c2c"), ("h200", "h200"), ("h100", "h100-sxm" if "sxm" in n else "h100-pcie"),
                      ("a100", "a100-pcie"), ("v100", "v100-pcie")):
        if key in n and prof in PROFILES:
            return PROFILES[prof].with_overrides(memory_bytes=int(total_bytes))
    return PROFILES["h100-pcie"].with_overrides(name=f"generic ({name})", memory_bytes=int(total_bytes))


class MoveThread:
    """Issues prefetches and evictions from a thread of its own, in the order they were submitted.

    Opt-in (``UVMPREFETCH_MOVER=thread``). On the H100 (driver 580.159.04, bench/results/gpu-20261123b/)
    ``cudaMemPrefetchAsync`` to the host held the calling thread for much of the migration: GPT-2 large at
    1.5x under ``demand`` spent 17 of its 53 s inside the launch hook's eviction calls, on the thread that
    launches the kernels. cuda-bindings releases the GIL around its C calls, so here the training thread only
    queues the call. Measured there: the wait moved to the training thread's other CUDA calls (the iteration
    time did not change beyond noise) and discards got slower, hence not the default.

    Backpressure: at most ``max_pending`` bytes may wait; beyond that ``submit`` blocks (the training thread
    waits for the link, as it would wait for the driver's own eviction on a full GPU), so the books' budget
    never runs far ahead of the device. The first error of a call is kept and raised by the next ``submit`` or
    ``drain`` (the session then switches the prefetcher off).
    """

    def __init__(self, device: int, max_pending: int, set_device=None) -> None:
        self.max_pending = max(1, int(max_pending))
        self._q: deque = deque()
        self._cv = threading.Condition()
        self._pending = 0  # bytes queued or in a call
        self._busy = False
        self.error: BaseException | None = None
        self.waited_s = 0.0  # training-thread seconds spent blocked on backpressure
        self._closed = False
        self._set_device = set_device
        self._device = device
        self._thread = threading.Thread(target=self._run, name="uvmprefetch-mover", daemon=True)
        self._thread.start()

    def submit(self, nbytes: int, fn, *args) -> None:
        with self._cv:
            self._raise()
            if self._closed or not self._thread.is_alive():
                raise CudaCallError("the mover thread is not running: a move was submitted after close()")
            if self._pending and self._pending + nbytes > self.max_pending:
                t = time.perf_counter()
                while self._pending and self._pending + nbytes > self.max_pending and self.error is None:
                    self._cv.wait()
                self.waited_s += time.perf_counter() - t
                self._raise()
            self._q.append((nbytes, fn, args))
            self._pending += nbytes
            self._cv.notify_all()

    def drain(self) -> None:
        """Wait until every submitted call has been made (not until the copies finish: sync the stream)."""
        with self._cv:
            while (self._q or self._busy) and self._thread.is_alive():
                self._cv.wait(0.1)
            self._raise()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    def _raise(self) -> None:
        if self.error is not None:
            raise CudaCallError(f"in the mover thread: {self.error}")

    def _run(self) -> None:
        if self._set_device is not None:
            try:
                self._set_device(self._device)
            except Exception as e:  # noqa: BLE001 - reported to the training thread
                with self._cv:
                    self.error = e
                    self._cv.notify_all()
                return
        while True:
            with self._cv:
                while not self._q and not self._closed:
                    self._cv.wait()
                if not self._q:
                    return
                nbytes, fn, args = self._q.popleft()
                self._busy = True
            try:
                if self.error is None:
                    fn(*args)
            except Exception as e:  # noqa: BLE001 - kept, raised on the training thread
                with self._cv:
                    if self.error is None:
                        self.error = e
            finally:
                with self._cv:
                    self._pending -= nbytes
                    self._busy = False
                    self._cv.notify_all()


class StreamMarks:
    """Events recorded on one stream, numbered 1, 2, ... in order: which have completed, and the event of one
    that has not (to wait on). Completed events are dropped from the front, so only those still pending are
    held. An event the mover thread has not recorded yet is never taken for completed: CUDA reports an
    unrecorded event as complete, and a wait on it as a no-op."""

    def __init__(self) -> None:
        self.q: deque = deque()  # [event, recorded] of numbers first, first + 1, ...
        self.first = 1
        self.n = 0

    def add(self, event, recorded: bool = True) -> list:
        """Number the next mark; returns its entry (the mover thread sets ``entry[1]`` once it recorded it). The
        completed marks at the front are dropped first, so the queue holds only what the GPU has not passed
        (one event per launch with moves would otherwise pile up over a run)."""
        self._drop_completed()
        self.n += 1
        entry = [event, recorded]
        self.q.append(entry)
        return entry

    def _drop_completed(self) -> None:
        q = self.q
        while q and q[0][1] and q[0][0].query():
            q.popleft()
            self.first += 1

    def pending(self, number: int) -> list | None:
        """The ``[event, recorded]`` entry of mark ``number`` if it may not have completed; ``None`` if it has
        (or ``number`` is 0: no mark)."""
        self._drop_completed()
        if number < self.first:
            return None
        return self.q[number - self.first]


class Mover:
    """Prefetch / evict / discard / advise calls over cuda-python on dedicated streams.

    Ordering of discards (with ``UVMPREFETCH_DISCARD=1``; the backend keeps the numbers per block):
    ``mark_moves`` records an event on the move stream after a launch's moves and returns its number;
    ``discard(ranges, after=m)`` waits for the compute stream and for move mark ``m`` (the last move of those
    blocks), and makes the compute stream wait for it; it returns the discard's own mark, and a later
    ``prefetch(ranges, to_device, after=d)`` of any of those blocks makes the move stream wait for it.
    """

    thread: MoveThread | None = None  # set by start_thread(): prefetches and evictions off the training thread

    def __init__(self, device: int, batch_api: bool, batch_prefetch: bool = False) -> None:
        import torch
        from cuda.bindings import runtime as cudart
        self.rt = cudart
        self.torch = torch
        self.device = device
        # torch's pool streams are created non-blocking: not the legacy default stream, as the batch calls need
        self.stream = torch.cuda.Stream(device=device)
        self.discard_stream = torch.cuda.Stream(device=device)
        self.dev_loc = self._loc(cudart.cudaMemLocationType.cudaMemLocationTypeDevice, device)
        self.host_loc = self._loc(cudart.cudaMemLocationType.cudaMemLocationTypeHost, 0)
        # Prefetches and evictions go one cudaMemPrefetchAsync per range by default: on the H100 (driver
        # 580.159.04, bench/results/calibrate.json) one call took 9 us of host time, while the batch call took
        # 28-37 us per range (8-256 ranges). Discards need the batch API (there is no single-range discard).
        self.batch = batch_prefetch and batch_api and hasattr(cudart, "cudaMemPrefetchBatchAsync")
        self.can_discard = batch_api and hasattr(cudart, "cudaMemDiscardBatchAsync")
        self.calls = 0
        self.moves = StreamMarks()  # events after moves (``mark_moves``)
        self.discards = StreamMarks()  # events after discards

    def _loc(self, typ, ident: int):
        loc = self.rt.cudaMemLocation()
        loc.type = typ
        loc.id = ident
        return loc

    def _check(self, res, what: str):
        err = res[0] if isinstance(res, tuple) else res
        self.calls += 1
        if err != self.rt.cudaError_t.cudaSuccess:
            name = self.rt.cudaGetErrorName(err)
            name = name[1].decode() if isinstance(name, tuple) and isinstance(name[1], bytes) else str(err)
            raise CudaCallError(f"{what} failed: {name}")
        return res

    def start_thread(self, max_pending: int) -> None:
        """Issue prefetches and evictions from a mover thread from now on (see ``MoveThread``)."""
        def set_device(dev):
            self._check(self.rt.cudaSetDevice(dev), "cudaSetDevice (mover thread)")
        self.thread = MoveThread(self.device, max_pending, set_device)

    def prefetch(self, ranges: list[tuple[int, int]], to_device: bool, after: int = 0) -> None:
        """Move ``ranges`` to the GPU (``to_device``) or to the host on the move stream; ``after``: a discard
        mark (``discard``) the moves must wait for, 0 for none."""
        if not ranges:
            return
        entry = self.discards.pending(after) if after else None
        if entry is not None:  # (discard marks are recorded on this thread: always recorded)
            if self.thread is not None:
                self.thread.submit(0, self.stream.wait_event, entry[0])
            else:
                self.stream.wait_event(entry[0])
        if self.thread is not None:
            self.thread.submit(sum(s for _, s in ranges), self._prefetch_now, ranges, to_device)
        else:
            self._prefetch_now(ranges, to_device)

    def _prefetch_now(self, ranges: list[tuple[int, int]], to_device: bool) -> None:
        loc = self.dev_loc if to_device else self.host_loc
        handle = self.stream.cuda_stream
        what = "cudaMemPrefetch" + ("BatchAsync" if self.batch else "Async") + (" to GPU" if to_device else " to host")
        if self.batch:
            ptrs = [p for p, _ in ranges]
            sizes = [s for _, s in ranges]
            self._check(self.rt.cudaMemPrefetchBatchAsync(ptrs, sizes, len(ranges), [loc], [0], 1, 0, handle), what)
        else:
            for p, s in ranges:
                self._check(self.rt.cudaMemPrefetchAsync(p, s, loc, 0, handle), what)

    def mark_moves(self) -> int:
        """Record an event on the move stream after the moves issued so far; returns its number (for
        ``discard``'s ``after``)."""
        ev = self.torch.cuda.Event()
        if self.thread is None:
            ev.record(self.stream)
            self.moves.add(ev)
            return self.moves.n
        entry = self.moves.add(ev, recorded=False)

        def record() -> None:  # in the mover thread, after the moves submitted before it
            ev.record(self.stream)
            entry[1] = True
        self.thread.submit(0, record)
        return self.moves.n

    def discard(self, ranges: list[tuple[int, int]], after: int = 0) -> int:
        """Discard ``ranges``; returns the discard's mark (0 if nothing was issued). CUDA makes any read, write
        *or prefetch* of a range that runs while it is discarded undefined behaviour
        (``cuMemDiscardBatchAsync``), so the discard runs after every kernel queued so far and before every
        later one (the compute stream), and after move mark ``after`` (the last move of these blocks; 0: none).
        Later moves of these blocks wait for the returned mark (``prefetch(..., after=)``); other moves are not
        ordered with it."""
        if not ranges or not self.can_discard:
            return 0
        compute = self.torch.cuda.current_stream(self.device)
        self.discard_stream.wait_stream(compute)  # after every queued kernel that may still read the data
        entry = self.moves.pending(after) if after else None
        if entry is not None:
            if not entry[1]:
                self.thread.drain()  # the mover thread records it after the moves still queued there
            self.discard_stream.wait_event(entry[0])  # after the moves of these blocks already issued
        self._check(self.rt.cudaMemDiscardBatchAsync([p for p, _ in ranges], [s for _, s in ranges], len(ranges), 0,
                                                     self.discard_stream.cuda_stream), "cudaMemDiscardBatchAsync")
        ev = self.torch.cuda.Event()
        ev.record(self.discard_stream)
        self.discards.add(ev)
        compute.wait_event(ev)  # before any later kernel that reuses the memory
        return self.discards.n

    def advise(self, ranges: list[tuple[int, int]], advice: Advice) -> None:
        rt = self.rt
        adv = rt.cudaMemoryAdvise
        for p, s in ranges:
            if advice == Advice.READ_MOSTLY:
                self._check(rt.cudaMemAdvise(p, s, adv.cudaMemAdviseSetReadMostly, self.dev_loc), "cudaMemAdvise")
            elif advice == Advice.PREFER_HOST:
                self._check(rt.cudaMemAdvise(p, s, adv.cudaMemAdviseSetPreferredLocation, self.host_loc), "cudaMemAdvise")
                self._check(rt.cudaMemAdvise(p, s, adv.cudaMemAdviseSetAccessedBy, self.dev_loc), "cudaMemAdvise")
            else:
                for a, loc in ((adv.cudaMemAdviseUnsetReadMostly, self.dev_loc),
                               (adv.cudaMemAdviseUnsetPreferredLocation, self.host_loc),
                               (adv.cudaMemAdviseUnsetAccessedBy, self.dev_loc)):
                    self._check(rt.cudaMemAdvise(p, s, a, loc), "cudaMemAdvise")

    def synchronize(self) -> None:
        if self.thread is not None:
            self.thread.drain()
        self.stream.synchronize()
        self.discard_stream.synchronize()


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
        for i in range(len(stamps) - 1):
            d = stamps[i + 1] - stamps[i]
            tot[i] += d
            if d > worst[i]:
                worst[i] = d

    def result(self) -> dict:
        return {"launches": self.n, "total_s": dict(zip(self.STAGES, self.total)),
                "hook_s": sum(self.total), "max_ms": {k: v * 1e3 for k, v in zip(self.STAGES, self.worst)},
                "note": "host seconds inside the launch hook, by stage, over the whole run"}


class CudaBackend:
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

    def __init__(self, cfg, policy: Policy, *, shim=None) -> None:
        from .device import require_cuda
        drv = require_cuda()
        import torch
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
        self.mover = Mover(self.device, drv.batch_api)
        if cfg.mover == "thread":
            # at most 1/16 of the budget waits in the mover's queue (~2 GiB at a 32 GiB budget: ~0.3 s of D2H)
            self.mover.start_thread(max(self.capacity_bytes // 16, 64 * BLOCK_SIZE))
        self.driver = drv
        self.policy = policy
        # Discards only with UVMPREFETCH_DISCARD=1 and the batch API; otherwise a Decision's discards are issued
        # as evictions (same room freed, the data kept). Either way only blocks the runtime itself saw freed and
        # no launch touched since (``dead``) may be discarded: a policy's stale dead flag never loses data.
        self.discard_on = bool(cfg.discard and self.mover.can_discard)
        # every discard checked against the caching allocator (discard_guard.py): a library's workspace that no
        # observed op touched lay in blocks the runtime counted dead (H200, 2026-11-27); strict with
        # UVMPREFETCH_DISCARD_AUDIT=1
        self.guard = DiscardGuard(strict=cfg.discard_audit) if self.discard_on else None
        self.dead = np.zeros(self.max_blocks, dtype=bool)
        self._marks_for(self.max_blocks)
        self.discards_as_evictions = 0
        self.refused_discards = 0
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
        self.progress = GpuProgress(self.max_blocks)
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
        policy.on_start(PolicyContext(block_size=self.block_size, capacity_blocks=cap_blocks,
                                      max_blocks=self.max_blocks, gpu=self.gpu, live=True,
                                      discards=self.discard_on))

    # ------------------------------------------------------------------------------------ addresses
    def block_ids(self, start: int, length: int) -> np.ndarray:
        bs = self.block_size
        out = []
        for blk in range(start // bs, (start + max(length, 1) - 1) // bs + 1):
            i = self._ids.get(blk)
            if i is None:
                i = len(self._ids)
                if i >= self.max_blocks:
                    raise CudaCallError(f"more than {self.max_blocks} distinct 2 MiB blocks seen: address books full")
                self._ids[blk] = i
                self._addr[i] = blk * bs
                self.res.n_ids = i + 1
            out.append(i)
        return np.asarray(out, dtype=np.int64)

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
        addrs = self._addr[blocks] if keep_order else np.sort(self._addr[blocks])
        for a in addrs.tolist():
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

    # ------------------------------------------------------------------------------------ hooks
    def free(self, blocks: np.ndarray) -> None:
        """Blocks no live tensor touches any more, numbered ``address // block_size`` as the session's
        tracker numbers them; mapped here to the dense ids of ``block_ids`` (a block no launch touched has
        none, and nothing to free)."""
        get = self._ids.get
        ids = [i for i in map(get, blocks.tolist()) if i is not None]
        if ids:
            dense = np.asarray(ids, dtype=np.int64)
            self.dead[dense] = True
            self.res.free(dense)
            self.policy.on_free(dense)

    def _check_swap(self) -> None:
        """Once: are PyTorch's allocations really managed? (the shim may sit behind libcudart)"""
        import torch
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
        dec = self.policy.on_launch(info, res)
        t1 = clock()
        if info.blocks.size:
            self.dead[info.blocks] = False  # in use again (the allocator handed the memory out)
        # Launches still queued on the GPU keep their blocks. The mask is a pass over every block: built only
        # when something is to leave (most launches when the model fits: none), the queue polled every launch.
        self.progress.poll()
        mask = None

        def protected():
            nonlocal mask
            if mask is None:
                mask = self.progress.protected_mask(info.blocks, poll=False)
            return mask
        discard, evict, pf = res.plan(dec, protected)
        if discard.size:
            discard, evict = self._safe_discards(discard, evict, info.index)
        res.apply(discard, evict, EMPTY)  # books first: what the Decision frees counts for the budget
        incoming = int((~res.resident[info.blocks]).sum()) if info.blocks.size else 0
        victims = res.victims(incoming + pf.size, protected)
        res.evict_for_budget(victims)
        res.apply(EMPTY, EMPTY, pf)
        t2 = clock()
        mv = self.mover
        out = np.union1d(evict, victims)
        on = self.discard_on  # each block's last move and discard (see Mover); no discard is left when off
        if discard.size:
            self._disc_mark[discard] = mv.discard(self.ranges(discard), after=int(self._move_mark[discard].max()))
        t3 = clock()
        mv.prefetch(self.ranges(out), to_device=False, after=self._after_discards(out) if on else 0)
        t4 = clock()
        if dec is not None:
            for blocks, advice in dec.advise:
                mv.advise(self.ranges(np.asarray(blocks, dtype=np.int64)), Advice(advice))
        t5 = clock()
        # the policy's order: soonest-needed first
        mv.prefetch(self.ranges(pf, keep_order=True), to_device=True, after=self._after_discards(pf) if on else 0)
        if on and (out.size or pf.size):
            m = mv.mark_moves()
            self._move_mark[out] = m
            self._move_mark[pf] = m
        t6 = clock()
        missing = res.touch(info.blocks)
        if missing.size:
            self.policy.on_fault(info, missing)
        if victims.size:
            self.policy.on_evict(victims)  # budget evictions are "the driver's" from the policy's point of view
        self.progress.record(info.index, info.blocks)
        self.host.add(t0, t1, t2, t3, t4, t5, t6, clock())

    def _marks_for(self, n: int) -> None:
        """Per block id: the number of the last ``Mover.mark_moves`` after a move of it, and of the last discard
        of it (0: none); read only with discards on."""
        self._move_mark = np.zeros(n, dtype=np.int64)
        self._disc_mark = np.zeros(n, dtype=np.int64)

    def _after_discards(self, blocks: np.ndarray) -> int:
        """The last discard of any of ``blocks`` (a move of them must wait for it), 0 for none."""
        return int(self._disc_mark[blocks].max()) if blocks.size else 0

    def _safe_discards(self, discard: np.ndarray, evict: np.ndarray, launch: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """The discards to issue, and the evictions with the rest: with discards off every one becomes an
        eviction; with them on, those the runtime does not know dead (freed, untouched since) do, and those the
        guard finds a live allocation of the caching allocator in (no longer counted dead)."""
        ok = self.dead[discard] if self.discard_on else np.zeros(discard.shape[0], dtype=bool)
        if self.guard is not None and ok.any():
            cand = np.flatnonzero(ok)
            fine = self.guard.check(discard[cand], self._addr[discard[cand]], self.block_size, launch)
            if not fine.all():
                ok[cand[~fine]] = False
                self.dead[discard[cand[~fine]]] = False
        rest = discard[~ok]
        if rest.size:
            if self.discard_on:
                self.refused_discards += int(rest.size)
            else:
                self.discards_as_evictions += int(rest.size)
            evict = np.union1d(evict, rest[self.res.resident[rest]])
        return discard[ok], evict

    def end_iteration(self, k: int) -> None:
        import torch
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
                 mover_wait_s=self.mover.thread.waited_s if self.mover.thread is not None else 0.0,
                 batch_prefetch=self.mover.batch, discard_api=self.mover.can_discard, cuda_calls=self.mover.calls,
                 discards_issued=self.discard_on, discards_as_evictions=self.discards_as_evictions,
                 refused_discards=self.refused_discards,
                 discard_guard=self.guard.result() if self.guard is not None else None,
                 captured_launches_skipped=self.captured_launches, host_time=self.host.result(),
                 driver_version=self.driver.version, gpu_iter_s_between_steps=times,
                 note="faults: CUPTI GPU page-fault groups (null without cupti-python); expected_faults counts "
                      "blocks launches used that the books did not hold resident")
        return r

    def close(self) -> None:
        self.mover.synchronize()
        if self.mover.thread is not None:
            self.mover.thread.close()
        if self.cupti is not None:
            self.cupti.close()


__all__ = ["CudaBackend", "CudaCallError", "HostTime", "MoveThread", "Mover", "StreamMarks", "profile_for", "EMPTY"]
