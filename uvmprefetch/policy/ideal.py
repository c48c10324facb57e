"""``ideal``: infinite GPU memory. Every launch starts when the previous one ends; its time is the sum of the
launch durations, the denominator of every slowdown."""

from __future__ import annotations

from typing import ClassVar

from .base import Policy


class IdealPolicy(Policy):
    """Infinite memory: no faults, no transfers (the simulator skips its memory model when ``ideal``)."""

    name: ClassVar[str] = "ideal"
    ideal: ClassVar[bool] = True
    description: ClassVar[str] = "infinite GPU memory: the sum of launch durations (denominator of slowdowns)"
