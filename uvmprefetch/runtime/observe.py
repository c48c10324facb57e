"""observe (live): what a running PyTorch program launches, what each launch touches, which tensors die,
and how far the GPU has got.

- **Launches and accesses** come from the PyTorch dispatcher through a ``TorchDispatchMode`` entered on the
  main thread. Backward is covered: on the CPU the autograd engine runs backward on the calling thread; on
  CUDA it runs on a device thread, and the engine carries the caller's thread-local state (the dispatch-mode
  stack included) over to it. A launch's phase is ``backward`` when ``torch._C._current_autograd_node()`` is
  set, ``optimizer`` between the global optimizer step pre/post hooks, ``forward`` otherwise; each optimizer
  step ends an iteration.
- **Tensor deaths** (this Python observer) come from finalizers on storages (PyTorch keeps one Python object per live storage, so a
  ``weakref.finalize`` fires when the storage itself dies). Finalizers run on whatever thread drops the last
  reference, so they only append to a queue; the session drains it before the next launch (hook order:
  ``on_free`` before ``on_launch``).
- **Addresses.** The cuda backend uses real device addresses (managed memory). The dryrun backend runs on
  the CPU, whose allocator hands out addresses unlike PyTorch's CUDA caching allocator, so storages get
  addresses from ``VirtualLayout`` (``trace.addrspace.FirstFit``, shared with the replay and trace stats): a
  first-fit allocator over one address space that reuses freed ranges the way the caching allocator reuses its
  segments.
- **GPU progress** (cuda): ``GpuProgress`` records a CUDA event after each observed launch; the launches
  whose events have not completed are queued on the GPU, and their blocks are never evicted.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from ..trace.addrspace import ALIGN, FirstFit  # noqa: F401 - ALIGN re-exported
from ..trace.format import PHASE
# What an op launches and touches is the recorder's knowledge (issue 2); the live observer reuses it so that
# a live trace and a recorded one describe the same op the same way.
from ..trace.recorder import accesses_of, launches_kernel, tensor_extent  # noqa: F401 - re-exported

# The dryrun address space is the shared first-fit allocator (trace/addrspace.py): the replay of a live trace
# (sim ``allocator="first-fit"``) and trace stats use the same class, so all three agree byte for byte.
VirtualLayout = FirstFit


@dataclass(eq=False)
class Storage:
    """One live storage as the runtime sees it (hashed by identity: one object per allocation id)."""

    id: int  # allocation id (dense, in first-sight order; also the trace's allocation id)
    key: int  # the storage's data_ptr when first seen
    base: int  # address in the backend's address space
    nbytes: int
    owner: int = 0  # id() of the Python storage object holding this memory
    gone: bool = False  # queued as dead once (a resized storage's old memory, then the storage itself)


class StorageTracker:
    """Live storages -> addresses and per-block reference counts; deaths queued for the session.

    ``address_of`` picks the address space: ``None`` = ``VirtualLayout`` (dryrun); a callable
    ``storage -> int`` = real addresses (cuda).

    A storage resized in place (``UntypedStorage.resize_``, not a dispatched op: FSDP2 frees its unsharded
    parameters with ``resize_(0)`` after each use and re-allocates them with ``resize_(n)`` for the next) keeps
    its Python object but gets new memory: when an op shows the object at another address or size, its
    previous memory is queued as dead, so the books do not grow with every all-gather. Memory is only ever
    counted dead for the object that held it (its death or its resize), never because another object shows
    up at the same address.
    """

    def __init__(self, block_size: int, virtual: bool) -> None:
        self.block_size = block_size
        self.layout = VirtualLayout() if virtual else None
        self.live: dict[int, Storage] = {}
        self.dead: collections.deque = collections.deque()  # Storage objects, appended by finalizers
        self.next_id = 0
        self.live_bytes = 0
        self.peak_live_bytes = 0
        self.block_refs: dict[int, int] = {}  # block -> live storages on it
        self._lock = threading.Lock()
        self._by_owner: dict[int, Storage] = {}  # id(Python storage object) -> its current memory

    def lookup(self, storage) -> Storage | None:
        """The ``Storage`` for a torch ``UntypedStorage``, registering it on first sight (its death comes from a
        finalizer on its Python object, or from its resize: the Python observer)."""
        nbytes = storage.nbytes()
        if nbytes <= 0:
            return None
        key = storage.data_ptr()
        owner = id(storage)
        s = self.live.get(key)
        if s is not None and s.nbytes == nbytes and s.owner == owner:
            return s
        with self._lock:
            prev = self._by_owner.get(owner)
            if prev is not None and not prev.gone:
                if prev.key == key and prev.nbytes == nbytes:
                    return prev  # another storage aliases this memory and took ``live[key]``: keep both
                self.dead.append(prev)  # resized in place: the object's old memory is free
            s = self.register(key, nbytes, owner)
            self._by_owner[owner] = s
        if prev is None:
            weakref.finalize(storage, self._owner_died, owner)
        return s

    def at(self, key: int, nbytes: int) -> Storage:
        """The live ``Storage`` at address ``key`` of ``nbytes`` (the C++ observer's ranges), registering it on first
        sight; one of another size there died unreported (its free was not seen): it is queued dead first."""
        s = self.live.get(key)
        if s is not None:
            if s.nbytes == nbytes:
                return s
            self.dead.append(s)
        with self._lock:
            return self.register(key, nbytes)

    def kill(self, key: int) -> None:
        """The allocation at address ``key`` was freed (an allocator event): its storage, if one was seen, is
        queued dead."""
        s = self.live.get(key)
        if s is not None:
            self.dead.append(s)
            del self.live[key]

    def register(self, key: int, nbytes: int, owner: int = 0) -> Storage:
        """A new live storage at ``key`` (the caller holds the lock)."""
        base = self.layout.alloc(nbytes) if self.layout is not None else key
        s = Storage(self.next_id, key, base, nbytes, owner)
        self.next_id += 1
        self.live[key] = s
        self.live_bytes += nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        refs = self.block_refs
        for b in self.blocks_of(base, nbytes):
            refs[b] = refs.get(b, 0) + 1
        return s

    def _owner_died(self, owner: int) -> None:
        s = self._by_owner.pop(owner, None)
        if s is not None:
            self.dead.append(s)

    def blocks_of(self, start: int, length: int) -> range:
        return range(start // self.block_size, (start + max(length, 1) - 1) // self.block_size + 1)

    def counts(self) -> tuple[int, int]:
        """(live storages, their bytes): what the discard guard compares with the caching allocator's counts."""
        return len(self.live), self.live_bytes

    def holds(self, address: int, nbytes: int) -> bool:
        """Is a live storage of ``nbytes`` registered at ``address`` (its data_ptr when first seen)?"""
        s = self.live.get(address)
        return s is not None and s.nbytes == nbytes

    def describe(self, address: int) -> str:
        """What the tracker knows of a storage at ``address`` (the discard guard's refused cases)."""
        s = self.live.get(address)
        if s is None:
            return "no live storage at this address in the tracker"
        return f"live storage {s.id} ({s.nbytes} B) in the tracker"

    def drain_dead(self) -> tuple[list[Storage], list[int]]:
        """Storages that died since the last call, and the blocks no live storage touches any more."""
        died, freed = [], []
        dead, live, refs, layout = self.dead, self.live, self.block_refs, self.layout
        with self._lock:
            while dead:
                s = dead.popleft()
                if s.gone:
                    continue
                s.gone = True
                if live.get(s.key) is s:
                    del live[s.key]
                self.live_bytes -= s.nbytes
                for b in self.blocks_of(s.base, s.nbytes):
                    n = refs.get(b, 0) - 1
                    if n <= 0:
                        refs.pop(b, None)
                        freed.append(b)
                    else:
                        refs[b] = n
                if layout is not None:
                    layout.free(s.base, s.nbytes)
                died.append(s)
        return died, freed


def make_mode(session):
    """A ``TorchDispatchMode`` that reports every kernel-launching op to ``session.on_op`` after it ran.

    Reporting after the op lets outputs be seen; on a GPU the kernel is only queued by then, and the policy's
    prefetches target the launches after it, so nothing is lost. Any exception inside the runtime is handed
    to ``session.fail`` (log once, degrade) and never reaches the user's program.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    current_node = torch._C._current_autograd_node
    graph_task = torch._C._current_graph_task_id
    clock = time.perf_counter

    class UvmPrefetchMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            t0 = clock()
            out = func(*args, **(kwargs or {}))
            t1 = clock()
            if session.active and launches_kernel(func):
                try:
                    # a node being evaluated, or a backward pass's final callbacks (DDP's, FSDP2's reductions)
                    backward = current_node() is not None or graph_task() != -1
                    session.on_op(func, args, kwargs, out, backward)
                except Exception as e:  # noqa: BLE001 - the prefetcher never kills training
                    session.fail("observer", e)
            # (host time of the op and of what the runtime adds after it: the report's ``observe_time``)
            session.ops += 1
            session.op_s += t1 - t0
            session.after_op_s += clock() - t1
            return out

    return UvmPrefetchMode()


class GpuProgress:
    """Which observed launches the GPU has finished (cuda backend).

    One CUDA event per launch, recorded on the current stream right after it was queued; events are reused
    from a pool once completed. Each queued launch pins its blocks (a per-block count), so the blocks of
    launches still in flight are one vector comparison away: the runtime must not evict them.
    """

    def __init__(self, max_blocks: int, event_factory=None) -> None:
        if event_factory is None:
            import torch
            event_factory = torch.cuda.Event
        self._new_event = event_factory  # tests pass fake events that complete on demand
        self._pool: list = []
        self._pending: collections.deque = collections.deque()  # (launch index, blocks, event)
        self.pins = np.zeros(max_blocks, dtype=np.int32)
        self.completed = -1

    def record(self, index: int, blocks: np.ndarray) -> None:
        ev = self._pool.pop() if self._pool else self._new_event()
        ev.record()
        self.pins[blocks] += 1  # blocks are unique: no need for np.add.at
        self._pending.append((index, blocks, ev))

    def poll(self) -> int:
        """Advance ``completed`` past every launch whose event has completed; returns it."""
        while self._pending and self._pending[0][2].query():
            index, blocks, ev = self._pending.popleft()
            self.pins[blocks] -= 1
            self.completed = index
            self._pool.append(ev)
        return self.completed

    def protected_mask(self, running: np.ndarray, poll: bool = True) -> np.ndarray:
        """Bool mask of blocks of launches dispatched but not finished on the GPU, plus ``running`` (``poll``:
        first ask the GPU how far it got)."""
        if poll:
            self.poll()
        m = self.pins > 0
        m[running] = True
        return m

    def depth(self) -> int:
        return len(self._pending)


PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = PHASE["forward"], PHASE["backward"], PHASE["optimizer"]
