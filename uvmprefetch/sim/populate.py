"""Populates in the simulated GPU (docs/simulator.md "Populates"): a Decision's ``populate`` maps dead blocks whose
pages were dropped on the GPU without data, beside the H2D queue (the live cuda backend: a prefetch of a discarded
range on its discard stream, ``runtime/mover.py`` ``Mover.populate``). ``Populates`` holds this part of ``GpuModel``
(``sim/engine.py``), which has the blocks' state, the room and the metrics ``m`` these use, and keeps ``dropped``
up to date where blocks leave the GPU.

Fresh blocks (``GpuModel(fresh=...)``, ``Layout.fresh``): memory no processor has populated yet has no pages
anywhere, and the driver maps it without data where it is first touched (a fault zero-fills it, a prefetch or a
populate maps it; no byte crosses the link). On a profile that models populates such a block starts dead and
dropped, and stays dead until a launch touches it.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError


class Populates:
    """Populates, as part of ``GpuModel``."""

    def _populate_setup(self, gpu, n: int, fresh=None) -> None:
        # A block off the GPU whose pages were dropped while dead (no copy of it anywhere: a populate maps it without
        # data), and when each populate ends (a launch that needs the block waits for it).
        self.dropped = np.zeros(n, dtype=bool)
        self.pop_ready = np.zeros(n, dtype=np.float64)
        self._pop_end = 0.0
        # (a profile without a populate cost has no figure to charge: its populates are prefetches)
        self.populate_on = self.discards and gpu.populates
        self.m.update(populated_blocks=0, populate_calls=0, refused_populates=0, populate_stall_s=0.0)
        self.fresh = np.zeros(n, dtype=bool)  # (no data anywhere until a launch touches it)
        if fresh is not None and gpu.populates and not self.ideal:
            f = np.asarray(fresh, dtype=bool)
            if f.shape != (n,):
                raise ConfigError(f"fresh: {f.shape[0] if f.ndim == 1 else f.shape} entries for {n} blocks")
            self.fresh[:] = f
            self.dead |= f
            self.dropped |= f

    def _populate_wait(self, need: np.ndarray, ready: float) -> float:
        """When a launch that needs ``need`` and could start at ``ready`` starts, with its populates done; the wait
        beyond ``ready`` is counted in ``populate_stall_s``."""
        pw = float(self.pop_ready[need].max())
        if pw <= ready:
            return ready
        self.m["populate_stall_s"] += pw - ready
        return pw

    def _populate(self, b: np.ndarray, now: float) -> None:
        """Map ``b`` on the GPU without data, beside the H2D queue, where each is dead and its pages were dropped (a
        prefetch of a discarded range: the driver allocates and maps, no byte crosses the link); the others are
        prefetched (``refused_populates``). One call per decision, ``repopulate_call_s + k * repopulate_block_s``
        of GPU time (the profile's figure for a prefetch of a discarded range), from ``now`` or when its room is
        free; a launch that needs one of the blocks waits until it ends."""
        b = self._to_bring(b)
        ok = self.dead[b] & self.dropped[b] if self.populate_on else np.zeros(b.shape[0], dtype=bool)
        if not ok.all():
            self.m["refused_populates"] += int((~ok).sum())
            self._prefetch(b[~ok], now)
            b = b[ok]
        b, rooms = self._room_for(b, now)
        if not b.size:
            return
        g, n = self.gpu, b.shape[0]
        start = max(now, self._pop_end, float(rooms[-1]), float(self.wb_done[b].max()))
        end = start + g.repopulate_call_s + n * g.repopulate_block_s
        self._pop_end = end
        self.pop_ready[b] = end
        self.resident[b] = True
        self.n_resident += n
        self._migrated(b)
        self._lrm.push(b, self.mig_seq[b])
        self._note_used()
        self.m["populated_blocks"] += n
        self.m["populate_calls"] += 1
        if self._timeline:
            self._since[b] = end
            self.events["h2d"].append((start, end, n, "populate"))
