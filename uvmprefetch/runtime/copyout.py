"""act (live, real GPU): the copy path, UVM's eviction's faster sibling (``UVMPREFETCH_EVICT=auto``).

UVM's eviction (``cudaMemPrefetchAsync`` to the host) runs at 7-11 GB/s and holds the calling thread; pinned copies
run at ~55 GB/s (docs/design.md section 3). For a block whose every live allocation the runtime fully observes:

- **copy-out** (mover thread, move stream): the gate (``kernels/gate.cpp``) marks the block ``kMirrored`` first, so
  an op issued from then on demands a copy-in and waits for it; then it waits until every op already past its gate
  check has queued its kernels (``uvmgate_quiesce``; after ``QUIESCE_MS`` the blocks leave by UVM instead); then the
  stream waits for the compute stream (those kernels); ``cudaMemcpyAsync`` of each live allocation's part of the
  block into a block-sized slot of pinned host memory (``MirrorPool``); ``cudaMemDiscardBatchAsync`` of those
  ranges (no UVM write-back, the pages are free for the budget);
- **copy-in** (a prefetch of the block, or an op's demand): ``cudaMemPrefetchAsync`` of the ranges to the GPU
  (repopulates the discarded pages without a copy), ``cudaMemcpyAsync`` from the slot, an event; the gate sets the
  block in flight to the GPU with that event, so the op's stream waits on it (the gate's usual rule). Everything
  runs on the one move stream, so a slot given back after its copy-in is reused only after that copy-in ran.

**Eligibility** (``ObservedAllocations``): a block is eligible when the allocator's event stream is complete and
every live allocation overlapping it is one an observed op has accessed (a storage the session's tracker holds);
a library workspace (cuBLAS's) never is, so its blocks always leave by UVM. While any mirror exists the shim asks,
at every kernel launch, whether the launching thread is inside an op the C++ observer records; the first launch
outside one (a raw extension's kernel, anything the observer cannot attribute), and any ``cudaGraphLaunch``, calls
``unattributed`` before the kernel is queued: every mirror is copied back synchronously and the path is off for the
rest of the run, with one line. A failed copy-out, discard or copy-in does the same. Beyond the mirror pool's cap
(``UVMPREFETCH_HOST_LIMIT``), and for every ineligible block, eviction is UVM's.

**Which evictions**: the policy's rule, as the simulator applies it (``sim/copypath.py`` ``_evict_choice``): a
Decision's ``evict_path`` per block, ``EvictPath.DEFAULT`` meaning the policy's ``evict_path``; the budget's own
victims take the policy's default. A block ever given ``PREFER_HOST`` never leaves by copy (kernels read it on the
host). Unlike the simulator, a mirror is given back at its copy-in (no discard-only second eviction).

``torch.compile``'s Triton kernels launch through the driver API, which the shim does not see: the path does not
start where graphs were compiled, and turns itself off (mirrors back) when a compile starts (``compiling``). Other
driver-API launches are not seen; such programs must keep ``UVMPREFETCH_EVICT=uvm``.

C signatures behind the calls (CUDA 13 ``cuda_runtime_api.h``)::

    cudaMallocHost(void** ptr, size_t size)            cudaFreeHost(void* ptr)
    cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream)
    cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind)
    cudaMemDiscardBatchAsync(void** dptrs, size_t* sizes, size_t count, unsigned long long flags, cudaStream_t)
    cudaMemPrefetchAsync(const void* devPtr, size_t count, cudaMemLocation location, unsigned int flags, cudaStream_t)
"""

from __future__ import annotations

import bisect
import ctypes
import sys
import threading

import numpy as np

from ..policy.base import EvictPath
from .mover import CudaCallError

MIRRORED = 6  # gate.cpp BlockState kMirrored
QUIESCE_MS = 1000  # how long a copy-out waits for ops already past the gate to queue their kernels
_UNKNOWN = 0  # gate.cpp kUnknown: the driver's business again

# liveness.py's actions (the allocator event stream, ``uvm::AllocAction``): the ones the book follows
_ALLOC, _FREE_COMPLETED, _ACTION_MASK, _KNOWN_ACTIONS = 0, 2, 0xFF, range(10)


