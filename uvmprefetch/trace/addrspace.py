"""The first-fit address space: one implementation for the live runtime, the replay and trace stats.

Three places place tensors in one virtual address space with the same first-fit allocator:

- the live dryrun runtime (``uvmprefetch.runtime.observe.StorageTracker``), whose CPU allocator hands out
  addresses unlike PyTorch's CUDA caching allocator, so storages get addresses from ``FirstFit``;
- the simulator's ``allocator="first-fit"`` model (``uvmprefetch.sim.layout``), which replays a trace the
  live runtime recorded and must place every tensor where the live run placed it;
- ``uvmprefetch.trace.stats.working_set_bytes`` (``uvmprefetch info``), which counts distinct touched bytes
  with addresses reused as an allocator reuses them.

They must agree byte for byte -- same blocks, same footprint, same oversubscription at the same budget -- so
they share this one class instead of keeping three copies in step. It lives in ``trace/`` (observe) so that
``sim/`` and ``runtime/`` can both import it without ``sim`` importing the runtime (which imports torch).

The allocator: every request rounded up to ``align`` bytes (512, like the CUDA caching allocator), the
lowest hole that fits, freed neighbours coalesce, and when the highest hole reaches the top the top shrinks.
"""

from __future__ import annotations

import bisect

import numpy as np

ALIGN = 512  # the CUDA caching allocator rounds every request up to 512 bytes (kMinBlockSize)


class FirstFit:
    """First-fit address allocator with coalescing over one address space starting at 0.

    Parameters
    ----------
    align
        Every size is rounded up to a multiple of ``align`` bytes.
    min_size
        The smallest reservation; ``None`` = ``align`` (a zero-byte request still takes ``align`` bytes, as
        in the live runtime and the replay). ``uvmprefetch.trace.stats`` passes 0: there a zero-byte
        allocation takes no space (its historical behaviour, kept).

    Attributes
    ----------
    top
        End of the highest live reservation (the address space in use).
    peak_top
        Highest ``top`` ever: the address space the run reserved.
    """

    def __init__(self, align: int = ALIGN, min_size: int | None = None) -> None:
        self.align = int(align)
        self.min_size = self.align if min_size is None else int(min_size)
        self.holes: list[tuple[int, int]] = []  # sorted (start, size) holes below the top
        self.top = 0
        self.peak_top = 0

    def round(self, size: int) -> int:
        """The bytes a request of ``size`` reserves (idempotent: ``round(round(n)) == round(n)``)."""
        return max(self.min_size, -(-int(size) // self.align) * self.align)

    def alloc(self, size: int) -> int:
        """Reserve ``round(size)`` bytes at the lowest hole that fits, else at the top; returns the start."""
        size = self.round(size)
        for i, (start, hole) in enumerate(self.holes):
            if hole >= size:
                if hole == size:
                    del self.holes[i]
                else:
                    self.holes[i] = (start + size, hole - size)
                return start
        start = self.top
        self.top += size
        self.peak_top = max(self.peak_top, self.top)
        return start

    def free(self, start: int, size: int) -> None:
        """Give back the reservation ``alloc(size)`` returned at ``start`` (``size`` as asked or rounded)."""
        size = self.round(size)
        if size == 0:
            return
        h = self.holes
        i = bisect.bisect_left(h, (start, 0))
        h.insert(i, (start, size))
        # coalesce with the right and the left neighbour
        if i + 1 < len(h) and start + size == h[i + 1][0]:
            h[i] = (start, size + h[i + 1][1])
            del h[i + 1]
        if i > 0 and h[i - 1][0] + h[i - 1][1] == start:
            h[i - 1] = (h[i - 1][0], h[i - 1][1] + h[i][1])
            del h[i]
        if h and h[-1][0] + h[-1][1] == self.top:  # give the last hole back to the top
            self.top = h.pop()[0]


def alloc_events(t) -> list[tuple[int, int, int]]:
    """``t``'s allocations and frees as ``(free point, +1 alloc / -1 free, allocation)``, in the order an
    allocator sees them: at free point ``i``, frees of older allocations first (PyTorch frees the inputs of
    launch ``i-1`` before it allocates the outputs of launch ``i``), then the allocations made at ``i`` in id
    order, then the frees of allocations born at ``i`` (freed right after they were made); frees in
    ``free_rank`` order. The live runtime sees its storages in this order, so a replay in it reproduces
    the live addresses."""
    L = t.n_launches
    freed = np.flatnonzero(t.free_at >= 0)
    freed = freed[np.argsort(t.free_rank[freed], kind="stable")]
    free_pts = t.free_at[freed]
    fo = np.argsort(free_pts, kind="stable")
    freed, free_pts = freed[fo], free_pts[fo]
    fptr = np.searchsorted(free_pts, np.arange(L + 2))
    aptr = np.searchsorted(t.alloc_at, np.arange(L + 2))
    events = []
    for i in range(L + 1):
        fr = freed[fptr[i]:fptr[i + 1]]
        born_here = t.alloc_at[fr] == i
        events.extend((i, -1, int(a)) for a in fr[~born_here])
        events.extend((i, 1, a) for a in range(int(aptr[i]), int(aptr[i + 1])))
        events.extend((i, -1, int(a)) for a in fr[born_here])
    return events


def first_fit_addresses(t, min_size: int | None = None, align: int = ALIGN):
    """Place ``t``'s allocations with ``FirstFit(align, min_size)`` in ``alloc_events`` order.

    Returns
    -------
    base, rsize, peak_top, events
        Address and reserved bytes per allocation (int64 arrays), the peak address space, and the events
        in the order they were applied.
    """
    ff = FirstFit(align, min_size)
    rsize = np.maximum(ff.min_size, -(-t.alloc_size // ff.align) * ff.align).astype(np.int64)
    base = np.zeros(t.n_allocs, dtype=np.int64)
    events = alloc_events(t)
    for _, kind, a in events:
        if kind > 0:
            base[a] = ff.alloc(int(rsize[a]))
        else:
            ff.free(int(base[a]), int(rsize[a]))
    return base, rsize, ff.peak_top, events
