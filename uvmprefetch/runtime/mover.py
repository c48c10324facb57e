"""act (live, real GPU): the mover. Prefetch, evict, discard and advise calls over cuda-python on streams of its
own, issued from a thread of its own (``MoveThread``) so that no move, and above all no eviction, is ever
called on the thread that launches the kernels; with the C++ observer the moves also go into the pre-op gate's
table (``GateBook``), so that an op touching a block whose move to the GPU is still in flight waits for it on
its own stream, and only then.

C signatures behind the calls (CUDA 13 ``cuda_runtime_api.h``)::

    cudaMemPrefetchAsync(const void* devPtr, size_t count, cudaMemLocation location, unsigned int flags, cudaStream_t)
    cudaMemPrefetchBatchAsync(void** dptrs, size_t* sizes, size_t count, cudaMemLocation* prefetchLocs,
                              size_t* prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags, cudaStream_t)
    cudaMemDiscardBatchAsync(void** dptrs, size_t* sizes, size_t count, unsigned long long flags, cudaStream_t)
    cudaMemAdvise(const void* devPtr, size_t count, cudaMemoryAdvise advice, cudaMemLocation location)
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

import numpy as np

from ..errors import UvmPrefetchError
from ..policy.base import Advice


class CudaCallError(UvmPrefetchError):
    """A CUDA call in the prefetch path failed."""


class MoverError(CudaCallError):
    """A call made on the mover thread failed (raised on the thread that submits the next move)."""

    where = "mover"


class CudaApi:
    """The cuda backend's true boundary: where its CUDA calls come from. ``rt``: cuda-python's runtime module
    (``cuda.bindings.runtime``: moves, advice, the discard gate's word); ``drv``: its driver module (the discard
    gate's stream memory operations; None: imported by ``StreamGate``); ``torch``: PyTorch (``torch.cuda``'s streams,
    events and device queries); ``require_cuda()``: the driver probe (``device.require_cuda``);
    ``native_progress(lib, max_blocks)``: GPU progress under the C++ observer (``NativeProgress``);
    ``device_type``: the device whose ops the observer watches. Left out, each is the real one, imported on first
    use; a fake fills them on a CPU (``tests/unit/fake_cuda.py``), so that everything behind them runs there."""

    device_type = "cuda"

    def __init__(self, rt=None, torch=None, drv=None, require_cuda=None, native_progress=None,
                 device_type: str | None = None) -> None:
        self._rt, self._torch, self.drv = rt, torch, drv
        self._require, self._progress = require_cuda, native_progress
        if device_type is not None:
            self.device_type = device_type

    @property
    def rt(self):
        if self._rt is None:  # (looked up each time, never kept: as the import it replaces)
            from cuda.bindings import runtime
            return runtime
        return self._rt

    @property
    def torch(self):
        if self._torch is None:
            import torch
            return torch
        return self._torch

    def require_cuda(self):
        if self._require is None:
            from .device import require_cuda
            return require_cuda()
        return self._require()

    def native_progress(self, lib, max_blocks: int):
        if self._progress is None:
            from .native_observer import NativeProgress
            return NativeProgress(lib, max_blocks)
        return self._progress(lib, max_blocks)


REAL = CudaApi()  # (imports nothing until a field is read)


class MoveThread:
    """Issues prefetches and evictions from a thread of its own, in the order they were submitted.

    Opt-in with the Python observer (``UVMPREFETCH_MOVER=thread``). On the H100 (driver 580.159.04)
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
        self.idle = None  # called on the thread between calls and every 2 ms while calls wait (GateBook.settle)
        self.service = None  # the same, also after an error: ops wait for what it serves (CopyOut.serve)
        self.calls = 0
        spec = os.environ.get("UVMPREFETCH_TEST_FAIL", "")  # tests: mover[:N] fails the call after the N-th (default 5)
        name, _, n = spec.partition(":")
        self._fail_after = (int(n) if n.isdigit() else 5) if name == "mover" else -1
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
            raise MoverError(f"in the mover thread: {self.error}")

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
                    if self.idle is None and self.service is None:
                        self._cv.wait()
                    else:
                        self._cv.wait(0.002)
                        self._idle()
                if not self._q:
                    return
                nbytes, fn, args = self._q.popleft()
                self._busy = True
            try:
                if self.error is None:
                    self.calls += 1
                    if 0 <= self._fail_after < self.calls:
                        raise RuntimeError("injected mover failure (UVMPREFETCH_TEST_FAIL=mover)")
                    fn(*args)
            except Exception as e:  # noqa: BLE001 - kept, raised on the training thread
                with self._cv:
                    if self.error is None:
                        self.error = e
            finally:
                self._idle()
                with self._cv:
                    self._pending -= nbytes
                    self._busy = False
                    self._cv.notify_all()

    def _idle(self) -> None:
        if self.service is not None:
            try:
                self.service()
            except Exception as e:  # noqa: BLE001 - kept, raised on the submitting thread
                self.error = self.error or e
        if self.idle is not None and self.error is None:
            try:
                self.idle()
            except Exception as e:  # noqa: BLE001 - kept, raised on the submitting thread
                self.error = e


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
    on_main: dict | None = None  # move calls made on the main thread, by direction (where they ran, for the report)
    gate: "GateBook | None" = None  # set with the C++ observer: the pre-op gate learns every move
    gate_word: "StreamGate | None" = None  # the discards' gate on the compute stream (``stream_gate``)
    api: CudaApi = REAL  # where the CUDA calls come from

    def __init__(self, device: int, batch_api: bool, batch_prefetch: bool = False, api: CudaApi = REAL) -> None:
        self.api = api
        self.rt = cudart = api.rt
        self.torch = torch = api.torch
        self.device = device
        # torch's pool streams are created non-blocking: not the legacy default stream, as the batch calls need
        self.stream = torch.cuda.Stream(device=device)
        self.discard_stream = torch.cuda.Stream(device=device)
        self.dev_loc = self._loc(cudart.cudaMemLocationType.cudaMemLocationTypeDevice, device)
        self.host_loc = self._loc(cudart.cudaMemLocationType.cudaMemLocationTypeHost, 0)
        # Prefetches and evictions go one cudaMemPrefetchAsync per range by default: on the H100 (driver
        # 580.159.04, bench/gpu/calibrate.py) one call took 9 us of host time, while the batch call took
        # 28-37 us per range (8-256 ranges). Discards need the batch API (there is no single-range discard).
        self.batch = batch_prefetch and batch_api and hasattr(cudart, "cudaMemPrefetchBatchAsync")
        self.can_discard = batch_api and hasattr(cudart, "cudaMemDiscardBatchAsync")
        self.calls = 0
        self.on_main = {"to_gpu": 0, "to_host": 0}
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
        if self.gate is not None:
            self.thread.idle = self.gate.settle

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

    def _prefetch_now(self, ranges: list[tuple[int, int]], to_device: bool, stream=None) -> None:
        stream = self.stream if stream is None else stream
        loc = self.dev_loc if to_device else self.host_loc
        handle = stream.cuda_stream
        what = "cudaMemPrefetch" + ("BatchAsync" if self.batch else "Async") + (" to GPU" if to_device else " to host")
        if self.batch:
            ptrs = [p for p, _ in ranges]
            sizes = [s for _, s in ranges]
            self._check(self.rt.cudaMemPrefetchBatchAsync(ptrs, sizes, len(ranges), [loc], [0], 1, 0, handle), what)
        else:
            for p, s in ranges:
                self._check(self.rt.cudaMemPrefetchAsync(p, s, loc, 0, handle), what)
        if self.gate is not None:
            ev = self.torch.cuda.Event()
            ev.record(stream)
            self.gate.moving(ranges, ev, to_device)
        if threading.current_thread() is threading.main_thread():  # the training thread, in most programs
            if self.on_main is None:
                self.on_main = {"to_gpu": 0, "to_host": 0}
            self.on_main["to_gpu" if to_device else "to_host"] += len(ranges)

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

    def discard(self, items: list[list[tuple[int, int]]], after: int = 0, check=None) -> int:
        """Discard blocks (``items``: each block's managed ranges); returns the discard's mark (0 if nothing was
        issued), which a later move of these blocks waits for (``prefetch(..., after=)``).

        CUDA makes any read, write *or prefetch* of a range that runs while it is discarded undefined behaviour
        (``cuMemDiscardBatchAsync``), and the memory of a dead block may be handed out again at any moment by the
        caching allocator on the training thread. So, on the mover thread (``_discard_now``): (a) an event ``E``
        on the compute stream, after every kernel queued so far (one may still read the dead data); (b) a gate
        on the compute stream (``StreamGate``): the kernels queued after it wait; (c) ``check()``: which blocks
        are still dead, with every allocator event numbered before now seen (an ALLOC before the gate may belong
        to a kernel queued before it: that block is refused); (d) on the discard stream: wait for ``E`` and for
        move mark ``after`` (the last move of these blocks), discard what ``check`` kept, record the mark, open
        the gate. Refused blocks are evicted instead (the books already count them gone; their data is kept).
        The gate is opened whatever happens (from the host, once the discard stream is idle, if a call failed)."""
        if not items or not self.can_discard:
            return 0
        return self._on_discard_stream(0, after, self._discard_now, items, check)

    def _on_discard_stream(self, nbytes: int, after: int, fn, *args) -> int:
        """Run ``fn(*args, move, entry)`` (on the mover thread if there is one): ``move`` the move mark ``after``'s
        entry (None for 0), ``entry`` a new discard mark's, which ``fn`` records on the discard stream. Returns the
        new mark."""
        move = self.moves.pending(after) if after else None
        entry = self.discards.add(self.torch.cuda.Event(), recorded=False)
        if self.thread is not None:
            self.thread.submit(nbytes, fn, *args, move, entry)
        else:
            fn(*args, move, entry)
        return self.discards.n

    def populate(self, ranges: list[tuple[int, int]], after: int = 0) -> int:
        """Prefetch ``ranges`` (dead blocks about to be written) to the GPU on the discard stream, after their last
        discard (stream order: a prefetch of a discarded range maps it without data) and move mark ``after``, beside
        the move stream's queue. Returns its mark in the discards' numbering (a later move of these blocks waits for
        it, as for a discard), 0 if nothing was issued. A prefetch moves data and never drops it: no check needed."""
        if not ranges or not self.can_discard:
            return 0
        return self._on_discard_stream(sum(s for _, s in ranges), after, self._populate_now, ranges)

    def _populate_now(self, ranges, move, entry) -> None:
        try:
            if move is not None:
                self.discard_stream.wait_event(move[0])  # (recorded: its job ran before this one)
            self._prefetch_now(ranges, to_device=True, stream=self.discard_stream)
            entry[0].record(self.discard_stream)
        finally:
            entry[1] = True  # (an unrecorded event reads as complete: nothing waits for a populate not made)

    def _discard_now(self, items, check, move, entry) -> None:
        compute = self.torch.cuda.current_stream(self.device)
        e = self.torch.cuda.Event()
        e.record(compute)  # (a)
        gate = self.stream_gate()
        k = None
        opened = False
        try:
            k = gate.close(compute.cuda_stream)  # (b)
            keep = np.ones(len(items), dtype=bool) if check is None else np.asarray(check(), dtype=bool)  # (c)
            self.discard_stream.wait_event(e)  # (d)
            if move is not None:
                self.discard_stream.wait_event(move[0])  # (recorded: its job ran before this one)
            ranges = [r for it, ok in zip(items, keep) if ok for r in it]
            if ranges:
                self._check(self.rt.cudaMemDiscardBatchAsync([p for p, _ in ranges], [s for _, s in ranges],
                                                             len(ranges), 0, self.discard_stream.cuda_stream),
                            "cudaMemDiscardBatchAsync")
            entry[0].record(self.discard_stream)
            entry[1] = True
            gate.open_after(self.discard_stream.cuda_stream, k)
            opened = True
            refused = [r for it, ok in zip(items, keep) if not ok for r in it]
            if refused:
                self._prefetch_now(refused, to_device=False)
        finally:
            if not opened:
                entry[1] = True  # (an unrecorded event reads as complete: nothing waits for a discard not made)
                if k is not None:
                    self.discard_stream.synchronize()
                    gate.open_now(k)

    def stream_gate(self) -> "StreamGate":
        """The gate the discards close on the compute stream (made on first use)."""
        if self.gate_word is None:
            self.gate_word = StreamGate(self.rt, self.api.drv)
        return self.gate_word

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


