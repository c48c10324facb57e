"""``flashneuron``: FlashNeuron (Bae et al., FAST'21): activations offloaded straight to the SSD (needs the SSD tier).

FlashNeuron trains models larger than GPU memory by writing each layer's forward activations to an NVMe SSD
over a direct GPU<->SSD path (GPUDirect-style P2P, no host buffer) as soon as the forward pass is done with
them, and reading them back during the backward pass one layer ahead of their use. Parameters, gradients
and optimizer state are not offloaded: they stay on the GPU where they fit (here: the simulator's driver
pages them on demand when they do not).

The reproduction (docs/tiers.md), per block of the simulator:

- offload set: blocks holding only ``activation`` allocations (``uvmprefetch.trace.format.KINDS``; blocks
  shared with parameters, gradients, optimizer state or inputs stay) whose next use, after a ``forward``
  launch, is in the ``backward`` phase at least ``keep_last`` launches later (the last layers' activations,
  needed right away by the backward pass, are not offloaded); of those, with ``select`` (default), only as
  many as the capacity needs, earliest forward launches first (FlashNeuron's offloading-set selection: the
  first layers' activations wait longest for the backward pass), judged on the memory pressure without
  migrations (every block held from its first to its last use);
- offload: ``Decision.evict_ssd`` right after that last forward use (the SSD write happens on the direct
  path, off the compute stream);
- prefetch: ``lookahead`` launches before the backward use (a stand-in for "one layer ahead": the trace
  has no layer boundaries);
- everything else is FlashNeuron's to keep on the GPU; the simulator's driver may still evict it when the
  capacity is short; with ``keep_resident=true`` it is brought back ``lookahead`` launches before its next
  use (FlashNeuron itself has no such path: it needs the rest to fit).

FlashNeuron needs the SSD tier (``ssd_bw > 0`` in the GPU profile). Without it, it offloads to host memory
instead and says so in its report (``tier: host``), so that it runs on every profile like every registered
policy; ``require_ssd=true`` makes a profile without the tier a ConfigError naming the missing fields.

It is offline only in that it reads allocation kinds and phases from the trace (what FlashNeuron's runtime
knows from the framework after profiling one iteration); it uses no timing knowledge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ..trace.format import KIND, PHASE
from .base import Decision, LaunchInfo, Params, PolicyContext, ResidencyView
from .planned import PlannedPolicy
from .tables import group_by


@dataclass(frozen=True)
class FlashNeuronParams(Params):
    lookahead: int = 16  # launches before a backward use that its activations are read back ("one layer ahead")
    keep_last: int = 32  # activations used again in backward within this many launches are not offloaded
    keep_resident: bool = False  # True: bring back what the driver evicted (non-offloaded data stays on the GPU)
    select: bool = True  # offload only as many activations as the capacity needs (False: all candidates)
    require_ssd: bool = False  # True: a GPU profile without the SSD tier is a ConfigError (else: offload to host)

    def __post_init__(self) -> None:
        if self.lookahead < 1:
            raise ConfigError(f"flashneuron: lookahead must be >= 1, got {self.lookahead}")
        if self.keep_last < 2:
            raise ConfigError(f"flashneuron: keep_last must be >= 2, got {self.keep_last}")


class FlashNeuronPolicy(PlannedPolicy):
    """Activations to the SSD after their last forward use, back one layer ahead of the backward use."""

    name: ClassVar[str] = "flashneuron"
    needs: ClassVar[str] = "reads allocation kinds from the trace"
    Params: ClassVar[type] = FlashNeuronParams
    description: ClassVar[str] = ("FlashNeuron (FAST'21): forward activations offloaded to the SSD, "
                                  "read back in backward")

    def on_start(self, ctx: PolicyContext) -> None:
        self.tier = "ssd" if getattr(ctx.gpu, "ssd_bw", 0) > 0 else "host"
        if self.tier == "host" and self.params.require_ssd:
            raise ConfigError("flashneuron offloads activations to an SSD: the GPU profile has no SSD tier; set "
                              "its fields ssd_bw (and optionally ssd_write_bw, ssd_latency_s, host_capacity_bytes),"
                              " e.g. --ssd pcie4-nvme or --gpu-set ssd_bw=7e9")
        super().on_start(ctx)

    def _plan(self, ctx: PolicyContext) -> None:
        p = self.params
        lay, tr, bs = ctx.layout, ctx.trace, ctx.block_size
        L = lay.n_launches
        # Blocks that hold activations only.
        size = np.asarray(tr.alloc_size, dtype=np.int64)
        base = np.asarray(lay.base, dtype=np.int64)[: size.shape[0]]
        ok = size > 0
        lo, hi = base[ok] // bs, (base[ok] + size[ok] - 1) // bs
        kind = np.asarray(tr.alloc_kind)[ok]
        act = kind == KIND["activation"]

        def cover(sel: np.ndarray) -> np.ndarray:
            d = np.zeros(lay.max_blocks + 1, dtype=np.int64)
            np.add.at(d, np.minimum(lo[sel], lay.max_blocks), 1)
            np.add.at(d, np.minimum(hi[sel] + 1, lay.max_blocks), -1)
            return np.cumsum(d)[: lay.max_blocks] > 0

        act_only = cover(act) & ~cover(~act)
        self.activation_blocks = int(act_only.sum())
        # Offload entries: (forward launch u, activation block b) whose next use v is a backward launch >= keep_last on.
        launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(lay.ptr))
        nxt = lay.next_use()
        blk = lay.blocks
        ph = np.asarray(tr.launch_phase)
        ph_next = np.where(nxt < L, ph[np.minimum(nxt, L - 1)], -1)
        e = np.flatnonzero(act_only[blk] & (ph[launch_of] == PHASE["forward"]) & (ph_next == PHASE["backward"])
                           & (nxt - launch_of >= p.keep_last))
        self.candidates = int(e.shape[0])
        if p.select:  # offload only what the capacity needs, earliest layers first (FlashNeuron's selection)
            press = lay.pressure()
            cap = ctx.capacity_blocks
            keep = []
            if (press > cap).any():
                for j in np.lexsort((blk[e], launch_of[e])).tolist():
                    a, z = int(launch_of[e[j]]) + 1, int(nxt[e[j]])
                    seg = press[a:z]
                    if seg.max() > cap:
                        seg -= 1
                        keep.append(j)
            e = e[np.sort(np.asarray(keep, dtype=np.int64))]
        u, v, b = launch_of[e], nxt[e], blk[e]
        self.ev_ptr, self.ev = group_by(u + 1, b, L + 1, order=b)
        back = np.maximum(u + 2, v - p.lookahead)
        self.pf_ptr, self.pf = group_by(back, b, L + 1, order=v)
        self.n_offloads = int(e.shape[0])
        # Everything else is meant to stay on the GPU; what the driver evicts anyway comes back before its next use.
        self.follow_uses(lay)
        self.n_planned = len(self.ev_ptr) - 1
        self.returned = 0
        self.issued_offload = 0
        self.issued_prefetch = 0

    def _decide(self, i: int, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        ev = self.ev[self.ev_ptr[i]:self.ev_ptr[i + 1]]
        pf = self.pf[self.pf_ptr[i]:self.pf_ptr[i + 1]]
        if self.params.keep_resident and self.stray.any():
            st = np.flatnonzero(self.stray)
            st = st[~(state.resident[st] | state.in_flight[st]) & (self.nu[st] > i)]
            self.stray[:] = False
            self.stray[st] = True
            take = st[self.nu[st] <= i + self.params.lookahead]
            if take.size:
                take = take[np.argsort(self.nu[take], kind="stable")]
                self.stray[take] = False
                self.returned += take.shape[0]
                pf = np.concatenate([pf, take]) if pf.size else take
        if not (ev.size or pf.size):
            return None
        self.issued_offload += ev.shape[0]
        self.issued_prefetch += pf.shape[0]
        if self.tier == "host":  # no SSD tier in the profile: a host-memory stand-in (vDNN-like)
            return Decision(prefetch=pf, evict=ev)
        return Decision(prefetch=pf, evict_ssd=ev)

    def report(self) -> dict:
        return {"tier": self.tier, "activation_blocks": self.activation_blocks, "candidates": self.candidates,
                "planned_offloads": self.n_offloads,
                "offloads": self.issued_offload, "prefetches": self.issued_prefetch, "returned": self.returned}
