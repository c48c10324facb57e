"""act (simulated): the unified-memory simulator, our measuring instrument.

``layout`` places a trace's allocations (caching-allocator model) and precomputes per-launch blocks;
``engine.GpuModel`` is the steppable GPU (driver, copy engines, faults); ``replay.replay`` drives it from a
trace and returns the metrics. See ``docs/simulator.md``.
"""

from .engine import GpuModel, SimError
from .layout import Layout, build_layout
from .replay import capacity_for, launch_durations, replay

__all__ = ["GpuModel", "Layout", "SimError", "build_layout", "capacity_for", "launch_durations", "replay"]
