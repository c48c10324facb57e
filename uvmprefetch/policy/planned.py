"""What the offline planning policies (``g10``, ``flashneuron``, ``vdnn``, the swap planners) share: the check that
the whole trace was given, and the follow-the-plan bookkeeping of the ones that bring back what the driver evicted.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import ConfigError
from .base import Decision, LaunchInfo, Policy, PolicyContext, ResidencyView


def require_trace(ctx: PolicyContext, what: str) -> None:
    """Raise a ``ConfigError`` starting with ``what`` unless ``ctx`` carries the whole trace and its layout."""
    if ctx.layout is None or ctx.trace is None:
        raise ConfigError(f"{what}: it needs the whole trace (use it with replay/bench)")


class PlannedPolicy(Policy):
    """An offline policy that plans the whole run at ``on_start`` (``_plan``, timed as ``planning_s``; it sets
    ``n_planned``, the launches the plan covers) and then follows the plan launch by launch (``_decide``).

    ``follow_uses(layout)`` turns on the bookkeeping of a plan that also brings back the blocks the driver evicted
    on its own: ``nu`` (per block, its next use, kept current as launches run) and ``stray`` (the blocks
    ``on_evict`` reported since the policy last looked)."""

    offline = True
    needs = "is an offline policy"  # the reason the error for a missing trace gives, after the policy's name
    n_planned = 0
    stray: np.ndarray | None = None

    def on_start(self, ctx: PolicyContext) -> None:
        super().on_start(ctx)
        require_trace(ctx, f"{self.name} {self.needs}")
        t0 = time.perf_counter()
        self._plan(ctx)
        self.planning_s = time.perf_counter() - t0

    def _plan(self, ctx: PolicyContext) -> None:
        raise NotImplementedError

    def _decide(self, i: int, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        """Launch ``i`` (< ``n_planned``) is next: what the plan does now."""
        raise NotImplementedError

    def on_launch(self, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        i = info.index
        if i >= self.n_planned:
            return None
        if i > 0 and self.stray is not None:  # launch i - 1 has run: its blocks move on to their next use
            self.lay.ran(self.nu, i - 1)
        return self._decide(i, info, state)

    def follow_uses(self, layout) -> None:
        self.lay = layout
        self.nu = layout.first_use()
        self.stray = np.zeros(layout.max_blocks, dtype=bool)

    def on_evict(self, blocks: np.ndarray) -> None:
        if self.stray is not None:
            self.stray[blocks] = True