def copy_wanted(evict: np.ndarray, dec_blocks: np.ndarray, dec_path: np.ndarray, default_copy: bool) -> np.ndarray:
    """Per block of ``evict`` (a subset of a Decision's ``dec_blocks``): does the policy want it out by the copy path?
    ``dec_path``: the Decision's ``evict_path`` (empty: every block ``DEFAULT``); ``default_copy``: what ``DEFAULT``
    means (the policy's ``evict_path`` is ``COPY``). The simulator's rule (``CopyPath._evict_choice``)."""
    if not dec_path.size or not evict.size:
        return np.full(evict.shape[0], default_copy)
    if dec_path.shape[0] != dec_blocks.shape[0]:
        raise CudaCallError(f"Decision.evict_path has {dec_path.shape[0]} entries for {dec_blocks.shape[0]} evictions")
    want = (dec_path == EvictPath.COPY) | ((dec_path == EvictPath.DEFAULT) & default_copy)
    chosen = dict(zip(dec_blocks.tolist(), want.tolist()))
    return np.fromiter((chosen.get(b, default_copy) for b in evict.tolist()), dtype=bool, count=evict.shape[0])


DISCARD_ALIGN = 64 << 10  # the driver's big page: discards are cut inward to it (never beyond the mirrored bytes)


