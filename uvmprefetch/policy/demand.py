"""``demand``: naive unified memory, the NVIDIA driver on its own.

Everything this baseline does is the driver's, so it lives in the simulator's driver model
(``sim/engine.py``) and this policy decides nothing:

- fault-driven migration: a block moves when a kernel touches it, in fault batches;
- the density ("tree") prefetcher: inside a 2 MiB VA block, once more than 51 % of it is on the GPU or
  faulting, the rest comes along. With 64 KiB blocks the engine models it over each 2 MiB region; with
  2 MiB blocks a faulted block migrates whole and costs ``ceil(0.51 * 32) = 17`` fault entries (the point
  where the density rule takes over from page-by-page faults);
- eviction of the least recently *migrated* 2 MiB block when the GPU is full.

The driver never learns that PyTorch freed a tensor: ``invalidates_frees = False`` keeps freed blocks
live, so they are written back when evicted (if dirty) and migrated again when reused.
"""

from __future__ import annotations

from typing import ClassVar

from .base import EvictPath, Policy


class DemandPolicy(Policy):
    """The driver alone: no prefetch, no pre-eviction, no invalidation of freed memory."""

    name: ClassVar[str] = "demand"
    description: ClassVar[str] = "naive UM: fault-driven migration, 51 % density prefetch, LRM eviction"
    invalidates_frees: ClassVar[bool] = False
    evict_path: ClassVar[EvictPath] = EvictPath.UVM  # the driver has no copy path (--evict auto keeps UVM's)
