"""The host link in the simulator: its two copy engines (``Link``, which several GPUs may share), the FIFO queues
of blocks the model keeps in NumPy arrays (``Queue``), and when transfers served in order end (``fifo_finish``)."""

from __future__ import annotations

import numpy as np


class Queue:
    """A growable FIFO of (block, value) pairs in NumPy arrays (head/tail indices, compacted when half empty)."""

    def __init__(self, vdtype) -> None:
        self.blk = np.zeros(1024, dtype=np.int64)
        self.val = np.zeros(1024, dtype=vdtype)
        self.head = 0
        self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def push(self, blocks: np.ndarray, values) -> None:
        n = blocks.shape[0]
        if self.tail + n > self.blk.shape[0]:
            live = self.tail - self.head
            cap = max(2 * (live + n), 1024)
            blk = np.zeros(cap, dtype=np.int64)
            val = np.zeros(cap, dtype=self.val.dtype)
            blk[:live] = self.blk[self.head:self.tail]
            val[:live] = self.val[self.head:self.tail]
            self.blk, self.val, self.head, self.tail = blk, val, 0, live
        self.blk[self.tail:self.tail + n] = blocks
        self.val[self.tail:self.tail + n] = values
        self.tail += n

    def view(self) -> tuple[np.ndarray, np.ndarray]:
        return self.blk[self.head:self.tail], self.val[self.head:self.tail]

    def push_sorted(self, blocks: np.ndarray, values: np.ndarray) -> None:
        """Push and keep the queue sorted by value (stable): SSD write-backs end out of D2H order."""
        blk, val = self.view()
        if not blk.shape[0] or values.min() >= val[-1]:
            self.push(blocks, values)
            return
        allb, allv = np.concatenate([blk, blocks]), np.concatenate([val, values])
        o = np.argsort(allv, kind="stable")
        self.head = self.tail = 0
        self.push(allb[o], allv[o])


class Link:
    """The host link's two copy engines: when each is next free, and how long each has been busy.

    Every ``GpuModel`` has one of its own unless several are given the same object: data-parallel GPUs
    behind one PCIe switch share its bandwidth (``sim/multigpu.py``), and a transfer of any of them then
    queues behind what the others issued before it.
    """

    __slots__ = ("h2d", "d2h", "busy_htod", "busy_dtoh", "members", "fault_end")

    def __init__(self) -> None:
        self.h2d = 0.0  # when the host-to-device engine is next free
        self.d2h = 0.0
        self.busy_htod = 0.0  # seconds of transfer time queued on it so far
        self.busy_dtoh = 0.0
        self.members: list = []  # the GpuModels using it (a fault delays every member's queued prefetches)
        # When the last fault migration ends: faults go ahead of queued prefetches but not of each other (with
        # one GPU a launch's faults always end before the next launch's begin, so this only binds when shared).
        self.fault_end = 0.0


def clear_flags(flags: np.ndarray, b: np.ndarray) -> int:
    """Clear ``flags`` at blocks ``b`` (repeats allowed); returns how many were set (a per-state count's decrement)."""
    h = b[flags[b]]
    if not h.size:
        return 0
    h = np.unique(h)
    flags[h] = False
    return int(h.shape[0])


def fifo_finish(start: float, rooms: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Finish times of transfers served in order by one engine free at ``start``; transfer ``k`` takes
    ``times[k]`` and cannot start before ``rooms[k]`` (when its room on the GPU is free).

    s_k = max(e_{k-1}, r_k), e_k = s_k + t_k  =>  e_k = C_k + max(start, max_{j<=k}(r_j - C_{j-1})).
    """
    c = np.cumsum(times)
    return c + np.maximum(start, np.maximum.accumulate(rooms - (c - times)))
