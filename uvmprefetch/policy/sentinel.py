"""``sentinel``: Sentinel's data placement (Ren et al., HPCA'21) on unified-memory blocks.

Sentinel manages a fast (GPU) and a slow (host) memory for DNN training with the help of a profile of one
training step. Reproduced:

- **Profiling-guided, online**: the first iteration is profiled from the hooks (blocks per launch,
  measured durations, frees); Sentinel profiles the first step with page-level access tracking. Nothing is
  decided during it (the driver pages on its own).
- **Lifetime classes**: a block whose uses in the iteration all fall within ``short_s`` seconds (or
  ``short_launches`` launches) is *short-lived* (temporaries, activations consumed right away) and is
  kept resident: never chosen for eviction. The others are *long-lived*.
- **Evict long-lived, rarely used data**: among long-lived blocks' idle gaps, the plan evicts first the
  blocks with the fewest uses per iteration (``max_uses``: weights and optimizer state used in forward,
  backward and the step; activations kept for backward), longest gap first, then the other long-lived
  gaps by length, until the modelled occupancy fits the GPU at every launch (nothing is evicted when the
  iteration fits).
- **Prefetch before the next use, at migration-interval granularity**: Sentinel migrates at the
  boundaries of *migration intervals* (groups of layers); here an interval is ``interval`` launches, and
  a block's prefetch is issued at the start of the interval that begins at least ``lead_blocks`` block
  copy times before its use. Prefetches are cut to the room the evictions leave (the rest wait for room,
  soonest need first).

Not reproduced:

- Sentinel's **allocation co-location** (placing objects of the same lifetime in the same pages to avoid
  false sharing) needs control of the allocator: the layout here is the caching allocator's, fixed by the
  trace; the lifetime classes are therefore per 2 MiB block, not per tensor.
- Sentinel's **trial-and-error tuning** of the interval length over the first steps and its
  OS page-migration mechanics (page-table scanning) are not: ``interval`` is a parameter.
- Sentinel profiles one step; PyTorch's first step differs from the next (optimizer state creation,
  allocator warm-up), so by default (``reprofile=changed``) the profile is re-taken and the plan redone
  when an iteration's launches or blocks differ from it; ``reprofile=never`` profiles once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ._swapplan import Gaps, Profile, ProfiledSwapPolicy, check_common
from .base import Params


@dataclass(frozen=True)
class SentinelParams(Params):
    profile_iter: int = 0  # iteration profiled (0: the first)
    reprofile: str = "changed"  # never | changed (re-plan when an iteration differs from the profile) | always
    short_s: float = 0.0  # live span (first use start .. last use end) at or below which a block is short-lived
    short_launches: int = 4  # ... or all its uses within this many launches
    max_uses: int = 3  # long-lived blocks with at most this many uses per iteration are "rarely used"
    rare_weight: float = 4.0  # their gaps count this many times their length in the eviction order
    interval: int = 8  # launches per migration interval (prefetch granularity)
    lead_blocks: float = 8.0  # prefetch lead in block copy times, plus lead_s
    lead_s: float = 0.0
    headroom: int = 0  # blocks of capacity kept free by the plan

    def __post_init__(self) -> None:
        check_common("sentinel", self)
        self.check_ints("sentinel", ("short_launches", "max_uses"), least=0)
        self.check_ints("sentinel", ("interval",))
        if not self.rare_weight >= 1:
            raise ConfigError(f"sentinel: rare_weight must be >= 1, got {self.rare_weight!r}")
        if not self.short_s >= 0:
            raise ConfigError(f"sentinel: short_s must be >= 0, got {self.short_s!r}")


class SentinelPolicy(ProfiledSwapPolicy):
    """Sentinel: profiled lifetimes; short-lived data stays, long-lived rarely used data is evicted and prefetched."""

    name: ClassVar[str] = "sentinel"
    Params: ClassVar[type] = SentinelParams
    description: ClassVar[str] = ("Sentinel (HPCA'21): profiled lifetimes, short-lived resident, long-lived rarely-used "
                                  "swapped")

    def on_start(self, ctx) -> None:
        super().on_start(ctx)
        self._interval = self.params.interval

    def _priority(self, g: Gaps, prof: Profile) -> tuple[np.ndarray, np.ndarray]:
        P = self.params
        # Live span in launches: per block, last use - first use (the gaps of one block are contiguous), and
        # whether its data dies (is freed) somewhere in the iteration: a short-lived block holds data only
        # over its short span; one whose data survives to the next iteration is long-lived whatever its span.
        n = g.blk.shape[0]
        if n:
            starts = np.flatnonzero(np.r_[True, g.blk[1:] != g.blk[:-1]])
            cnt = np.diff(np.r_[starts, n])
            first = np.repeat(g.p[starts], cnt)
            last = np.repeat(g.p[np.r_[starts[1:], n] - 1], cnt)
            dies = np.repeat(np.maximum.reduceat((g.dead_at >= 0).astype(np.int8), starts) > 0, cnt)
        else:
            first = last = np.zeros(0, dtype=np.int64)
            dies = np.zeros(0, dtype=bool)
        short = (((last - first) <= P.short_launches) | (g.span_s <= P.short_s)) & dies
        rare = g.uses <= P.max_uses
        dead = g.dead_at >= 0
        pri = g.gap_s * np.where(rare, P.rare_weight, 1.0) + np.where(dead, 1e9, 0.0)
        return pri, ~short | dead
