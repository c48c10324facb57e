"""Driving a policy through its hooks by hand, without the simulator: a residency view that applies Decisions
at once, and a loop over a repeating sequence of launches."""

from __future__ import annotations

import numpy as np

from uvmprefetch.policy.base import LaunchInfo


class FakeView:
    """Minimal ResidencyView: the test moves blocks by applying Decisions instantly."""

    def __init__(self, n, cap):
        self.resident = np.zeros(n, dtype=bool)
        self.in_flight = np.zeros(n, dtype=bool)
        self.capacity_blocks = cap
        self.now = 0.0

    @property
    def used_blocks(self):
        return int(self.resident.sum() + self.in_flight.sum())

    def apply(self, dec):
        if dec is None:
            return
        for arr in (dec.discard, dec.evict):
            self.resident[arr] = False
        for b in dec.prefetch:
            assert self.used_blocks < self.capacity_blocks, "policy over-committed the capacity"
            self.resident[b] = True


def drive(pol, view, seq, iters, start_index=0, on_decision=None, known_accesses=True, forget=False):
    """Run ``iters`` iterations of the launches ``seq`` (each launch's blocks; it writes its first block).
    ``on_decision(iteration, k, decision)`` sees each launch's Decision; the launch's blocks not resident after
    it fault. ``known_accesses=False``: the hooks do not see the blocks (DeepUM's setting, learning from faults
    only); ``forget``: nothing is resident at an iteration's start. Returns the next launch index."""
    i = start_index
    for it in range(iters):
        if forget:
            view.resident[:] = False
        for k, blocks in enumerate(seq):
            seen = dict(blocks=blocks, write_blocks=blocks[:1]) if known_accesses else dict(known_accesses=False)
            info = LaunchInfo(index=i, exec_id=1000 + k, name=k, phase=1, iteration=it, duration=1e-3, **seen)
            dec = pol.on_launch(info, view)
            if on_decision:
                on_decision(it, k, dec)
            view.apply(dec)
            missing = blocks[~view.resident[blocks]]
            if missing.size:
                pol.on_fault(info, missing)
                view.resident[missing] = True
            i += 1
        pol.on_iteration(it)
    return i