def discard_ranges(ranges: list[tuple[int, int]], align: int = DISCARD_ALIGN) -> list[tuple[int, int]]:
    """The mirrored ``ranges`` merged where they touch, each cut inward to ``align`` boundaries: the caching
    allocator's allocations are 512-byte aligned, a discard works on whole pages, and a page that holds bytes of
    something not mirrored must keep them. The uncut edges stay resident and are simply overwritten by the
    copy-in."""
    out: list[list[int]] = []
    for p, n in sorted(ranges):
        if out and out[-1][1] >= p:
            out[-1][1] = max(out[-1][1], p + n)
        else:
            out.append([p, p + n])
    cut = [((lo + align - 1) // align * align, hi // align * align) for lo, hi in out]
    return [(lo, hi - lo) for lo, hi in cut if hi > lo]


class MirrorPool:
    """Pinned host memory for mirrors: block-sized slots carved from slabs of ``slab_blocks`` blocks, allocated on
    demand up to ``cap_bytes`` and kept until ``close`` (pinning is slow: a ``cudaMallocHost`` per eviction would
    hold the mover thread). ``take`` returns a slot's host address or None when the cap is reached (the eviction
    then takes UVM: a ``fallback``). ``alloc(nbytes) -> address`` / ``free(address)``: the pinned allocator."""

    def __init__(self, cap_bytes: int, block_size: int, alloc, free, slab_blocks: int = 32) -> None:
        self.block_size = int(block_size)
        self.cap_slots = max(0, int(cap_bytes) // self.block_size)
        self._alloc, self._free_fn = alloc, free
        self.slab_blocks = max(1, int(slab_blocks))
        self._free: list[int] = []
        self._slabs: list[int] = []
        self.allocated_slots = 0
        self.in_use = 0
        self.peak = 0
        self.fallbacks = 0
        self.alloc_error: str | None = None

    def take(self) -> int | None:
        if not self._free and self.allocated_slots < self.cap_slots and self.alloc_error is None:
            k = min(self.slab_blocks, self.cap_slots - self.allocated_slots)
            try:
                base = int(self._alloc(k * self.block_size))
            except Exception as e:  # noqa: BLE001 - out of pinned memory: the cap is what we have
                self.alloc_error = f"pinned allocation of {k * self.block_size >> 20} MiB failed: {e}"
            else:
                self._slabs.append(base)
                self._free.extend(base + i * self.block_size for i in range(k - 1, -1, -1))
                self.allocated_slots += k
        if not self._free:
            self.fallbacks += 1
            return None
        self.in_use += 1
        self.peak = max(self.peak, self.in_use)
        return self._free.pop()

    def give(self, slot: int) -> None:
        self._free.append(slot)
        self.in_use -= 1

    def close(self) -> None:
        for base in self._slabs:
            try:
                self._free_fn(base)
            except Exception:  # noqa: BLE001 - at exit, after a failure too
                pass
        self._slabs, self._free = [], []

    def result(self) -> dict:
        bs = self.block_size
        return {"cap_bytes": self.cap_slots * bs, "pinned_bytes": self.allocated_slots * bs,
                "current_bytes": self.in_use * bs, "peak_bytes": self.peak * bs, "fallbacks": self.fallbacks,
                "alloc_error": self.alloc_error}


class ObservedAllocations:
    """The caching allocator's live allocations (from its event stream, ``liveness.EVENT_DTYPE`` records) and whether
    an observed op has accessed each: ``observed(address) -> bool`` (the session's ``StorageTracker`` holds a storage
    there). ``complete`` is False until the caller says the stream covers every live allocation (the tracker was
    attached before the first allocation, or a snapshot was fed), and again after a gap; then nothing is eligible.
    """

    def __init__(self, observed) -> None:
        self.observed = observed
        self._starts: list[int] = []
        self._size: dict[int, int] = {}
        self._gen: dict[int, int] = {}  # address -> which allocation there (a count of ALLOCs)
        self._n = 0
        self._pending: list[np.ndarray] = []  # events not yet applied (newer than the op being planned)
        self.upto: int | None = None  # apply events older than this sequence number (the op planned); None: all
        self.complete = False
        self.why = "the allocator's event stream has not been attached"

    def set_complete(self, ok: bool, why: str = "") -> None:
        self.complete, self.why = bool(ok), why

    def alloc(self, addr: int, size: int) -> None:
        if addr not in self._size:
            bisect.insort(self._starts, addr)
        self._size[addr] = int(size)
        self._n += 1
        self._gen[addr] = self._n

    def free(self, addr: int) -> None:
        if self._size.pop(addr, None) is not None:
            del self._starts[bisect.bisect_left(self._starts, addr)]
            del self._gen[addr]

    def same(self, addr: int, gen: int) -> bool:
        """Is allocation ``gen`` (from ``ranges_in``) still the live one at ``addr``?"""
        return self._gen.get(addr) == gen

    def feed(self, events: np.ndarray) -> None:
        """Allocator events in sequence order (the planner's batch: up to its newest op). They are applied when asked,
        up to the op being planned (``upto``): the session's tracker knows the storages as of that op, and an
        allocation made after it at the address of one that died must not pass for that storage."""
        if len(events):
            self._pending.append(events)

    def _catch_up(self) -> None:
        if not self._pending:
            return
        ev = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        cut = len(ev) if self.upto is None else int(np.searchsorted(ev["seq"], self.upto))
        self._pending = [ev[cut:]] if cut < len(ev) else []
        self._apply(ev[:cut])

    def _apply(self, events: np.ndarray) -> None:
        """ALLOC adds, FREE_COMPLETED removes; an action this book does not know makes it incomplete."""
        for addr, size, action in zip(events["addr"].tolist(), events["size"].tolist(), events["action"].tolist()):
            a = action & _ACTION_MASK
            if a == _ALLOC:
                self.alloc(addr, size)
            elif a == _FREE_COMPLETED:
                self.free(addr)
            elif a not in _KNOWN_ACTIONS:
                self.set_complete(False, f"an allocator action this build does not know ({a})")

    def ranges_in(self, lo: int, hi: int) -> list[tuple[int, int, int, int]] | None:
        """The live allocations' parts in ``[lo, hi)`` as (start, bytes, allocation address, its generation), by
        address, if every one is observed; None if one is not (or the book is incomplete)."""
        self._catch_up()
        if not self.complete:
            return None
        starts = self._starts
        i = bisect.bisect_right(starts, lo) - 1
        if i < 0 or starts[i] + self._size[starts[i]] <= lo:
            i += 1
        out = []
        while i < len(starts) and starts[i] < hi:
            a = starts[i]
            if not self.observed(a):
                return None
            out.append((max(a, lo), min(a + self._size[a], hi) - max(a, lo), a, self._gen[a]))
            i += 1
        return out


class _Mirror:
    __slots__ = ("block", "slot", "ranges", "owners", "discarded")

    def __init__(self, block: int, slot: int | None, ranges: list[tuple[int, int, int]], owners: list) -> None:
        self.block = block  # gate block number (address >> shift)
        self.slot = slot  # host address of the pinned slot (None: the block held no live allocation)
        self.ranges = ranges  # (device address, bytes, host address)
        self.owners = owners  # per range: (allocation address, generation) whose bytes it holds
        self.discarded = False  # the discard was queued: the GPU copy is gone, the mirror is the data


class CopyOut:
    """The copy path of the cuda backend (see the module docstring). ``mover``: the backend's ``Mover`` (its
    ``rt``, ``stream``, ``torch``, ``thread``, ``gate``); ``book``: the ``ObservedAllocations``; ``pool``: the
    ``MirrorPool``; ``shim``: the loaded shim (for ``uvmshim_set_mirrors``), None in tests without one."""

    def __init__(self, mover, book: ObservedAllocations, pool: MirrorPool, block_size: int, shim=None,
                 log: str = "warning") -> None:
        self.mv, self.book, self.pool, self.bs, self.shim = mover, book, pool, int(block_size), shim
        self.log = log
        self.on = True
        self.why_off: str | None = None
        self.mirrors: dict[int, _Mirror] = {}  # dense id -> mirror
        self._by_block: dict[int, int] = {}  # gate block number -> dense id
        self._lock = threading.RLock()
        self.prefer_host: set[int] = set()
        self.m = dict(copy_evictions=0, copy_out_bytes=0, copy_ins=0, copy_in_bytes=0, demand_copy_ins=0,
                      ineligible_evictions=0, mirror_full_evictions=0, restored_blocks=0, restore_errors=0,
                      quiesce_timeouts=0, stale_ranges=0, forgotten=0)
        self._demand_buf = np.zeros(256, dtype=np.uint64)
        self._graphs = _graph_count()
        self._shim_mirrors(False)

    # ----------------------------------------------------------------------------------------- planner side
    def evict(self, ids: np.ndarray, addrs: np.ndarray, want: np.ndarray) -> np.ndarray:
        """Take the blocks ``ids`` (block addresses ``addrs``) that ``want`` the copy path and are eligible, as far
        as the pool allows; queue their copy-out on the mover thread. Returns the ids left to UVM's eviction."""
        if not ids.size:
            return ids
        if self.on and _graph_count() != self._graphs:  # compiled while the start-of-compile callback was not there
            self.compiling()
        with self._lock:
            if not self.on:
                return ids
            rest, take = [], []
            for i, a, w in zip(ids.tolist(), addrs.tolist(), want.tolist()):
                if not w or i in self.prefer_host or i in self.mirrors:
                    rest.append(i)
                    continue
                parts = self.book.ranges_in(a, a + self.bs)
                if parts is None:
                    self.m["ineligible_evictions"] += 1
                    rest.append(i)
                    continue
                slot = self.pool.take() if parts else None
                if parts and slot is None:
                    self.m["mirror_full_evictions"] += 1
                    rest.append(i)
                    continue
                mir = _Mirror(a >> self._shift(), slot, [(p, n, slot + (p - a)) for p, n, _, _ in parts],
                              [(o, g) for _, _, o, g in parts])
                self.mirrors[i] = mir
                self._by_block[mir.block] = i
                take.append(mir)
            if take:
                self._shim_mirrors(True)
        if take:  # outside the lock: a full mover queue blocks the submitter until the mover (which takes it) ran
            self._submit(sum(n for t in take for _, n, _ in t.ranges), self._out_now, take)
        return np.asarray(rest, dtype=np.int64)

    def mirrored(self, ids: np.ndarray) -> np.ndarray:
        """Mask over ``ids``: which have a mirror (their way back is a copy-in, not a prefetch)."""
        m = self.mirrors
        return np.fromiter((i in m for i in ids.tolist()), dtype=bool, count=ids.shape[0])

    def bring_in(self, ids: np.ndarray) -> None:
        """Queue the copy-in of the mirrored blocks among ``ids`` (a prefetch of them, in the policy's order)."""
        with self._lock:
            todo = [i for i in ids.tolist() if i in self.mirrors]
            nbytes = sum(n for i in todo for _, n, _ in self.mirrors[i].ranges)
        if todo:
            self._submit(nbytes, self._in_now, todo, False)

    def forget(self, ids: np.ndarray) -> None:
        """``ids`` hold no live tensor any more (the session saw their storages die): their mirrors are dropped, the
        gate lets ops over them go (the memory they get next is new; its contents do not matter)."""
        with self._lock:
            gone = [self.mirrors.pop(i) for i in ids.tolist() if i in self.mirrors]
            for t in gone:  # (a copy-out still queued finds its mirror gone and does nothing)
                del self._by_block[t.block]
                if t.slot is not None:
                    self.pool.give(t.slot)
            self.m["forgotten"] += len(gone)
            self._gate_set([t.block for t in gone], _UNKNOWN)
            if gone and not self.mirrors:
                self._shim_mirrors(False)

    def advise_host(self, ids: np.ndarray) -> None:
        """``PREFER_HOST`` for ``ids``: kernels will read them on the host, so they never leave by copy; a mirrored one
        is copied back first (queued before the advice's own call, which the caller makes after the mover drained)."""
        with self._lock:
            self.prefer_host.update(ids.tolist())
        self.bring_in(ids)
        if self.mv.thread is not None:
            self.mv.thread.drain()

    # ------------------------------------------------------------------------------------------ mover side
    def _submit(self, nbytes: int, fn, *args) -> None:
        if self.mv.thread is not None:
            self.mv.thread.submit(nbytes, fn, *args)
        else:
            fn(*args)

    def _shift(self) -> int:
        return self.bs.bit_length() - 1

    def _gate_set(self, blocks: list[int], state: int) -> None:
        gate = self.mv.gate
        if gate is None or not blocks:
            return
        arr = np.asarray(blocks, dtype=np.uint64)
        gate.lib.uvmgate_set(arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), arr.size, 0, state)

    def _out_now(self, take: list[_Mirror]) -> None:
        """Mover thread: gate, order after the compute stream, copy out, discard."""
        rt, mv = self.mv.rt, self.mv
        with self._lock:
            take = [t for t in take if self.mirrors.get(self._by_block.get(t.block, -1)) is t]
            if not take or not self.on:
                return
            self._gate_set([t.block for t in take], MIRRORED)  # ops issued from now on demand a copy-in
            if mv.gate is not None and mv.gate.lib.uvmgate_quiesce(QUIESCE_MS) != 0:
                self._give_up(take)  # ops past the gate would not be ordered with the discard: UVM's way instead
                return
            stream = mv.stream
            try:
                stream.wait_stream(mv.torch.cuda.current_stream(mv.device))  # after kernels queued that use them
                kind = rt.cudaMemcpyKind.cudaMemcpyDefault
                for t in take:
                    for p, n, h in t.ranges:
                        mv._check(rt.cudaMemcpyAsync(h, p, n, kind, stream.cuda_stream), "cudaMemcpyAsync (copy-out)")
                ranges = discard_ranges([(p, n) for t in take for p, n, _ in t.ranges])
                for t in take:
                    t.discarded = True  # from here the mirror is the data (also if the discard call fails)
                if ranges:
                    mv._check(rt.cudaMemDiscardBatchAsync([p for p, _ in ranges], [n for _, n in ranges], len(ranges),
                                                          0, stream.cuda_stream), "cudaMemDiscardBatchAsync (copy-out)")
            except Exception as e:  # noqa: BLE001 - restore, switch off, training goes on
                self._off(f"copy-out failed ({e})", on_mover=True)
                return
            self.m["copy_evictions"] += len(take)
            self.m["copy_out_bytes"] += sum(n for t in take for _, n, _ in t.ranges)

    def _give_up(self, take: list[_Mirror]) -> None:
        """Mover thread, nothing copied or discarded yet: these blocks leave by UVM's eviction after all."""
        self.m["quiesce_timeouts"] += 1
        for t in take:
            del self.mirrors[self._by_block.pop(t.block)]
            if t.slot is not None:
                self.pool.give(t.slot)
        self._gate_set([t.block for t in take], _UNKNOWN)
        ranges = [(p, n) for t in take for p, n, _ in t.ranges]
        if ranges:
            self.mv._prefetch_now(ranges, False)
        if not self.mirrors:
            self._shim_mirrors(False)

    def _in_now(self, ids: list[int], demanded: bool) -> None:
        """Mover thread: repopulate on the GPU, copy the mirrors in, hand the gate the copy's event."""
        rt, mv = self.mv.rt, self.mv
        with self._lock:
            if not self.on:
                return
            pairs = [(i, self.mirrors[i]) for i in ids if i in self.mirrors]
            todo = [t for _, t in pairs]
            if not todo:
                return
            for t in todo:  # a range whose allocation died since: nothing to bring back, the memory may be another's
                keep = [k for k, (o, g) in enumerate(t.owners) if self.book.same(o, g)]
                if len(keep) < len(t.ranges):
                    self.m["stale_ranges"] += len(t.ranges) - len(keep)
                    t.ranges, t.owners = [t.ranges[k] for k in keep], [t.owners[k] for k in keep]
            stream = mv.stream
            try:
                kind = rt.cudaMemcpyKind.cudaMemcpyDefault
                for t in todo:
                    for p, n, _ in t.ranges:
                        mv._check(rt.cudaMemPrefetchAsync(p, n, mv.dev_loc, 0, stream.cuda_stream),
                                  "cudaMemPrefetchAsync (copy-in)")
                for t in todo:
                    for p, n, h in t.ranges:
                        mv._check(rt.cudaMemcpyAsync(p, h, n, kind, stream.cuda_stream), "cudaMemcpyAsync (copy-in)")
                ev = mv.torch.cuda.Event()
                ev.record(stream)
            except Exception as e:  # noqa: BLE001
                self._off(f"copy-in failed ({e})", on_mover=True)
                return
            if mv.gate is not None:  # ops on these blocks now wait on the copy's event (or, once done, on nothing)
                mv.gate.moving([(t.block << self._shift(), self.bs) for t in todo], ev, True)
            for i, t in pairs:
                del self.mirrors[i]
                del self._by_block[t.block]
                if t.slot is not None:
                    self.pool.give(t.slot)  # reused by a later copy-out on the same stream: after this copy-in
            self.m["copy_ins"] += len(todo)
            self.m["copy_in_bytes"] += sum(n for t in todo for _, n, _ in t.ranges)
            if demanded:
                self.m["demand_copy_ins"] += len(todo)
            if not self.mirrors:
                self._shim_mirrors(False)

    def serve(self) -> None:
        """Mover thread, between calls and every ~2 ms: copy in the blocks ops are waiting for (the gate's
        demands)."""
        gate = self.mv.gate
        if gate is None:
            return
        buf = self._demand_buf
        n = gate.lib.uvmgate_take_demands(buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), buf.size)
        if not n:
            return
        with self._lock:
            ids = list(dict.fromkeys(self._by_block[b] for b in buf[:n].tolist() if b in self._by_block))
        if ids:
            self._in_now(ids, True)

    # ------------------------------------------------------------------------------------------- safety net
    def unattributed(self) -> None:
        """The shim saw a kernel launched outside every observed op (its thread, before the kernel is queued)."""
        self._off("a kernel was launched outside every op the observer records (a raw extension or library launch)",
                  on_mover=False)

    def compiling(self, _args=None) -> None:
        """``torch.compile`` starts compiling a graph (``torch._dynamo.callback.on_compile_start``, on the compiling
        thread, before the graph first runs): its Triton kernels launch through the driver API, which the shim does
        not see."""
        self._off("torch.compile is compiling a graph (its Triton kernels are launched where the shim cannot see "
                  "them)", on_mover=False)

    def _off(self, why: str, on_mover: bool) -> None:
        """Switch the path off for the run: every mirror whose discard was queued is copied back synchronously, every
        gated block is handed back to the driver, one line. Blocks never copied out keep their GPU data."""
        with self._lock:
            if not self.on:
                return
            self.on = False
            self.why_off = why
        if not on_mover and self.mv.thread is not None:
            self.mv.thread.drain()  # queued copy-outs and copy-ins now return at once (off)
        with self._lock:
            self._restore_all()
        print(f"uvmprefetch: the copy path is off for the rest of this run: {why}; every mirror was copied back, "
              f"evictions go through UVM", file=sys.stderr)

    def _restore_all(self) -> None:
        rt, mv = self.mv.rt, self.mv
        try:
            mv._check(rt.cudaStreamSynchronize(mv.stream.cuda_stream), "cudaStreamSynchronize (restore)")
        except Exception:  # noqa: BLE001 - the copies below are synchronous either way
            pass
        kind = rt.cudaMemcpyKind.cudaMemcpyDefault
        for t in self.mirrors.values():
            if t.discarded:
                for p, n, h in t.ranges:
                    try:
                        mv._check(rt.cudaMemcpy(p, h, n, kind), "cudaMemcpy (restore)")
                    except Exception as e:  # noqa: BLE001 - nothing more can be done for this range; say it
                        self.m["restore_errors"] += 1
                        print(f"uvmprefetch: restoring {n} bytes at {p:#x} from its mirror failed: {e}",
                              file=sys.stderr)
                self.m["restored_blocks"] += 1
            if t.slot is not None:
                self.pool.give(t.slot)
        self._gate_set([t.block for t in self.mirrors.values()], _UNKNOWN)  # waiting ops go on (data restored)
        self.mirrors.clear()
        self._by_block.clear()
        self._shim_mirrors(False)

    def _shim_mirrors(self, on: bool) -> None:
        fn = getattr(getattr(self.shim, "lib", None), "uvmshim_set_mirrors", None)
        if fn is not None:
            fn(int(on))

    def close(self) -> None:
        """At the end of the run: mirrors back into their ranges (the program may go on using them), pool freed."""
        with self._lock:
            self.on = False
            if self.mirrors:
                self._restore_all()
        fn = getattr(getattr(self.shim, "lib", None), "uvmshim_set_attribution", None)
        if fn is not None:
            fn(None, None)  # the shim must not call back into Python any more
        self.pool.close()

    def result(self) -> dict:
        gate = self.mv.gate
        demanded = wait_ns = None
        if gate is not None:
            out = (ctypes.c_uint64 * 2)()
            gate.lib.uvmgate_demand_counters(out)
            demanded, wait_ns = int(out[0]), int(out[1])
        unattributed = None
        fn = getattr(getattr(self.shim, "lib", None), "uvmshim_unattributed", None)
        if fn is not None:
            fn.restype = ctypes.c_uint64
            unattributed = int(fn())
        return {"on": self.on, "off_reason": self.why_off, "eligibility": None if self.book.complete else self.book.why,
                "mirrors": len(self.mirrors), "mirror": self.pool.result(), **self.m, "gate_demanded_blocks": demanded,
                "gate_demand_wait_s": None if wait_ns is None else wait_ns / 1e9, "unattributed_launches": unattributed}


def _host_available() -> int:
    """``MemAvailable`` from /proc/meminfo (bytes), else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        import os
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def start(backend, lib, cfg) -> "tuple[CopyOut | None, str]":
    """The cuda backend's copy path under the C++ observer (``attach_native``), or None and why not."""
    mv = backend.mover
    if not mv.can_discard:
        return None, "off: the CUDA runtime has no cudaMemDiscardBatchAsync (CUDA >= 13.0 with a driver >= 580)"
    shim_lib = getattr(backend.shim, "lib", None)
    if shim_lib is None or not hasattr(shim_lib, "uvmshim_set_attribution"):
        return None, "off: the shim cannot tell unobserved kernel launches apart (rebuild it)"
    if not hasattr(lib.lib, "uvmobs_thread_in_op") or lib.lib.uvmgate_use_gil() != 1:
        return None, "off: the observer library cannot attribute launches to ops (rebuild it)"
    if _graph_count():
        return None, "off: torch.compile compiled graphs before the runtime started (their Triton kernels are not seen)"
    rt = mv.rt
    cap = cfg.host_limit.resolve(_host_available())

    def alloc(n: int) -> int:
        return int(mv._check(rt.cudaMallocHost(n), "cudaMallocHost (mirror pool)")[1])
    # an allocation counts as observed once an op the observer recorded touched it (the session's tracker)
    book = ObservedAllocations(observed=getattr(backend, "observed", None) or (lambda addr: False))
    pool = MirrorPool(cap, backend.block_size, alloc, rt.cudaFreeHost)
    cp = CopyOut(mv, book, pool, backend.block_size, shim=backend.shim, log=cfg.log)
    in_op = ctypes.cast(lib.lib.uvmobs_thread_in_op, ctypes.c_void_p)
    cp._callback = ctypes.CFUNCTYPE(None)(cp.unattributed)  # kept alive as long as the shim may call it
    shim_lib.uvmshim_set_attribution.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    shim_lib.uvmshim_set_attribution(in_op, ctypes.cast(cp._callback, ctypes.c_void_p))
    try:  # a graph torch.compile compiles later switches the path off before it first runs
        import torch._dynamo.callback as dynamo_callback
        dynamo_callback.on_compile_start(cp.compiling)
    except (ImportError, AttributeError):  # a torch without it cannot compile graphs this way either
        pass
    return cp, f"on: mirrors up to {cap >> 20} MiB of pinned host memory ({cfg.host_limit})"


def _graph_count() -> int:
    """Graphs ``torch.compile`` has compiled in this process (0 where torch._dynamo was never imported)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0

