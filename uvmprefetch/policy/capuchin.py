"""``capuchin``: the swap half of Capuchin (Peng et al., ASPLOS'20), on unified-memory blocks.

Reproduced:

- **Online measurement** of the first training iteration (Capuchin's "measured execution", no static
  graph): every launch's accessed blocks and measured duration, and the frees, from the hooks only
  (``info.blocks``, ``info.duration``, ``on_free``). During that iteration nothing is decided (Capuchin's
  passive mode: on memory pressure the driver evicts its least recently migrated block, which plays the
  part of Capuchin's passive LRU swap).
- **Access-pattern-based swap selection**, from iteration 2 on: each block's consecutive uses form gaps
  (the last use of an iteration wraps to the first use of the next); Capuchin's *free time*
  ``FT = gap - swap-out time - swap-in time`` ranks them, largest first (gaps the framework frees in
  between, dead data with no write-back, come first). Gaps with ``FT > 0`` (a swap the gap can hide) are
  the paper's swap candidates; where they do not free enough, Capuchin recomputes: here (no recompute)
  ``swap_all=true`` (default) goes on swapping the remaining gaps by FT, accepting a late swap-in, and
  ``swap_all=false`` leaves the rest to the driver. Candidates are taken until the modelled memory
  occupancy fits the GPU at every launch (Capuchin: until the peak memory saving is reached); with
  enough memory nothing is swapped.
- **Swap-out after the last use before a long gap** (an eviction issued when the next launch starts,
  written back if dirty) and **swap-in in time**: the in-trigger is back-traced from the next use through
  the measured launch durations by a fixed lead of ``lead_blocks`` block copy times (+ ``lead_s``).
  Swap-ins are cut to the room the swap-outs leave; the rest wait for room, soonest need first (the
  effect of Capuchin's correction for swap-ins queued behind each other). ``alap=true`` places every
  swap-in as late as a FIFO link model lets it finish instead; measured worse (it pulls triggers so early
  on a saturated link that swapped-in blocks hold the room the plan freed).

Not reproduced:

- **Recomputation** (half of Capuchin) is not: a unified-memory policy can move data, not re-run kernels.
  Gaps Capuchin would recompute are left resident here (or the driver pages them).
- Capuchin works on tensors; here the unit is the 2 MiB block (several small tensors share one, so a
  block's gaps are shorter than its tensors').
- Capuchin refines in-triggers at run time when a swap-in arrives late; the plan here is fixed once
  measured. PyTorch's first step differs from the next (optimizer state creation, allocator warm-up:
  740 launches against 418 for ResNet-50 b32), so by default (``reprofile=changed``) the policy keeps
  measuring and re-plans when an iteration's launches or blocks differ from the profile;
  ``reprofile=never`` is the paper's measure-once (``profile_iter`` picks the iteration).
- Capuchin's swap-out is a copy overlapping compute, then a free; here it is the simulator's eviction
  (D2H write-back of a dirty block; the room comes free when the write-back ends).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._swapplan import Gaps, Profile, ProfiledSwapPolicy, check_common
from .base import Params


@dataclass(frozen=True)
class CapuchinParams(Params):
    profile_iter: int = 0  # iteration measured (0: the first, as in the paper)
    reprofile: str = "changed"  # never | changed (re-plan when an iteration differs from the profile) | always
    lead_blocks: float = 8.0  # swap-in lead in block link times (a block's copy time x this), plus lead_s
    lead_s: float = 0.0  # extra lead of every swap-in beyond the link-time back-trace
    headroom: int = 0  # blocks of capacity kept free by the plan
    alap: bool = False  # back-trace swap-ins on a FIFO link model (False: the fixed lead of lead_blocks copy times)
    swap_all: bool = True  # when FT > 0 gaps do not free enough, swap the rest too (by FT; the paper recomputes)

    def __post_init__(self) -> None:
        check_common("capuchin", self)


class CapuchinPolicy(ProfiledSwapPolicy):
    """Capuchin's swap: measured first iteration, free-time-ranked swap-out, back-traced swap-in."""

    name: ClassVar[str] = "capuchin"
    Params: ClassVar[type] = CapuchinParams
    description: ClassVar[str] = ("Capuchin (ASPLOS'20), swap only: online-measured iteration, FT-ranked swaps, "
                                  "timed swap-in")

    def _priority(self, g: Gaps, prof: Profile) -> tuple[np.ndarray, np.ndarray]:
        dead = g.dead_at >= 0
        ft = g.gap_s - 2.0 * self.t_blk
        ft = np.where(dead, g.gap_s, ft)  # a freed block needs neither write-back nor a copy back
        pri = ft + np.where(dead, 1e9, 0.0)  # dead gaps first: free memory
        return pri, (np.ones_like(dead) if self.params.swap_all else ft > 0)