class StreamGate:
    """A 32-bit word in mapped pinned host memory that a stream can be made to wait on: ``close(stream)`` enqueues
    ``cuStreamWaitValue32(stream, word, k, GEQ)`` (the stream's later work waits until the word reaches ``k``),
    ``open_after(stream, k)`` enqueues ``cuStreamWriteValue32`` of ``k`` on another stream (it opens once that
    stream's earlier work is done), ``open_now(k)`` writes it from the host. Stream memory operations cannot
    use managed memory (CUDA driver API), hence pinned host memory.

    C signatures (CUDA 13 ``cuda.h``)::

        CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
        CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
        cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags)
        cudaError_t cudaHostGetDevicePointer(void** pDevice, void* pHost, unsigned int flags)
    """

    def __init__(self, rt, drv=None) -> None:
        import ctypes
        if drv is None:
            from cuda.bindings import driver as drv
        self.rt, self.drv = rt, drv
        err, host = rt.cudaHostAlloc(4, rt.cudaHostAllocMapped)
        if err != rt.cudaError_t.cudaSuccess:
            raise CudaCallError(f"cudaHostAlloc of the discard gate's word failed: {err}")
        err, dev = rt.cudaHostGetDevicePointer(host, 0)
        if err != rt.cudaError_t.cudaSuccess:
            raise CudaCallError(f"cudaHostGetDevicePointer of the discard gate's word failed: {err}")
        self.host, self.dev = int(host), int(dev)
        self.word = ctypes.c_uint32.from_address(self.host)
        self.word.value = 0
        self.k = 0

    def _call(self, res, what: str) -> None:
        err = res[0] if isinstance(res, tuple) else res
        if err != self.drv.CUresult.CUDA_SUCCESS:
            raise CudaCallError(f"{what} failed: {err}")

    def close(self, stream: int) -> int:
        self.k += 1
        d = self.drv
        self._call(d.cuStreamWaitValue32(d.CUstream(stream), d.CUdeviceptr(self.dev), self.k,
                                         d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")
        return self.k

    def open_after(self, stream: int, k: int) -> None:
        d = self.drv
        self._call(d.cuStreamWriteValue32(d.CUstream(stream), d.CUdeviceptr(self.dev), k, 0), "cuStreamWriteValue32")

    def open_now(self, k: int) -> None:
        if self.word.value < k:
            self.word.value = k


class GateBook:
    """The mover's side of the pre-op gate (``kernels/gate.cpp``): each move's blocks go into the gate's table with
    the move's CUDA event (in flight to the GPU or to the host), and settle (resident / on the host) once the event
    has completed. Written from one thread only (the mover's). ``lib`` is the loaded ``ObserverLib``."""

    TO_GPU, RESIDENT, TO_HOST, ON_HOST = 2, 1, 3, 4  # gate.cpp BlockState

    def __init__(self, lib, block_size: int) -> None:
        self.lib = lib.lib
        self.shift = int(block_size).bit_length() - 1
        self.lib.uvmgate_set_block_shift(self.shift)
        self._pending: deque = deque()  # (event, handle, blocks, final state)
        self.moves = 0

    def moving(self, ranges: list[tuple[int, int]], event, to_device: bool) -> None:
        import ctypes
        sh = self.shift
        blocks = sorted({b for p, n in ranges for b in range(p >> sh, ((p + max(n, 1) - 1) >> sh) + 1)})
        arr = np.asarray(blocks, dtype=np.uint64)
        handle = int(getattr(event, "cuda_event", 0) or 0)
        ptr = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64))
        self.lib.uvmgate_set(ptr, arr.size, handle, self.TO_GPU if to_device else self.TO_HOST)
        self._pending.append((event, handle, arr, self.RESIDENT if to_device else self.ON_HOST))
        self.moves += 1

    def settle(self) -> None:
        """Mark the blocks of every completed move resident (or on the host); in order, stopping at the first
        move still in flight."""
        import ctypes
        q = self._pending
        while q and q[0][0].query():
            _, handle, arr, state = q.popleft()
            self.lib.uvmgate_settle(arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), arr.size, handle, state)

    def in_flight(self) -> int:
        return len(self._pending)
