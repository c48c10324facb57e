"""The copy path of the simulated GPU (docs/simulator.md "Eviction paths"): a second way out and back beside UVM's
eviction, for blocks whose every allocation the runtime observes.

- **Out**: ``cudaMemcpyAsync`` of the block into a pinned host *mirror*, then a discard of its GPU pages, on the
  D2H engine: per contiguous run of blocks ``copy_call_s + k * block / copy_dtoh_bw``, then
  ``discard_call_s + k * discard_block_s``. The room is free when the discard has run. A block whose mirror is
  still current (it came back by copy-in and no launch wrote it since) is only discarded.
- **Back**: repopulate the discarded range on the GPU without a copy, then copy the mirror in, on the H2D engine:
  per run ``repopulate_call_s + k * repopulate_block_s + copy_call_s + k * block / copy_htod_bw``; every block of
  the run arrives when the run's copy ends. A launch that needs a mirrored block that is neither resident nor in
  flight is gated on its copy-in (ahead of queued prefetches, as faults are; no fault-batch latency).
- **Who takes it** (``EvictModel.mode``): ``uvm`` never; ``copy`` every eviction of a copy-eligible block;
  ``auto`` the policy's choice (``Decision.evict_path``, ``Policy.evict_path``). A block with a current mirror
  always leaves by a discard alone, and a block given ``PREFER_HOST`` always by UVM (kernels then read the
  managed range on the host, so the data must be there).
- **Eligibility** (``copy_eligible``): a block is copy-eligible when no allocation that overlaps it (over the
  whole run) is one the runtime does not fully observe: one that no launch of the trace touches (only kernels
  the observer did not see can use it: a library workspace) or one of the kinds the model is told to treat
  so (``ineligible=``, for what-ifs).
- **Mirror memory**: pinned host memory holds one mirror per mirrored block; with ``mirror_bytes`` set, a new
  mirror first takes the room of the mirror of a block that is on the GPU (its data is there), else the block
  leaves by UVM (``mirror_full_evictions``).

``CopyPath`` holds this part of ``GpuModel`` (``sim/engine.py``), which calls into it only when the copy path is on
(``copy_on``: a mode other than ``uvm`` and a GPU profile with ``copy_dtoh_bw > 0``); otherwise none of it runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError, SimError
from ..policy.base import EvictPath
from ..trace.format import KIND, KINDS
from .link import clear_flags, fifo_finish

EVICT_MODES = ("uvm", "copy", "auto")


@dataclasses.dataclass(frozen=True)
class EvictModel:
    """Which eviction paths the simulated runtime has (``--evict MODE[:k=v,...]``).

    ``mode``: ``uvm`` (UVM's eviction only), ``copy`` (the copy path for every copy-eligible block) or ``auto`` (the
    policy chooses); ``mirror_bytes``: pinned host memory for mirrors (the runtime's ``UVMPREFETCH_HOST_LIMIT``),
    0 = unlimited; ``ineligible``: allocation kinds (trace ``KINDS``) treated as not fully observed.
    """

    mode: str = "uvm"
    mirror_bytes: int = 0
    ineligible: tuple = ()

    def __post_init__(self) -> None:
        if self.mode not in EVICT_MODES:
            raise ConfigError(f"eviction mode {self.mode!r} is unknown; valid: {', '.join(EVICT_MODES)}")
        mb = self.mirror_bytes
        if not (isinstance(mb, int) and not isinstance(mb, bool) and mb >= 0):
            raise ConfigError(f"eviction model: mirror_bytes must be a whole number of bytes >= 0, got {mb!r}")
        bad = [k for k in self.ineligible if k not in KIND]
        if bad:
            raise ConfigError(f"eviction model: ineligible kind(s) {', '.join(map(repr, bad))} unknown; valid: "
                              f"{', '.join(KINDS)}")


def parse_evict(spec: "str | EvictModel | None") -> EvictModel:
    """``None`` (= ``uvm``), a mode, or ``"mode:k=v,..."`` with ``mirror_bytes=SIZE`` (0 or ``unlimited``: no bound)
    and ``ineligible=KIND+KIND``.

    Raises
    ------
    ConfigError
        An unknown mode, parameter or kind, or a bad size.
    """
    if spec is None or isinstance(spec, EvictModel):
        return spec or EvictModel()
    from ..units import parse_size
    mode, _, rest = str(spec).partition(":")
    kw: dict = {"mode": mode.strip()}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        k, sep, v = (x.strip() for x in part.partition("="))
        if not sep:
            raise ConfigError(f"eviction model: parameter {part!r} must look like name=value")
        if k == "mirror_bytes":
            kw[k] = 0 if v in ("0", "unlimited") else parse_size(v, "mirror_bytes")
        elif k == "ineligible":
            kw[k] = tuple(filter(None, (x.strip() for x in v.split("+"))))
        else:
            raise ConfigError(f"eviction model: unknown parameter {k!r}; valid: mirror_bytes, ineligible")
    return EvictModel(**kw)


def copy_eligible(trace, layout, ineligible: tuple = ()) -> np.ndarray:
    """Per block of ``layout``: True when no allocation that overlaps it is outside the runtime's view (no launch of
    ``trace`` touches it, or its kind is in ``ineligible``). Whole-run: a block that ever holds such an allocation is
    never copy-eligible."""
    bad = np.ones(trace.n_allocs, dtype=bool)
    bad[trace.acc_alloc] = False
    if ineligible:
        bad |= np.isin(trace.alloc_kind, [KIND[k] for k in ineligible])
    a = np.flatnonzero(bad)
    n = layout.max_blocks
    if not a.size:
        return np.ones(n, dtype=bool)
    bs = layout.block_size
    lo = layout.base[a] // bs
    hi = (layout.base[a] + np.maximum(trace.alloc_size[a], 1) - 1) // bs + 1
    cover = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cover, lo, 1)
    np.add.at(cover, hi, -1)
    return np.cumsum(cover[:n]) == 0


def from_microbench(mb: dict) -> dict:
    """The copy path's GPU-profile and host-model fields measured by ``bench/gpu/evict_microbench.py``: ``mb`` is one
    device's ``microbench`` object of ``bench/baselines/gpu.json`` (its ``evict/...`` entries). Returns ``{"gpu":
    {field: value}, "host": {field: value}, "missing": [field, ...]}``; a field whose entry is absent or was not
    measured is listed in ``missing`` and left out. Per-block figures are per 2 MiB block (the default block)."""
    gpu: dict = {}
    host: dict = {}
    us = 1e-6

    def largest(points):
        ok = [p for p in points or () if p.get("gb_s")]
        return max(ok, key=lambda p: p["size_bytes"]) if ok else None

    co = mb.get("evict/copy_out") or {}
    out, back = largest(co.get("managed_to_pinned")), largest(co.get("pinned_to_managed"))
    if out and back:
        gpu["copy_dtoh_bw"], gpu["copy_htod_bw"] = out["gb_s"] * 1e9, back["gb_s"] * 1e9
        small = min(co["managed_to_pinned"], key=lambda p: p["size_bytes"])
        if small.get("gpu_us") is not None:
            gpu["copy_call_s"] = max(0.0, small["gpu_us"] * us - small["size_bytes"] / gpu["copy_dtoh_bw"])
        if small.get("host_us") is not None:
            host["copy_call_s"] = small["host_us"] * us
    disc = mb.get("evict/discard") or {}
    ranges = disc.get("ranges") or {}
    for field, key, into in (("discard_call_s", "per_call_us", gpu), ("discard_block_s", "per_block_us", gpu),
                             ("copy_discard_call_s", "host_per_call_us", host),
                             ("copy_discard_block_s", "host_per_block_us", host)):
        if ranges.get(key) is not None:
            into[field] = max(0.0, ranges[key] * us)
    waits = (disc.get("behind_copy") or {}).get("waits_for_copy")
    if waits is not None:
        host["discard_waits_for_copy"] = bool(waits)
    fits = []  # (GPU time at the largest size, per call, per block) of each way to repopulate
    for variant in ("prefetch", "discard_and_prefetch"):
        pts = [p for p in ((mb.get("evict/copy_in") or {}).get(variant) or {}).get("points") or ()
               if (p.get("repopulate") or {}).get("gpu_us") is not None]
        if pts:
            k = np.array([p["size_bytes"] / (2 << 20) for p in pts])
            t = np.array([p["repopulate"]["gpu_us"] * us for p in pts])
            slope, icpt = np.polyfit(k, t, 1) if np.unique(k).size > 1 else (float(t[0] / k[0]), 0.0)
            fits.append((float(t[np.argmax(k)]), max(0.0, float(icpt)), max(0.0, float(slope))))
    if fits:
        _, gpu["repopulate_call_s"], gpu["repopulate_block_s"] = min(fits)
    rem = mb.get("evict/remote") or {}
    if rem.get("stayed_remote"):
        for field, key in (("remote_access_bw", "read"), ("remote_write_bw", "write")):
            if (rem.get(key) or {}).get("gb_s"):
                gpu[field] = rem[key]["gb_s"] * 1e9
    wanted = ("copy_dtoh_bw", "copy_htod_bw", "copy_call_s", "discard_call_s", "discard_block_s", "repopulate_call_s",
              "repopulate_block_s", "remote_access_bw", "remote_write_bw")
    host_wanted = ("copy_call_s", "copy_discard_call_s", "copy_discard_block_s", "discard_waits_for_copy")
    missing = [f for f in wanted if f not in gpu] + [f"host {f}" for f in host_wanted if f not in host]
    return {"gpu": gpu, "host": host, "missing": missing}


class CopyPath:
    """The copy path's state and methods, as part of ``GpuModel`` (blocks' residency, the link, the room, the
    metrics ``m``)."""

    def _copy_setup(self, evict: EvictModel, copy_blocks: "np.ndarray | None", n: int) -> None:
        gpu = self.gpu
        self.evict_model = evict
        self.copy_on = evict.mode != "uvm" and gpu.copy_path and not self.tier and not self.ideal
        if evict.mode == "copy" and not self.copy_on and not self.ideal:
            why = "has an SSD tier (not modelled with it)" if self.tier else "has no copy path (copy_dtoh_bw = 0)"
            raise ConfigError(f"--evict copy: the GPU profile {gpu.name} {why}; use --evict uvm, a calibrated profile "
                              f"(h100-pcie, h100-sxm, h200) or --gpu-set copy_dtoh_bw=55e9 --gpu-set copy_htod_bw=55e9")
        # Whether evictions that name no path (the caller's own, the policy's plain ones) take the copy path.
        self._copy_default = self.copy_on and (evict.mode == "copy" or
                                               getattr(self.policy, "evict_path", EvictPath.COPY) == EvictPath.COPY)
        self._uvm_d2h_end = 0.0  # when the last UVM write-back queued ends (the host waits for it: blocking_evict)
        if not self.copy_on:
            return
        if copy_blocks is not None and copy_blocks.shape[0] != n:
            raise SimError(f"copy_blocks has {copy_blocks.shape[0]} entries for {n} blocks")
        self.copy_ok = np.ones(n, dtype=bool) if copy_blocks is None else np.asarray(copy_blocks, dtype=bool)
        self.mirrored = np.zeros(n, dtype=bool)  # the host mirror holds the block's current data
        self.n_mirrored = 0
        bs = self.block_size
        self.mirror_cap = evict.mirror_bytes // bs if evict.mirror_bytes else None
        self.t_cout = bs / gpu.copy_dtoh_bw
        self.t_cin = bs / gpu.copy_htod_bw
        self._copy_out_end = 0.0  # when the last copy-out queued ends (before its discard)
        self.m.update(copy_out_bytes=0, copy_in_bytes=0, copy_evictions=0, discard_only_evictions=0, copy_calls=0,
                      discard_calls=0, repopulate_calls=0, copy_discard_blocks=0, copy_in_gated=0,
                      copy_in_stall_s=0.0, mirror_peak_bytes=0, mirror_full_evictions=0, mirror_reclaims=0,
                      mirror_restores=0, copy_ineligible_blocks=int((~self.copy_ok).sum()))

    @property
    def uvm_d2h_end(self) -> float:
        """When the UVM write-backs queued so far end (the copy path's D2H work does not hold the host)."""
        return self._uvm_d2h_end if self.copy_on else self.t_d2h

    # ------------------------------------------------------------------------------------------------ out
    def _evict_choice(self, dec) -> tuple[np.ndarray, np.ndarray]:
        """A Decision's ``evict`` blocks, unique, and per block whether it asks for the copy path."""
        b = self._ids(dec.evict, "Decision.evict")
        u, first = np.unique(b, return_index=True)
        if not self.copy_on:
            return u, np.zeros(u.shape[0], dtype=bool)
        path = dec.evict_path
        if not path.size:
            return u, np.full(u.shape[0], self._copy_default)
        if path.shape[0] != b.shape[0]:
            raise SimError(f"Decision.evict_path has {path.shape[0]} entries for {b.shape[0]} evict blocks")
        if path.min() < 0 or path.max() > max(EvictPath):
            raise SimError(f"Decision.evict_path: {int(path.min())}..{int(path.max())} is not an EvictPath")
        p = path[first]
        if self.evict_model.mode == "copy":
            return u, np.ones(u.shape[0], dtype=bool)
        return u, (p == EvictPath.COPY) | ((p == EvictPath.DEFAULT) & self._copy_default)

    def _copy_choice(self, victims: np.ndarray, live: np.ndarray, copy) -> "np.ndarray | None":
        """Which of ``victims`` (live: not dead) leave by the copy path: those chosen for it or with a current mirror,
        if eligible, as far as mirror memory allows. None when none does."""
        cp = live & self.copy_ok[victims] & (copy | self.mirrored[victims])
        new = np.flatnonzero(cp & ~self.mirrored[victims])
        if self.mirror_cap is not None and new.size:
            room = self.mirror_cap - self.n_mirrored
            if new.size > room:
                room += self._mirror_reclaim(new.size - room, victims)
            if new.size > room:
                cut = new[max(room, 0):]
                cp[cut] = False
                self.m["mirror_full_evictions"] += cut.size
        return cp if cp.any() else None

    def _mirror_reclaim(self, k: int, victims: np.ndarray) -> int:
        """Free up to ``k`` mirrors of blocks that are on the GPU (their data is there) and not among ``victims``."""
        cand = np.flatnonzero(self.mirrored & self.resident)
        if cand.size and victims.size:
            cand = cand[~np.isin(cand, victims)]
        cand = cand[:k]
        self._unmirror(cand)
        self.m["mirror_reclaims"] += cand.size
        return int(cand.size)

    def _copy_out(self, b: np.ndarray, now: float) -> np.ndarray:
        """Copy out (where the mirror is not current) and discard resident ``b`` on the D2H engine, per contiguous
        run; returns per block (in ``b``'s order) when its room is free: the end of its run's discard."""
        g, m, bs = self.gpu, self.m, self.block_size
        order = np.argsort(b, kind="stable")
        s = b[order]
        need = ~self.mirrored[s]
        brk = np.ones(s.shape[0], dtype=bool)
        brk[1:] = (s[1:] != s[:-1] + 1) | (need[1:] != need[:-1])
        heads = np.flatnonzero(brk)
        k = np.diff(np.append(heads, s.shape[0]))
        copy = np.where(need[heads], g.copy_call_s + k * self.t_cout, 0.0)
        dur = copy + g.discard_call_s + k * g.discard_block_s
        t0 = max(self.t_d2h, now)
        ends = t0 + np.cumsum(dur)
        self.t_d2h = float(ends[-1])
        self.link.busy_dtoh += float(dur.sum())
        if need.any():
            self._copy_out_end = float((ends - dur + copy)[need[heads]][-1])
        rel = np.empty(b.shape[0])
        rel[order] = np.repeat(ends, k)
        self.wb_done[b] = rel
        n_out = int(need.sum())
        m["copy_out_bytes"] += n_out * bs
        m["bytes_dtoh"] += n_out * bs
        m["copy_evictions"] += n_out
        m["discard_only_evictions"] += s.shape[0] - n_out
        m["copy_calls"] += int(need[heads].sum())
        m["discard_calls"] += heads.shape[0]
        m["copy_discard_blocks"] += s.shape[0]
        new = s[need]
        self.mirrored[new] = True
        self.n_mirrored += new.shape[0]
        if self.n_mirrored * bs > m["mirror_peak_bytes"]:
            m["mirror_peak_bytes"] = self.n_mirrored * bs
        if self._timeline:
            self.events["d2h"].append((t0, self.t_d2h, s.shape[0], "copy-out"))
        return rel

    # ----------------------------------------------------------------------------------------------- back
    def _copy_in_runs(self, b: np.ndarray, times: np.ndarray, ready: np.ndarray):
        """Turn the mirrored blocks of ``b`` (about to cross H2D in this order) into copy-in runs: in place, each
        run's whole time on its last block and its latest room on every block (so it starts when all its rooms are
        free). Returns (positions of the mirrored blocks, the position of each one's run end), or None."""
        mir = self.mirrored[b]
        if not mir.any():
            return None
        g, m = self.gpu, self.m
        idx = np.flatnonzero(mir)
        brk = np.ones(idx.shape[0], dtype=bool)
        brk[1:] = (idx[1:] != idx[:-1] + 1) | (b[idx[1:]] != b[idx[:-1]] + 1)
        heads = np.flatnonzero(brk)
        k = np.diff(np.append(heads, idx.shape[0]))
        last = idx[heads + k - 1]
        times[idx] = 0.0
        times[last] = g.repopulate_call_s + k * g.repopulate_block_s + g.copy_call_s + k * self.t_cin
        ready[idx] = np.repeat(np.maximum.reduceat(ready[idx], heads), k)
        m["copy_in_bytes"] += idx.shape[0] * self.block_size
        m["copy_calls"] += heads.shape[0]
        m["repopulate_calls"] += heads.shape[0]
        return idx, np.repeat(last, k)

    def _service_missing(self, missing: np.ndarray, now: float) -> float:
        """A launch's missing blocks: the mirrored ones come back by a gated copy-in, the rest fault. Returns when
        the last one is on the GPU."""
        mir = self.mirrored[missing]
        if not mir.any():
            return self._service_faults(missing, now)
        done = self._service_faults(missing[~mir], now) if not mir.all() else now
        g = missing[mir]
        n = g.shape[0]
        rooms = self._make_room(n, now, can_wait=True)
        if rooms.shape[0] < n:
            raise SimError(f"cannot make room for {n} blocks to copy in (capacity {self.capacity_blocks})")
        times = np.zeros(n)
        ready = np.maximum(rooms, self.wb_done[g])
        pos, end = self._copy_in_runs(g, times, ready)
        ends = fifo_finish(max(now, self.link.fault_end), ready, times)
        ends[pos] = ends[end]
        cdone = self._land(g, ends, float(times.sum()), now)
        self.m["bytes_htod"] += n * self.block_size
        self.m["copy_in_gated"] += n
        self.m["copy_in_stall_s"] += cdone - now
        if self._timeline:
            self.events["h2d"].append((now, cdone, n, "copy-in"))
        return max(done, cdone)

    # ------------------------------------------------------------------------------------------- mirrors
    def _unmirror(self, b: np.ndarray) -> None:
        """``b``'s mirrors no longer hold current data (written on the GPU, dead, or handed to UVM)."""
        self.n_mirrored -= clear_flags(self.mirrored, b)

    def _restore_mirrors(self, b: np.ndarray) -> None:
        """``PREFER_HOST`` for ``b``: kernels will read the managed range on the host, so a mirrored block off the
        GPU has its mirror copied into that range (a host-side copy: counted in ``mirror_restores``, not timed)."""
        off = b[self.mirrored[b] & ~self.resident[b] & ~self.in_flight[b]]
        self.m["mirror_restores"] += int(np.unique(off).size)
        self._unmirror(b)

    # ------------------------------------------------------------------------------------------ host
    def _copy_mark(self) -> tuple:
        m = self.m
        return (m["copy_calls"] + m["repopulate_calls"], m["discard_calls"], m["copy_discard_blocks"],
                self._copy_out_end)

    def _copy_host_end(self, host, mark: tuple, h: float) -> tuple[float, float]:
        """When the thread that issued the copy-path calls of one decision (since ``mark``), starting at ``h``, is
        free again, and how long of that it waited for copy-outs (``discard_waits_for_copy``): (end, waited)."""
        calls, discards, blocks, out_end = self._copy_mark()
        h += ((calls - mark[0]) * host.copy_call_s + (discards - mark[1]) * host.copy_discard_call_s
              + (blocks - mark[2]) * host.copy_discard_block_s)
        if host.discard_waits_for_copy and out_end > mark[3] and out_end > h:
            return out_end, out_end - h
        return h, 0.0

    def _copy_host(self, host, mark: tuple, now: float, h: float) -> tuple[float, float]:
        """The host's cost of the copy-path calls one decision issued (since ``mark``): returns (now, h)."""
        h, waited = self._copy_host_end(host, mark, h)
        if waited and h > now:
            self.m["host_blocked_s"] += h - max(h - waited, now)
        if h > now:
            self.m["host_stall_s"] += h - now
            now = h
            self._advance(now)
        return now, h

    def _check_copy(self) -> None:
        assert self.n_mirrored == int(self.mirrored.sum()), (self.n_mirrored, int(self.mirrored.sum()))
        assert not (self.mirrored & self.dead).any(), "a dead block has a mirror"
        assert not (self.mirrored & self.dirty).any(), "a written block has a current mirror"
        assert not (self.mirrored & ~self.copy_ok).any(), "an ineligible block has a mirror"
        assert self.mirror_cap is None or self.n_mirrored <= self.mirror_cap, (self.n_mirrored, self.mirror_cap)
        _, rel = self._wb.view()
        assert (np.diff(rel) >= 0).all(), "write-back queue out of order"
