"""``vdnn``: vDNN's layer-wise offload/prefetch (Rhu et al., MICRO'16) on unified-memory blocks.

vDNN is a memory manager inside the framework: it is given the network graph before training starts and
plans statically from it. The hooks carry no graph, so this policy is ``offline`` and reads the
*structure* of the run from the trace (launch phases, allocation kinds, kernel names, which launch reads
which block next); it does not use durations or any timing of the future. Reproduced:

- **Layers**: in forward, a layer is one launch (vDNN's CONV / ACTV / POOL layers are each one cuDNN
  call); its input feature maps are the blocks of ``activation`` / ``input`` allocations it reads.
- **Offload in forward**: a layer input block whose next use is in the backward pass (the forward pass
  does not read it again) is offloaded right after that layer (an eviction issued when the next launch
  starts; the write-back runs on the D2H engine alongside compute, as vDNN's ``cudaMemcpyAsync`` does).
  ``mode=all`` (vDNN_all) offloads every layer's inputs, ``mode=conv`` (vDNN_conv) only the inputs of
  convolution launches (kernel name contains ``conv``), ``mode=dyn`` (vDNN_dyn, default) picks no
  offloading if the modelled peak fits the GPU, else ``conv`` if that fits, else ``all``.
- **Prefetch one layer ahead in backward**: a backward "layer" is a launch that reads offloaded data;
  when backward layer ``k`` starts, the offloaded data of layer ``k+1`` (the next launch that reads
  offloaded data) is prefetched; the first backward launch also prefetches for the first such layer. A
  prefetch not done when its layer starts stalls it (vDNN's layer synchronisation).

Not reproduced:

- vDNN_dyn's choice of convolution algorithms (workspace vs speed) and its trial passes: ``dyn`` only
  picks the offload set, from a static occupancy model (blocks live from first to last use, minus the
  offloaded intervals).
- vDNN releases offloaded buffers with ``cudaFree`` and never pages: everything it does not manage (weights,
  gradients, workspaces) must fit or it fails. Here the driver pages whatever vDNN leaves when memory is
  short, so vDNN runs at any oversubscription.
- Blocks are 2 MiB: a block shared by an activation and a weight (small tensors) is offloaded only when
  its next use of any kind is in backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ..trace.format import KIND, PHASE, READ
from .base import EMPTY, Decision, LaunchInfo, Params, PolicyContext, ResidencyView
from .planned import PlannedPolicy
from .tables import group_by

MODES = ("dyn", "all", "conv", "none")


@dataclass(frozen=True)
class VdnnParams(Params):
    mode: str = "dyn"  # all | conv | dyn | none

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"vdnn: mode must be one of {', '.join(MODES)}, got {self.mode!r}")


class VdnnPolicy(PlannedPolicy):
    """vDNN: offload layer inputs after their last forward use, prefetch them one layer ahead in backward."""

    name: ClassVar[str] = "vdnn"
    # offline: given the network's structure up front, like vDNN (no timing is read)
    needs: ClassVar[str] = "plans from the network's structure"
    Params: ClassVar[type] = VdnnParams
    description: ClassVar[str] = "vDNN (MICRO'16): offload forward activations, prefetch one layer ahead in backward"

    def _plan(self, ctx: PolicyContext) -> None:
        self._build(ctx.trace, ctx.layout, ctx.capacity_blocks)
        self.n_planned = self.ev_ptr.shape[0] - 1
        self.stats = dict(offloaded_blocks=0, prefetched_blocks=0)

    def _pairs(self, t, lay, conv_only: bool) -> tuple[np.ndarray, np.ndarray]:
        """(launch, block) pairs: forward launches reading activation/input blocks (conv launches only)."""
        L = t.n_launches
        bs = lay.block_size
        launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(t.acc_ptr))
        kind = t.alloc_kind[t.acc_alloc]
        m = ((t.acc_mode & READ) != 0) & ((kind == KIND["activation"]) | (kind == KIND["input"]))
        m &= t.launch_phase[launch_of] == PHASE["forward"]
        if conv_only:
            conv = np.array(["conv" in n.lower() for n in t.names], dtype=bool)
            m &= conv[t.launch_name[launch_of]] if conv.size else False
        idx = np.flatnonzero(m)
        if not idx.size:
            return EMPTY, EMPTY
        start = lay.base[t.acc_alloc[idx]] + t.acc_off[idx]
        b0 = start // bs
        b1 = (start + t.acc_len[idx] - 1) // bs
        cnt = b1 - b0 + 1
        li = np.repeat(launch_of[idx], cnt)
        off = np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        bb = np.repeat(b0, cnt) + off
        key = np.unique(li * lay.max_blocks + bb)
        return key // lay.max_blocks, key % lay.max_blocks

    def _offload_set(self, t, lay, conv_only: bool):
        L = t.n_launches
        li, bb = self._pairs(t, lay, conv_only)
        if not li.size:
            return EMPTY, EMPTY, EMPTY, EMPTY
        nb = lay.max_blocks
        lo = np.repeat(np.arange(L, dtype=np.int64), np.diff(lay.ptr))
        keys = lo * nb + lay.blocks  # sorted: launches ascend, blocks sorted within a launch
        pos = np.searchsorted(keys, li * nb + bb)
        nu = lay.next_use()[pos]
        ok = (nu < L) & (nu > li + 1)
        li, bb, nu = li[ok], bb[ok], nu[ok]
        ok = t.launch_phase[nu] == PHASE["backward"]
        li, bb, nu = li[ok], bb[ok], nu[ok]
        if not li.size:
            return EMPTY, EMPTY, EMPTY, EMPTY
        # Prefetch trigger: the previous backward launch that reads offloaded data (one layer ahead), or the
        # first backward launch of that iteration.
        users = np.unique(nu)
        k = np.searchsorted(users, nu)
        prev = np.where(k > 0, users[np.maximum(k - 1, 0)], -1)
        bwd = np.flatnonzero(t.launch_phase == PHASE["backward"])
        it = t.launch_iter
        first_bwd = bwd[np.searchsorted(bwd, li)]  # first backward launch after the offload (same iteration)
        trig = np.where((prev >= first_bwd) & (it[np.maximum(prev, 0)] == it[nu]), prev, first_bwd)
        trig = np.minimum(trig, nu)
        return li, bb, nu, trig

    def _peak(self, lay, li, bb, trig) -> int:
        """The modelled peak: blocks live from first to last use, less the offloaded intervals [li + 1, trig)."""
        L = lay.n_launches
        press = lay.pressure()
        if li.size:
            d = np.zeros(L + 2, dtype=np.int64)
            np.subtract.at(d, li + 1, 1)
            np.add.at(d, trig, 1)
            press += np.cumsum(d)[:L]
        return int(press.max()) if L else 0

    def _build(self, t, lay, cap: int) -> None:
        L = t.n_launches
        mode = self.params.mode
        self.peaks = {}
        if mode == "dyn":
            self.peaks["none"] = self._peak(lay, EMPTY, EMPTY, EMPTY)
            chosen = "none"
            if self.peaks["none"] > cap:
                r = self._offload_set(t, lay, True)
                self.peaks["conv"] = self._peak(lay, r[0], r[1], r[3])
                chosen = "conv" if self.peaks["conv"] <= cap else "all"
            mode = chosen
        self.mode = mode
        if mode == "none":
            li = bb = nu = trig = EMPTY
        else:
            li, bb, nu, trig = self._offload_set(t, lay, mode == "conv")
        self.n_offload_pairs = int(li.shape[0])
        self.ev_ptr, self.ev = group_by(li + 1, bb, L) if li.size else (np.zeros(L + 1, dtype=np.int64), EMPTY)
        if li.size:
            o = np.lexsort((nu, trig))
            tr, b2 = trig[o], bb[o]
            self.pf_ptr = np.zeros(L + 1, dtype=np.int64)
            np.cumsum(np.bincount(tr, minlength=L), out=self.pf_ptr[1:])
            self.pf = b2
        else:
            self.pf_ptr, self.pf = np.zeros(L + 1, dtype=np.int64), EMPTY

    def _decide(self, i: int, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        ev = self.ev[self.ev_ptr[i]:self.ev_ptr[i + 1]]
        pf = self.pf[self.pf_ptr[i]:self.pf_ptr[i + 1]]
        if not (ev.size or pf.size):
            return None
        ev = ev[state.resident[ev]]
        pf = pf[~(state.resident[pf] | state.in_flight[pf])]
        if pf.size:
            _, first = np.unique(pf, return_index=True)
            pf = pf[np.sort(first)]
        self.stats["offloaded_blocks"] += int(ev.shape[0])
        self.stats["prefetched_blocks"] += int(pf.shape[0])
        return Decision(prefetch=pf, evict=ev)

    def report(self) -> dict:
        out = dict(self.stats)
        out.update(mode=self.mode, offload_pairs=self.n_offload_pairs, planning_s=self.planning_s,
                   **{f"peak_blocks_{k}": v for k, v in self.peaks.items()}, capacity_blocks=self.ctx.capacity_blocks)
        return out
