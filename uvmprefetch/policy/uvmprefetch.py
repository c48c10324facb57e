"""``uvmprefetch``: our prefetcher (the default). A learned, online approximation of the ``oracle``.

How it decides (each launch, in ``on_launch``):

1. **Where are we in the learned stream?** Every launch is appended to a bounded *history* (its key,
   name, and the blocks it touched: exact ``info.blocks`` when the framework reports accesses, the faulted
   blocks otherwise). A pointer ``p`` follows the history position that corresponds to the launch now
   running. It advances when the next recorded launch has the same *signature* (name + exact blocks);
   when it does not, it re-synchronises through correlation tables, most specific first: signature -> last
   position, stable signature -> last position, exec-id n-gram (3 predecessors + current) -> last position,
   name n-gram -> last position (compiled and set-associative, ``_uvmkernels.tab_get`` / ``tab_put``). This is
   DeepUM's execution-id correlation generalised to a pointer into recorded history, which also tells *which*
   blocks each coming launch needs (a changed pattern, e.g. a different sequence length, jumps the pointer to
   the last time that pattern was seen). A name match with different blocks (data-dependent accesses, MoE)
   keeps the pointer moving.
2. **Predicted next use.** ``nu[b]`` is the history position where block ``b`` is next predicted to be
   used (maintained incrementally from per-entry next-occurrence links, rebuilt on a jump). A block with no
   use ahead of the pointer is predicted at its first use in this iteration's record: the same offset of
   the next step.
3. **Plan.** The blocks of the next ``window`` predicted launches that are not on the GPU, in order of
   need, take free room first; beyond it, each takes a victim only if the victim's predicted next use is
   later than its own (never evict a block needed sooner than the one it brings in). Victims are chosen
   dead first, then clean with no predicted reuse, then dirty with no predicted reuse, then farthest
   predicted reuse. Evictions for launches beyond the next one are *paced* to the link (as in the oracle):
   only until the H2D queue reaches the next decision point (rounded up to a whole block when the running
   launch matched its record exactly, down otherwise), so a wrong guess costs little.
4. **Window.** ``window.WindowMonitor`` widens it on late prefetches (a predicted block faulted or was
   still in flight) and narrows it when prefetched blocks are evicted before use.
5. **Invalidation.** Freed blocks are dead: discarded (no write-back) when their room is needed. Only where the
   caller can discard (``PolicyContext.discards``): elsewhere a discard would be a write-back, so a freed block
   stays live, its next use where the allocator hands its memory out again (bench/results/replay-20261127-nodiscard).
6. **Advice.** READ_MOSTLY for blocks never written over two iterations of history (free eviction on a
   driver without dirty tracking); PREFER_HOST for blocks read once per iteration, but only while the last
   iteration needed more link time than compute time, and only as many as balance the two (remote reads
   move work from the saturated link onto the compute stream).

The hot path runs in Numba kernels (``_uvmkernels``): a launch with known accesses takes one call for the whole
hook (``step``: the commit of the previous launch, the match compiled, then ``after_match`` and the counts), save
the first launch, one that finds no room in the history buffers and one that makes the history trim itself (one
call after the Python match, ``after_match``);
the Python methods they mirror stay as the reference (``_fast_step`` / ``_fast_plan`` off). The plan's window pass
(``window_candidates``) lists only the candidates the plan reads and skips the next-use updates of a *verified
span* of positions, kept from one plan to the next while nothing rewrites next uses (``plan_paced``, ``_v_lo`` /
``_v_hi``). What those calls touch is packed so that crossing into them costs little (~0.1-0.2 us an array, ~0.8
us for each array handed back): the per-block state in two arrays whose rows the attributes view (``_bi``,
``_bb``), the settings in ``_kp`` / ``_kf``, the scalars carried from launch to launch in ``_reg`` / ``_regf``
(properties: ``p``, ``pending``, the history's lengths, ``_pool_n``, ``horizon``, ``q_end``, ...; the pending
launch's blocks in ``_pbuf``), the counts in ``_cnt`` (``stats`` is a mapping over it), the correlation tables
compiled (``_tabs``), and the decision written into scratch arrays (``_wbuf``, ``_out``). So the hook's Python
is the call and the ``Decision``: the exact signature is hashed inside (``launch_sig``; deterministic, unlike
Python's salted ``hash`` of bytes), and nothing is copied back but the decision. The call skips Numba's
dispatcher (its type lookup, ~10 us with cold caches) through the step's compiled entry point, kept while the
arrays it gets are checked to be of the types it was compiled for (``_step_entry``).

State is bounded: ``history_launches`` launches of history and ``table_entries`` entries per correlation
table (``report()['state_bytes']``).
"""

from __future__ import annotations

import bisect
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from . import _uvmkernels as _k
from .base import EMPTY, Advice, Decision, LaunchInfo, Params, Policy, PolicyContext, ResidencyView, ids_in_use
from .tables import GrowArray
from .window import WindowMonitor

INF = np.iinfo(np.int64).max // 4
_NO_W = np.zeros(0, dtype=np.int8)  # (no write flags: the history's f_w keeps its fill)
# Victim classes above every history position: dead, then clean unpredicted, then dirty unpredicted.
_K_DEAD, _K_CLEAN, _K_DIRTY = 3 * INF, 2 * INF, INF + 1
_MASK63 = (1 << 63) - 1
_AGE = 1 << 40  # launch-index span of the LRU tie-break (added inside a victim class)
_ND = np.ndarray
_I64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)


def _plain(a, dtype: np.dtype) -> bool:
    """``a`` is a 1-d, C-contiguous, aligned, writeable ndarray of ``dtype`` (exactly: ``dtype`` is NumPy's own
    object for it): the argument type the step's entry point is kept for (``UvmPrefetchPolicy._step_entry``)."""
    return type(a) is _ND and a.dtype is dtype and a.ndim == 1 and a.flags.carray


@dataclass(frozen=True)
class UvmPrefetchParams(Params):
    prefetch: bool = True  # prefetch predicted blocks
    pre_evict: bool = True  # choose victims ourselves (else the driver's LRM eviction makes room)
    invalidate: bool = True  # freed blocks are dead: dropped, never written back (where the caller can discard)
    invalidate_always: bool = False  # ... and where it cannot (the behaviour before 2026-11-27: live A/B runs)
    adaptive_window: bool = True  # the monitor moves the window (else fixed at `window`)
    advice: bool = True  # READ_MOSTLY / PREFER_HOST where it pays
    fault_late: bool = False  # next-launch blocks a busy queue would deliver late are left to fault (see docs)
    fault_late_soft: bool = True  # ... only when the next launch is a soft (data-dependent) slot, older data only
    track_moves: bool = True  # translate predicted blocks of tensors the allocator placed elsewhere
    stable_sync: bool = True  # re-synchronise on the blocks of older data a launch reads (see _match)
    layer_stride: bool = True  # following an earlier layer of this iteration, shift its blocks by the stride
    window: int = 1024  # initial lookahead, in launches
    window_min: int = 64  # below this the plan cannot cover a layer's launches
    window_max: int = 8192
    patience: int = 4  # monitor events before the window moves
    pace: bool = True  # evict for later launches only while the link would idle before the next decision
    whole: bool = False  # pacing rounds up to whole launches (as the oracle)
    guard_soft: bool = False  # data-dependent (soft-matched twice) launches get free room only
    guess_unpredicted: bool = False  # ... but may take dead / unpredicted victims
    soft_moves: bool = False  # a soft match whose new blocks hold this iteration's writes is a move, not a guess
    stall_aware: bool = True  # the pacing budget counts the running launch's wait for in-flight blocks
    deadline: bool = False  # ... or while the link is behind the predicted start times of coming launches
    lead_s: float = 0.0  # extra link time allowed beyond the next decision point
    margin: float = 0.01  # fraction of capacity kept free by pre-evicting dead / unpredicted blocks (docs)
    dead_reuse: bool = True  # a dead block whose address is predicted to be used again ranks by that use (docs)
    ngram: int = 3  # predecessors in the exec-id / name correlation context
    history_launches: int = 1 << 17  # launches of history kept (bounded state)
    table_entries: int = 1 << 17  # entries per correlation table (a multiple of its 8 ways, at least 8)
    scan_max: int = 1 << 15  # most history entries scanned per decision (bounds the cost per launch)
    victim_pool: int = 256  # victims come from a pool refilled by a full scan of this many (0: always scan all)
    pool_launches: int = 64  # ... refilled at least this often (a bound on what its bookkeeping could miss)

    def __post_init__(self) -> None:
        for f in ("window", "window_min", "window_max", "patience", "ngram", "history_launches", "table_entries",
                  "scan_max", "pool_launches"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"uvmprefetch: {f} must be a positive integer, got {v!r}")
        if self.window_min > self.window_max:
            raise ConfigError(f"uvmprefetch: window_min {self.window_min} > window_max {self.window_max}")
        if not self.window <= self.window_max:
            raise ConfigError(f"uvmprefetch: window {self.window} > window_max {self.window_max}")
        if self.window < self.window_min:  # an explicit small window lowers the floor with it
            object.__setattr__(self, "window_min", self.window)
        if not (isinstance(self.lead_s, (int, float)) and self.lead_s >= 0):
            raise ConfigError(f"uvmprefetch: lead_s must be >= 0, got {self.lead_s!r}")
        if not (isinstance(self.margin, (int, float)) and 0 <= self.margin < 0.5):
            raise ConfigError(f"uvmprefetch: margin must be in [0, 0.5), got {self.margin!r}")
        if not isinstance(self.victim_pool, int) or isinstance(self.victim_pool, bool) or self.victim_pool < 0:
            raise ConfigError(f"uvmprefetch: victim_pool must be an integer >= 0, got {self.victim_pool!r}")
        if self.history_launches < 16:
            raise ConfigError(f"uvmprefetch: history_launches must be >= 16, got {self.history_launches}")


def _carried(i: int, kind: type = int, where: str = "_reg") -> property:
    """A scalar the one-kernel steps carry from one launch to the next: ``_reg[i]`` (or ``where[i]``) as ``kind``."""
    def get(self):
        return kind(getattr(self, where)[i])

    def put(self, v) -> None:
        getattr(self, where)[i] = v
    return property(get, put)


class _Counts(MutableMapping):
    """The policy's counts by name (``_uvmkernels.STAT_NAMES``) over the int64 array the one-kernel step adds to:
    a dict to the Python code and to ``report``."""

    _INDEX: ClassVar[dict] = {k: i for i, k in enumerate(_k.STAT_NAMES)}

    def __init__(self) -> None:
        self.a = np.zeros(len(_k.STAT_NAMES), dtype=np.int64)

    def __getitem__(self, k: str) -> int:
        return int(self.a[self._INDEX[k]])

    def __setitem__(self, k: str, v: int) -> None:
        self.a[self._INDEX[k]] = v

    def __delitem__(self, k: str) -> None:
        raise TypeError("uvmprefetch: a count cannot be removed")

    def __iter__(self):
        return iter(_k.STAT_NAMES)

    def __len__(self) -> int:
        return len(_k.STAT_NAMES)


class _Held(GrowArray):
    """A history buffer whose length lives in the policy's ``_reg[slot]`` (the one-kernel step sets it)."""

    def __init__(self, reg: np.ndarray, slot: int, dtype, **kw) -> None:
        self._reg, self._slot = reg, slot
        super().__init__(dtype, **kw)

    @property
    def n(self) -> int:
        return int(self._reg[self._slot])

    @n.setter
    def n(self, v: int) -> None:
        self._reg[self._slot] = v


class UvmPrefetchPolicy(Policy):
    """Learned launch-stream prefetcher with adaptive window, paced pre-eviction, invalidation and advice."""

    name: ClassVar[str] = "uvmprefetch"
    Params: ClassVar[type] = UvmPrefetchParams
    description: ClassVar[str] = "ours: launch-history prediction, adaptive window, paced pre-eviction, advice"

    # (in ``_reg``, which ``_uvmkernels.after_match`` / ``step`` update in place; see ``on_start``)
    _pool_n = _carried(_k.G_POOL_N)
    _pool_on = _carried(_k.G_POOL_ON, bool)
    _pool_stale = _carried(_k.G_POOL_STALE)
    _pool_age = _carried(_k.G_POOL_AGE)
    _pool_min = _carried(_k.G_POOL_MIN)
    s_old = _carried(_k.G_S_OLD)
    s_new = _carried(_k.G_S_NEW)
    _v_lo = _carried(_k.G_V_LO)
    _v_hi = _carried(_k.G_V_HI)
    horizon = _carried(_k.G_HORIZON)
    soft = _carried(_k.G_SOFT)  # how the running launch matched its prediction (committed with it)
    cur_ngram = _carried(_k.G_NGRAM)  # the running launch's counted n-gram (committed with it)
    pending_stab = _carried(_k.G_PSTAB)
    pending_ngram = _carried(_k.G_PNGRAM)
    base = _carried(_k.G_BASE)
    fbase = _carried(_k.G_FBASE)
    iter_start = _carried(_k.G_ITER_START)  # history position of this iteration's first launch
    _prev_start = _carried(_k.G_PREV_START)  # first position of the last iteration's record
    iters_seen = _carried(_k.G_ITERS)
    _moved_at_start = _carried(_k.G_MOVED_AT_START)  # moved_blocks when this iteration began
    cur_waits = _carried(_k.G_WAITS, bool)  # the running launch waits for blocks still in flight
    it_link_blocks = _carried(_k.G_LINK)
    _shift_it = _carried(_k.G_SHIFT_IT, bool)  # a layer stride was in use this iteration (``_settle_moves``)
    q_end = _carried(_k.GF_Q_END, float, "_regf")  # predicted end of the H2D queue
    cum_total = _carried(_k.GF_CUM, float, "_regf")
    pending_dur = _carried(_k.GF_PDUR, float, "_regf")
    it_compute = _carried(_k.GF_COMPUTE, float, "_regf")

    @property
    def p(self) -> int | None:
        """History position matched to the running launch (``_reg[G_P]``; None: none)."""
        return int(self._reg[_k.G_P]) if self._reg[_k.G_HAS_P] else None

    @p.setter
    def p(self, v: int | None) -> None:
        self._reg[_k.G_HAS_P] = v is not None
        self._reg[_k.G_P] = -1 if v is None else v

    @property
    def pending(self) -> tuple | None:
        """The running launch, committed to history at the next launch: ``(key, name, sig, blocks, write flags or
        None)``, kept in ``_reg`` / ``_pbuf`` / ``_wbuf`` (the arrays are views of the buffers)."""
        reg = self._reg
        if not reg[_k.G_PEND]:
            return None
        k = int(reg[_k.G_PK])
        return (int(reg[_k.G_PKEY]), int(reg[_k.G_PNAME]), int(reg[_k.G_PSIG]), self._pbuf[:k],
                self._wbuf[:k] if reg[_k.G_PHAS_W] else None)

    @pending.setter
    def pending(self, v: tuple | None) -> None:
        reg = self._reg
        if v is None:
            reg[_k.G_PEND] = 0
            return
        key, name, sig, blocks, wmask = v
        k = blocks.shape[0]
        if k > self._pbuf.shape[0]:
            self._pbuf = np.zeros(k, dtype=np.int64)
            self._arrays = None
        self._pbuf[:k] = blocks
        has_w = wmask is not None and wmask.shape[0] == k
        if has_w:
            self._wbuf[:k] = wmask
        reg[_k.G_PEND], reg[_k.G_PK], reg[_k.G_PHAS_W] = 1, k, has_w
        reg[_k.G_PKEY], reg[_k.G_PNAME], reg[_k.G_PSIG] = key, name, sig

    def __init__(self, params: UvmPrefetchParams | None = None, **overrides) -> None:
        super().__init__(params, **overrides)
        # Read by the simulator: without invalidation the driver never learns of frees (like `demand`).
        self.invalidates_frees = bool(self.params.invalidate)
        self.invalidating = self.invalidates_frees  # on_start: and only where the caller can discard

    # ------------------------------------------------------------------------------------------ start
    def on_start(self, ctx: PolicyContext) -> None:
        super().on_start(ctx)
        P = self.params
        # Freed blocks count dead only where dead data can be dropped. Without discards (the live cuda default)
        # a dead block that leaves is written back, and comes back over the link when its memory is handed out
        # again: ranked first among victims and pre-evicted to keep the free margin, dead blocks cost blocking
        # write-backs for nothing. Taking them as live (their next use is where the allocator hands them out
        # again) is what bench/results/replay-20261127-nodiscard/ measured: whole run 1.339 / 1.297 -> 1.067 /
        # 1.020 x oracle at 1.5x / 2x with the H100's costs and the live runtime's host clock; 1.140 / 1.184 ->
        # 1.182 / 1.231 with the literature profile's free 52 GB/s write-backs and no host clock.
        self.invalidating = bool(P.invalidate and (getattr(ctx, "discards", True) or P.invalidate_always))
        n = ctx.max_blocks
        # The scalars the one-kernel steps carry from one launch to the next (properties over ``_reg`` /
        # ``_regf``: ``_uvmkernels.G_*`` / ``GF_*``), and the counts (``stats``, over ``_cnt``)
        self._reg = np.zeros(_k.N_G, dtype=np.int64)
        self._regf = np.zeros(_k.N_GF, dtype=np.float64)
        self.stats = _Counts()
        self._cnt = self.stats.a
        # Per-block state, packed by type so that the one-kernel steps take two arrays, not sixteen
        # (``_uvmkernels.I_*`` / ``B_*`` name the rows; the attributes below are views of them)
        self._bi = np.zeros((_k.N_I, n), dtype=np.int64)
        self._bb = np.zeros((_k.N_B, n), dtype=bool)
        bi, bb = self._bi, self._bb
        self.nu = bi[_k.I_NU]  # predicted next use (history position)
        self.nu[:] = INF
        self.dirty = bb[_k.B_DIRTY]
        self.dead = bb[_k.B_DEAD]
        self.pf_unused = bb[_k.B_PF_UNUSED]
        self.thrashed = bb[_k.B_THRASHED]  # prefetched, evicted unused while still predicted
        self.written = bb[_k.B_WRITTEN]  # ever written (advice)
        self.w_iter = bi[_k.I_W_ITER]  # last iteration (count of on_iteration) writing the block
        self.w_iter[:] = -1
        self.uses = np.zeros(n, dtype=np.int32)  # launches touching it this iteration (advice)
        self.prev_uses = np.zeros(n, dtype=np.int32)
        self.advice = np.zeros(n, dtype=np.int8)
        self.last_flat = bi[_k.I_LAST_FLAT]
        self.last_flat[:] = -1
        self.last_use = bi[_k.I_LAST_USE]  # launch index of the last use (LRU tie-break)
        self._mark = np.zeros(n, dtype=np.uint8)  # zeroed scratch of the kernels (left zeroed)
        # History (absolute positions; entries before `base` / flat entries before `fbase` are forgotten).
        self.h_key = _Held(self._reg, _k.G_HN, np.int64)
        self.h_name = _Held(self._reg, _k.G_HN, np.int64)
        self.h_sig = _Held(self._reg, _k.G_HN, np.int64)
        self.h_ptr = _Held(self._reg, _k.G_HN, np.int64)  # absolute flat index where each position's blocks start
        # 0: the launch matched its prediction exactly; 1: same kernel, other blocks; 2: that happened at this
        # slot twice in a row (data-dependent, e.g. MoE routing: predictions there are guesses)
        self.h_soft = _Held(self._reg, _k.G_HN, np.int8)
        # Running sum of recorded launch durations before each position: the predicted start time of a coming
        # launch relative to the next one is a difference of two entries (the deadline of its blocks).
        self.h_cum = _Held(self._reg, _k.G_HN, np.float64)
        self.cum_total = 0.0
        self.pending_dur = 0.0
        self.f_blk = _Held(self._reg, _k.G_FN, np.int64, initial=1 << 14)
        self.f_next = _Held(self._reg, _k.G_FN, np.int64, fill=INF, initial=1 << 14)
        # the launch wrote this block: 1, a new tensor's first write (the block was dead): 2 (see _learn_moves)
        self.f_w = _Held(self._reg, _k.G_FN, np.int8, fill=0, initial=1 << 14)
        # (grown together: ``_commit`` writes one entry of each per-position array and k of each flat one)
        self._hist = (self.h_cum, self.h_key, self.h_name, self.h_sig, self.h_soft, self.h_ptr)
        self._flat = (self.f_blk, self.f_w, self.f_next)
        self._h_room = min(g.reserve(0).shape[0] for g in self._hist)
        self._f_room = min(g.reserve(0).shape[0] for g in self._flat)
        # recorded block -> where the tensor written there lives in this iteration (see _learn_moves)
        self.remap = bi[_k.I_REMAP]
        self.remap[:] = np.arange(n)
        self.rend = bi[_k.I_REND]  # ... for its recorded entries before this position
        self.first_it = bi[_k.I_FIRST_IT]  # iteration of first_pos
        self.first_it[:] = -1
        self.first_pos = bi[_k.I_FIRST_POS]  # a block's first position in this iteration's record
        self.iter_start = 0  # history position of this iteration's first launch
        self.iter_starts: list[int] = []  # the first positions of the later iterations (ascending)
        self._prev_start = 0  # first position of the last iteration's record
        self._istarts = np.zeros(0, dtype=np.int64)  # ``iter_starts`` for the kernels
        self.base = 0
        self.fbase = 0
        # The correlation tables (``_uvmkernels.T_*`` / ``C_*``; compiled, set-associative, ``table_entries`` each):
        # signature -> last position; (stable signature, its occurrence in the iteration) -> last position (see
        # _match); (exec-id n-gram, its occurrence in the iteration) -> last position: the k-th time a context
        # occurs in this iteration matches the k-th time in the last iteration that had it, not the previous
        # layer; name n-gram -> last position; and the occurrence counts of this iteration's n-grams and stable
        # signatures. Keys are 64-bit hashes (0: none).
        rows = max(1, P.table_entries // _k.TAB_WAYS)
        self._tabs = np.zeros((_k.N_T, rows * _k.TAB_WAYS, 3), dtype=np.int64)
        self._recent = np.zeros((2, P.ngram + 1), dtype=np.int64)  # the last exec ids / names committed
        self._pbuf = np.zeros(n, dtype=np.int64)  # the pending launch's blocks (``pending``)
        self.pending = None
        self.p = None
        self.horizon = 0
        self.q_end = 0.0
        self.t_blk = ctx.gpu.transfer_time(ctx.block_size)
        self._lat = float(ctx.gpu.fault_batch_latency_s)
        # The one-kernel plan covers the default settings (and any that leave these off); the others, and the
        # reference for tests, take the Python ``_plan``.
        self._fast_plan = bool(P.prefetch and P.pre_evict and P.pace and self.t_blk > 0 and not (
            P.deadline or P.guard_soft or P.whole or P.fault_late))
        # ... and a launch that matches the next recorded one exactly takes one kernel for the whole hook
        self._fast_step = self._fast_plan
        self._step_ep = None  # (``_step_entry``: the entry point, and the arrays it was kept for)
        self._ep_arrays = self._ep_res = self._ep_infl = None
        self.margin_blocks = int(P.margin * ctx.capacity_blocks)
        # The victim pool (``_uvmkernels.plan_paced``): the blocks of the last full victim scan plus every block
        # whose eviction key may have risen since (used, freed, prefetched, or recorded at a position the pointer
        # passed), listed in ``_pool_ids[:_pool_n]`` (``_in_pool`` marks them); a choice made from the pool drops
        # the live blocks it ranks at or below the scan's lowest key (``_pool_min``). Refilled by a full scan when it
        # cannot decide, every pool_launches, and after each jump of the pointer (``_rebuild_nu``). Unused while a
        # prediction made through a learned move or layer stride may still be passed by the pointer (until it
        # reaches ``_pool_stale``, the next jump resets every prediction, or ``_settle_moves`` ties the moved
        # blocks' predictions to where they are recorded): ``pool_due`` would miss it.
        self._in_pool = bb[_k.B_IN_POOL]
        self._pool_ids = bi[_k.I_POOL_IDS]
        # Scratch where the one-kernel steps write the running launch's write flags and their decision
        # (``after_match``: handing back arrays made in a kernel costs more)
        self._wbuf = np.zeros(n, dtype=np.int8)
        self._out = np.zeros(n, dtype=np.int64)
        self._res = np.zeros(_k.N_R, dtype=np.int64)  # (``_uvmkernels.step``'s scalar results, ``R_*``)
        self._pool_n = 0
        self._pool_on = False  # filled by a full scan and kept up since
        self._pool_stale = 0  # history position from which no such prediction lies ahead
        self._pool_min = -1
        self._pool_age = 0
        # Below 2 MiB blocks the driver's density prefetch makes blocks resident that no hook reports: no pool.
        self._pool_k = P.victim_pool if ctx.block_size >= 2 << 20 else 0
        # The window pass's verified span (``_uvmkernels.plan_paced``): positions whose recorded blocks' next uses
        # need no update; emptied (v_lo > v_hi) by whatever else rewrites next uses (a learned move, an advance
        # through the translation, a jump, the moves settled at an iteration's end, a trim of the history).
        self._v_lo, self._v_hi = 0, -1
        self.monitor = WindowMonitor(P.window, P.window_min, P.window_max, P.patience, P.adaptive_window)
        self.pending_advice: list = []
        self.moved_to = bb[_k.B_MOVED_TO]  # blocks that took a recorded block's next use this iteration
        self.s_old = 0  # layer stride (blocks) of older data / of this iteration's data (see _learn_shift)
        self.s_new = 0
        self.it_link_blocks = 0
        self.it_compute = 0.0
        # The settings the one-kernel steps read (``_uvmkernels.P_*`` / ``F_*``)
        kp = {_k.P_POOL_LAUNCHES: P.pool_launches, _k.P_POOL_K: self._pool_k, _k.P_TRACK_MOVES: P.track_moves,
              _k.P_LAYER_STRIDE: P.layer_stride, _k.P_STALL_AWARE: P.stall_aware, _k.P_SCAN_MAX: P.scan_max,
              _k.P_FAULT_LATE_SOFT: P.fault_late_soft, _k.P_DEAD_REUSE: P.dead_reuse,
              _k.P_STABLE_SYNC: P.stable_sync, _k.P_MARGIN: self.margin_blocks, _k.P_INF: INF, _k.P_K_DEAD: _K_DEAD,
              _k.P_K_DIRTY: _K_DIRTY, _k.P_K_CLEAN: _K_CLEAN, _k.P_AGE: _AGE, _k.P_NGRAM: P.ngram,
              _k.P_HISTORY: P.history_launches, _k.P_FUSE: not P.soft_moves}
        self._kp = np.array([int(kp[i]) for i in range(_k.N_P)], dtype=np.int64)
        self._kf = np.array([P.lead_s, self.t_blk, self._lat], dtype=np.float64)
        self._arrays: _k.StepArrays | None = None  # (``_step_arrays``)

    # ------------------------------------------------------------------------------------------ hooks
    def on_free(self, blocks: np.ndarray) -> None:
        if self.invalidating:
            self.dead[blocks] = True
            self._pool_add(blocks)

    def _pool_add(self, blocks: np.ndarray) -> None:
        if self._pool_on:
            self._pool_n = _k.pool_add(blocks, self._in_pool, self._pool_ids, self._pool_n)

    def on_evict(self, blocks: np.ndarray) -> None:
        self.dirty[blocks] = False
        self._note_thrash(blocks, self.stats["launches"])

    def _note_thrash(self, blocks: np.ndarray, index: int, within: int | None = None) -> None:
        """Prefetched blocks leave unused. Only those whose predicted use is still ahead count as thrash (the
        window ran ahead of the room); the others were mispredictions, which a narrower window cannot fix."""
        # The window is narrowed only when such a block is then needed again before it is back (see
        # on_launch): evicting a block brought in early for a sooner need is plain Belady, not thrash.
        # (One kernel: unused = pf_unused[blocks], cleared; "ahead" ones: predicted use after p, and within
        # ``within`` + window/8 when given, are marked thrashed; those behind p or unpredicted: mispredicted.)
        p = self.p if self.p is not None else -1
        lim = within + max(1, self.monitor.window // 8) if within is not None else 0
        wasted, mis = _k.note_thrash(blocks, self.pf_unused, self.nu, self.thrashed, p, lim, within is not None, INF)
        self.stats["mispredicted_blocks"] += mis
        self.stats["thrash_blocks"] += wasted

    def on_fault(self, info: LaunchInfo, blocks: np.ndarray) -> None:
        if self.pending is not None and not info.known_accesses:
            self.pending = self.pending[:3] + (np.union1d(self.pending[3], blocks), None)
        self.it_link_blocks += blocks.shape[0]
        self._pool_add(blocks)  # resident now (with unknown accesses, not in the launch's blocks)
        if self.p is not None:
            pred = self._blocks_at(self.p)
            late = int(np.isin(blocks, pred, assume_unique=True).sum()) if pred.size else 0
            if late:
                self.stats["predicted_faults"] += late
                self.monitor.late(info.index, late)

    def on_iteration(self, k: int) -> None:
        if self.stats["moved_blocks"] != self._moved_at_start and self.p is not None:
            self._settle_moves()
        self._moved_at_start = self.stats["moved_blocks"]
        self._shift_it = False
        self.iters_seen += 1
        self.iter_start = self.end + (self.pending is not None)
        self._prev_start = self.iter_starts[-1] if self.iter_starts else 0
        self.iter_starts.append(self.iter_start)
        if len(self.iter_starts) > 64:  # (bounded: older starts fall out of the trimmed history anyway)
            del self.iter_starts[0]
        self._istarts = np.array(self.iter_starts, dtype=np.int64)
        self._arrays = None  # (``_istarts`` and ``uses`` are new arrays)
        if self.stats["moved_blocks"]:
            self.remap[:] = np.arange(self.remap.shape[0])  # predictions now come from this iteration's ids
            self.rend[:] = 0
        if self.params.advice and self.ctx is not None:
            self._plan_advice()
        self.prev_uses, self.uses = self.uses, self.prev_uses
        self.s_old = self.s_new = 0
        self.uses[:] = 0
        self.it_link_blocks = 0
        self.it_compute = 0.0

    def on_launch(self, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        known = info.known_accesses
        key = int(info.exec_id) & _MASK63
        name = int(info.name)
        if known and self._fast_step:
            # One kernel (``_uvmkernels.step``) for a launch with known accesses, the previous one pending and room
            # in the history: the commit of the previous launch, the n-gram and stable keys, the match (compiled
            # ``_match``), then ``after_match`` (moves, marks, plan) and the counts: the same steps in the same
            # order as the general path below (``_fast_step`` off: tests compare the two in lock step). It leaves
            # the window monitor, and the rest after a match without a pointer (``_rest``), to the Python.
            blocks = info.blocks
            writes = info.write_blocks
            arrays = self._arrays if self._arrays is not None else self._step_arrays()
            resident = state.resident
            in_flight = state.in_flight
            args = (key, name, blocks, writes, info.index, float(info.duration), resident, in_flight,
                    ids_in_use(state), state.capacity_blocks, state.used_blocks, float(state.now), self.monitor.window,
                    arrays)
            # (the step's compiled entry point, without the dispatcher's type resolution, when every array is
            # of the type it was compiled for: ``_step_entry``)
            ep = self._step_ep
            if (ep is not None and arrays is self._ep_arrays and resident is self._ep_res and in_flight is self._ep_infl
                    and type(blocks) is _ND and type(writes) is _ND and blocks.dtype is _I64 and writes.dtype is _I64
                    and blocks.ndim == 1 and writes.ndim == 1 and blocks.flags.carray and writes.flags.carray):
                ep(*args)  # (the checks are ``_plain``'s, inline)
            else:
                _k.step(*args)
                self._step_entry(args)
            r = self._res.tolist()
            code = r[_k.R_CODE]
            if code == _k.C_DECIDED:  # (counted in the kernel)
                dec = self._decision(r[_k.R_STATUS], *self._parts(r[_k.R_NPF], r[_k.R_NEV], r[_k.R_NDC]), state,
                                     blocks)
                return self._advised(dec) if self.pending_advice else dec
            if code == _k.C_MONITOR:
                return self._monitored(info, state, blocks, r[_k.R_AGAIN], r[_k.R_LATE])
            if code == _k.C_REST:
                return self._rest(info, state, blocks, key, name, r[_k.R_SIG], r[_k.R_STAB])
        self._arrays = None  # (the general path may grow the history buffers the step reads)
        self.stats["launches"] += 1
        blocks = info.blocks if known else EMPTY
        sig = _k.launch_sig(name, blocks) if known else hash((key,))
        # the pending launch committed, this one's n-gram and stable signature counted: one kernel
        stab, self.cur_ngram = self._commit_step(self.pending, self.pending_dur, key, blocks, info.write_blocks,
                                                 known and self.params.stable_sync)
        self._match(key, name, sig, stab)
        if known and self._fast_step and self.p is not None and not self.params.soft_moves:
            # the rest in one kernel (as ``step``): moves, layer stride, marks, plan
            self.stats["fused_after_match"] += 1
            n = ids_in_use(state)
            return self._finish(info, state, blocks, key, name, sig, stab, n,
                                _k.after_match(*self._after_args(info, state, blocks, self.p, self.soft, n)))
        return self._rest(info, state, blocks, key, name, sig, stab)

    def _step_entry(self, args: tuple) -> None:
        """Keep the compiled entry point of the ``_uvmkernels.step`` call just made (``args``), for the next
        calls with the same ``StepArrays`` and residency arrays and blocks of the same type (``on_launch`` checks).
        A call with arrays of other types leaves the one kept before.

        Numba's dispatcher reads the type of each argument and looks the compiled function up on every call:
        ~1 us of ~2 warm, and ~10 us of ~20 with the caches cold as between two live hooks
        (bench/results/policy-cost-20261124g). The entry point takes the arguments as the compiled types say
        without checking them, and an array of another dtype or dimension would be read as if it were one (memory
        errors). So it is used only where each array is checked (``_plain``) or is the very object it was checked
        as; the scalars it converts itself (an int as a float, or the reverse, is converted, not misread)."""
        _, _, blocks, writes, _, _, resident, in_flight = args[:8]
        if _plain(blocks, _I64) and _plain(writes, _I64) and _plain(resident, _BOOL) and _plain(in_flight, _BOOL):
            self._step_ep = _k.entry_point(_k.step, args)
            self._ep_arrays, self._ep_res, self._ep_infl = args[-1], resident, in_flight

    def _step_arrays(self) -> _k.StepArrays:
        """The arrays ``_uvmkernels.step`` reads, behind one argument (``_k.STEP_ARRAYS``). Built again after any
        path that may replace one of them: the general path of ``on_launch`` (where the history buffers grow),
        the pending launch's buffer growing, and the end of an iteration."""
        self._arrays = _k.step_arrays(
            self.h_cum._a, self.h_key._a, self.h_name._a, self.h_sig._a, self.h_soft._a, self.h_ptr._a, self.f_blk._a,
            self.f_w._a, self.f_next._a, self._tabs, self._recent, self._istarts, self._bi, self._bb, self.uses,
            self._mark, self._kp, self._kf, self._reg, self._regf, self._wbuf, self._pbuf, self._out, self._res,
            self._cnt)
        return self._arrays

    def _rest(self, info: LaunchInfo, state: ResidencyView, blocks: np.ndarray, key: int, name: int, sig: int,
              stab: int) -> Decision | None:
        """``on_launch`` after the match, step by step (the reference of ``after_match``, and the path of launches
        without known accesses or with ``soft_moves``)."""
        st = self.stats
        known = info.known_accesses
        if known and self.p is not None and self.params.track_moves:
            self._learn_moves(info.write_blocks)
        if known and self.soft and self.p is not None and self.p >= self.iter_start and self.params.layer_stride:
            self._learn_shift(blocks, info.write_blocks)
        if known and self.soft and self.params.soft_moves:
            self._classify_soft(blocks, info.write_blocks)
        wmask = None
        again = late = 0
        if known:
            # not dead, not an unused prefetch; writes dirty / written / w_iter; uses += 1; last_use; the
            # write mask over the blocks (for the history); then ``cur_marks``; the blocks join the victim pool
            # (used now: last use, dirty, dead and next use change)
            wmask, (_, again, late), self._pool_n = _k.launch_marks(
                blocks, info.write_blocks, self.iters_seen, info.index, self.dead, self.pf_unused, self.dirty,
                self.written, self.w_iter, self.uses, self.last_use, self.thrashed, state.resident, state.in_flight,
                self._pool_on, self._in_pool, self._pool_ids, self._pool_n)
            cur = blocks
        else:
            # Unknown accesses: what the launch used is what was predicted (and came in) plus what faults add.
            cur = self._blocks_at(self.p).copy() if self.p is not None else EMPTY
            self._pool_add(cur)
            if cur.size:
                _, again, late = _k.cur_marks(cur, self.thrashed, state.resident, state.in_flight)
        self.pending = (key, name, sig, cur, wmask)
        self.pending_stab = stab
        self.pending_ngram = self.cur_ngram
        self.pending_dur = float(info.duration)
        self.it_compute += float(info.duration)
        # (again: thrashed blocks needed now, evicted unused, not back in time)
        if again and self.p is not None:  # without a prediction the window is not what failed
            self.stats["refetched_blocks"] += again
            self.monitor.thrash(info.index, again)
        self.cur_waits = late > 0
        if late:
            st["late_blocks"] += late
            self.monitor.late(info.index, late)
        return self._advised(self._plan(info, state, cur))

    def _after_args(self, info: LaunchInfo, state: ResidencyView, blocks: np.ndarray, q: int, soft: int,
                    n: int) -> tuple:
        """The arguments of ``_uvmkernels.after_match`` for the running launch, the pointer at ``q`` matched as
        ``soft`` (``step`` reads the same from the policy's arrays)."""
        it0 = self.iter_start
        return (q, soft, blocks, info.write_blocks, info.index, self.iters_seen,
                self._record_end(q) if q < it0 else 0, self.stats["moved_blocks"] != self._moved_at_start, it0,
                self.h_ptr._a, self.h_soft._a, self.f_blk._a, self.f_w._a, self.f_next._a, self.base, self.fbase,
                self.h_ptr.n, self.f_blk.n, state.resident, state.in_flight, n, state.capacity_blocks,
                state.used_blocks, state.now, float(info.duration), self.monitor.window, self._bi, self._bb, self.uses,
                self._mark, self._kp, self._kf, self._reg, self._regf, self._wbuf, self._out)

    def _finish(self, info: LaunchInfo, state: ResidencyView, blocks: np.ndarray, key: int, name: int, sig: int,
                stab: int, n: int, after: tuple) -> Decision | None:
        """``on_launch`` after ``after_match`` (``after``: what it returns): the running launch pending its
        commit, the window monitor, the plan's decision, the advice."""
        st = self.stats
        (stage, moved, again, late, status, n_pf, n_ev, n_dc, wasted, mis, live, pooled, refilled, shifted) = after
        if shifted:
            self._shift_it = True
        st["moved_blocks"] += moved
        # (the write flags: read by the next commit, before the next one-kernel step writes ``_wbuf`` again)
        self.pending = (key, name, sig, blocks, self._wbuf[:blocks.shape[0]])
        self.pending_stab = stab
        self.pending_ngram = self.cur_ngram
        self.pending_dur = float(info.duration)
        self.it_compute += float(info.duration)
        self.cur_waits = late > 0
        if stage:
            return self._monitored(info, state, blocks, again, late)
        pf, evict, discard = self._parts(n_pf, n_ev, n_dc)
        return self._advised(self._decide(status, pf, evict, discard, wasted, mis, live, pooled, refilled, state,
                                          blocks))

    def _parts(self, n_pf: int, n_ev: int, n_dc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The blocks a one-kernel plan chose, from ``_out`` (one copy; a part that is all of it or nothing needs
        no slice): to prefetch, evict, discard."""
        m = n_pf + n_ev + n_dc
        if not m:
            return EMPTY, EMPTY, EMPTY
        out = self._out[:m].copy()
        return (out if n_pf == m else out[:n_pf] if n_pf else EMPTY,
                out if n_ev == m else out[n_pf:n_pf + n_ev] if n_ev else EMPTY,
                out if n_dc == m else out[m - n_dc:] if n_dc else EMPTY)

    def _monitored(self, info: LaunchInfo, state: ResidencyView, blocks: np.ndarray, again: int,
                   late: int) -> Decision | None:
        """The plan of a launch whose blocks came back after thrash (``again``) or are late: the window monitor
        sees them first."""
        st = self.stats
        if again:
            st["refetched_blocks"] += again
            self.monitor.thrash(info.index, again)
        if late:
            st["late_blocks"] += late
            self.monitor.late(info.index, late)
        return self._advised(self._plan(info, state, blocks))

    def _advised(self, dec: Decision | None) -> Decision | None:
        """``dec`` with the advice waiting to be given (``_plan_advice``), if any."""
        if self.pending_advice:
            dec = dec or Decision()
            dec.advise = tuple(self.pending_advice)
            self.pending_advice = []
        return dec

    def report(self) -> dict:
        out = dict(self.stats)
        out.update(self.monitor.report())
        out["history_launches"] = len(self.h_key)
        out["history_entries"] = len(self.f_blk)
        used = np.count_nonzero(self._tabs[:, :, 2], axis=1)
        out["table_entries"] = {"signature": int(used[_k.T_SIG]), "stable_signature": int(used[_k.T_STAB]),
                                "exec_ngram": int(used[_k.T_EXEC]), "name_ngram": int(used[_k.T_NAME])}
        arrays = (self._bi, self._bb, self.uses, self.prev_uses, self.advice, self._mark, self._wbuf, self._out,
                  self._tabs, self._recent)
        out["state_bytes"] = int(sum(a.nbytes for a in arrays) + sum(
            g.nbytes for g in (self.h_key, self.h_name, self.h_sig, self.h_ptr, self.f_blk, self.f_next, self.f_w)))
        out["invalidating"] = self.invalidating  # frees taken as deaths (invalidate, and the caller can discard)
        n = self.stats["launches"]
        out["prediction_rate"] = (self.stats["matched"] + self.stats["soft"] + self.stats["resync"]) / n if n else None
        return out

    # ------------------------------------------------------------------------------------ history
    @property
    def end(self) -> int:
        """Absolute position one past the last committed launch."""
        return self.base + len(self.h_key)

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        """Flat index range (relative to ``fbase``) of positions ``lo..hi-1``."""
        hp = self.h_ptr.view()
        a = int(hp[lo - self.base]) - self.fbase
        b = (int(hp[hi - self.base]) - self.fbase) if hi < self.end else len(self.f_blk)
        return a, b

    def _blocks_at(self, pos: int) -> np.ndarray:
        a, b = self._span(pos, pos + 1)
        return self.f_blk.view()[a:b]

    def _commit(self, key: int, name: int, sig: int, blocks: np.ndarray, wmask: np.ndarray | None = None,
                dur: float = 0.0) -> None:
        """Commit a launch to the history (``_commit_step`` without counting a running launch)."""
        self._commit_step((key, name, sig, blocks, wmask), dur, 0, EMPTY, EMPTY, False, counting=False)

    def _commit_step(self, pending: tuple | None, dur: float, key: int, blocks: np.ndarray, writes: np.ndarray,
                     stable: bool, counting: bool = True) -> tuple[int, int]:
        """``_uvmkernels.commit_step``: the ``pending`` launch (if any) committed to the history (its entry, its
        blocks, ``f_next`` links of their previous entries, the tables); then the running launch (exec id ``key``)
        counted: its n-gram key and, with ``stable``, its stable key, returned ``(stab, ngram)``."""
        if pending is not None:
            pkey, pname, psig, pblocks, pwmask = pending
            hn, fn, has_w = self._commit_room(pblocks, pwmask)
            cum = self.cum_total
            self._commit_lengths(hn, fn + pblocks.shape[0], dur)
        else:
            pkey = pname = psig = hn = fn = 0
            pblocks = pwmask = EMPTY
            has_w = False
            cum = 0.0
        out = _k.commit_step(self.h_cum._a, self.h_key._a, self.h_name._a, self.h_sig._a, self.h_soft._a,
                             self.h_ptr._a, self.f_blk._a, self.f_w._a, self.f_next._a, hn, fn, cum, pkey, pname, psig,
                             self.soft, pblocks, pwmask if has_w else _NO_W, has_w, -1 if self.p is None else self.p,
                             self.base, self.fbase, pending is not None, counting, key, blocks, writes, stable,
                             self.iters_seen, self._bi, self._kp, self._tabs, self._recent, self._reg,
                             self.pending_stab, self.pending_ngram)
        if pending is not None and len(self.h_key) > self.params.history_launches:
            self._trim(len(self.h_key) // 2)
        return out

    def _commit_room(self, blocks: np.ndarray, wmask: np.ndarray | None) -> tuple[int, int, bool]:
        """Room in the history buffers for one more position and its blocks; returns ``(hn, fn, has_w)``: the
        position's index, its first flat index, whether ``wmask`` holds the blocks' write flags."""
        hn = self.h_key.n
        fn = self.f_blk.n
        k = blocks.shape[0]
        if hn + 1 > self._h_room:  # the six per-position arrays grow together
            self._h_room = min(g.reserve(hn + 1).shape[0] for g in self._hist)
        if fn + k > self._f_room:
            self._f_room = min(g.reserve(fn + k).shape[0] for g in self._flat)
        return hn, fn, wmask is not None and wmask.shape[0] == k

    def _commit_lengths(self, hn: int, nflat: int, dur: float) -> None:
        """The history's lengths with position ``base + hn`` counted (``nflat`` flat entries in all) and the
        predicted time moved past it: set before the commit kernel fills the reserved room (``_commit_step``;
        ``_uvmkernels.step`` does the same), which reads the time from before (``cum``)."""
        self.cum_total += dur
        for g in self._hist:
            g.n = hn + 1
        for g in self._flat:
            g.n = nflat

    def _trim(self, k: int) -> None:
        """Forget the oldest ``k`` launches of history (bounded state)."""
        cut = int(self.h_ptr.view()[k])
        fk = cut - self.fbase
        for arrays, m in ((self._hist, k), (self._flat, fk)):
            n0 = arrays[0].n
            for g in arrays:  # (they share one length: each drops from the same one)
                g.n = n0
                g.drop_front(m)
        self.base += k
        self.fbase = cut
        self._v_lo, self._v_hi = 0, -1
        if self.p is not None and self.p < self.base:
            self.p = None
        self.horizon = max(self.horizon, self.base)

    def _match(self, key: int, name: int, sig: int, stab: int = 0) -> None:
        """Move the pointer to the history position matching the launch about to run.

        Most specific first: the next recorded launch with the same exact signature, the last position with
        it, then the *stable signature* (exec id + the blocks of older data it reads, ``_uvmkernels.stable_sig``,
        and how many times it occurred before in this iteration): while the caching allocator still moves a
        step's activations around (the first iterations), exact
        signatures miss, but a layer's weights say which layer this is; without it the pointer would follow
        the name n-grams into the last layer seen and stay a layer (or a pass) off. It jumps only within the
        records of this iteration and the last: further back is another pattern (alternating sequence
        lengths), whose exact signatures and n-grams find it when it returns, and a jump there re-plans the
        end of the step for a pattern that may not come next (measured: the second occurrence of a pattern
        14 % above its steady time instead of 3 %). Then the next launch by name, then the n-gram tables.

        The reference of ``_uvmkernels.match`` (the same branches, table uses and counts), which ``on_launch`` runs
        inside ``_uvmkernels.step``."""
        st = self.stats
        self.soft = 0
        base = self.base
        end = base + self.h_key.n
        p = self.p
        nxt = p + 1 if p is not None else None
        # (``GrowArray._a[i]`` for i below its length: the filled part, without a view per read)
        if nxt is not None and nxt < end and int(self.h_sig._a[nxt - base]) == sig:
            self._advance(nxt)
            st["matched"] += 1
            return
        q = self._tab_get(_k.T_SIG, sig)
        if (q is not None and q >= self.iter_start and nxt is not None and self.iter_starts
                and self.iter_starts[0] <= nxt < self.iter_start and int(self.h_name._a[nxt - base]) == name):
            # The same blocks earlier in this iteration (a buffer every layer touches alike) while the pointer
            # follows a later record than the cold iteration's and it goes on with this kernel: a repeat inside
            # the step, not the place in the loop (jumping there and back rebuilt every block's next use once a
            # layer, and a resync into this iteration dropped blocks the next step needs first: GPT-2-large at
            # 2x, iterations 2-3 at 1.12-1.18x the oracle -> 1.02-1.04x). Iteration 0's record is left out: its
            # activations sat elsewhere (the allocator was still mapping segments), and the previous layer of
            # this iteration, shifted by the layer stride, predicts them better (iteration 1: 1.31x vs 1.43x).
            q = None
        if (q is None or not base <= q < end) and stab:
            q2 = self._tab_get(_k.T_STAB, stab)
            if q2 is not None and self._prev_start <= q2 < end and int(self.h_key._a[q2 - base]) == key and q2 != nxt:
                st["stable_resync"] += 1
                self.soft = 1
                self.p = q2
                self.horizon = q2 + 1
                self._rebuild_nu(q2)
                return
        if q is None or not base <= q < end:
            if nxt is not None and nxt < end and int(self.h_name._a[nxt - base]) == name:
                self._advance(nxt)  # same kernel, other data (data-dependent accesses): keep going
                self.soft = 2 if self.h_soft._a[nxt - base] else 1
                st["soft"] += 1
                return
            n = self.params.ngram
            q = None
            if self._reg[_k.G_RECENT] >= n:
                q = self._tab_get(_k.T_EXEC, self.cur_ngram) if self.cur_ngram else None
                if q is None or not base <= q < end:
                    q = self._tab_get(_k.T_NAME, _k.name_key(self._recent, self._reg, name, n))
            if q is None or not base <= q < end:
                self.p = None
                st["unpredicted"] += 1
                return
        if q == nxt:
            self._advance(q)
            st["matched"] += 1
            return
        st["resync"] += 1
        self.p = q
        self.horizon = q + 1
        self._rebuild_nu(q)

    def _tab_get(self, t: int, key: int) -> int | None:
        """The position table ``t`` (``_uvmkernels.T_*``) holds for ``key`` (a use), None if none."""
        q = _k.tab_get(self._tabs, t, key, self._reg)
        return int(q) if q >= 0 else None

    def _learn_moves(self, writes: np.ndarray) -> None:
        """The caching allocator may place a step's activations elsewhere than last step. When the launch
        matched at ``p`` (in an earlier iteration) wrote other blocks than it writes now, pair the written
        blocks in address order: later predicted reads of the recorded blocks are translated to the new ones.
        Only writes are paired (a written block is where the output tensor lives), and only against earlier
        iterations (inside one iteration a repeated layer is another tensor, not a moved one). Where the record
        later writes a new tensor into the old address (``rend``: the caching allocator reused it, e.g. for
        optimizer state), that tensor is predicted both translated and, if the address holds live data now,
        where it is: GPT-2-large at 2x, iteration 1 at 1.24x the oracle instead of 1.31x (the optimizer state sat
        at addresses whose every recorded use was translated away, so it ranked as unused and was fetched only
        at the step)."""
        if self.p >= self.iter_start:
            return
        # (pairs the recorded writes with ``writes`` in order; the tensor's predicted next use moves with it:
        # victim choice reads nu by actual block; next uses changed: a moved block takes its old address's,
        # wherever that is recorded, revised ones rose: the pool is refilled; translated predictions lie before
        # the end of the followed record)
        moved, self._pool_on, self._pool_stale, revised = _k.learn_moves_pool(
            self.p, self.h_ptr._a, self.base, self.fbase, self.h_ptr.n, self.f_blk.n, self.f_blk._a, self.f_w._a,
            self.f_next._a, writes, self.remap, self.rend, self._record_end(self.p), self.nu, self.dead, self.first_it,
            self.first_pos, self.iters_seen, self.moved_to, self._pool_on, self._pool_stale, INF)
        self.stats["moved_blocks"] += moved
        if revised:
            self._v_lo, self._v_hi = 0, -1

    def _settle_moves(self) -> None:
        """At the end of an iteration that learned moves: the remap is dropped, and with it what kept the moved
        blocks' next uses up to date (``advance`` moves them on only through it). A block this iteration used
        is next used where its record first has it, the same offset of the next step (``first_pos``), unless a
        still valid prediction lies in what is left of the followed record; a moved block's is not valid (it
        came from its old address), nor one the pointer passed (left there, it would rank as no predicted use
        all next step: discarded when dead, brought back later; ResNet-152 at 1.5x, iteration 3 at 1.12x the
        oracle instead of 1.02x)."""
        p = self.p
        used = np.flatnonzero(self.first_it == self.iters_seen)
        nu = self.nu[used]
        stale = self.moved_to[used] | (nu <= p) | (nu >= INF)
        fix = used[stale]
        self.nu[fix] = self.first_pos[fix]
        if fix.size:
            # The plan may already have passed those positions (at the end of a step it plans the next one's
            # start from this step's record) while the blocks were on the GPU; one evicted since (ranked by its
            # stale prediction) would wait there until the pointer is a launch away from its use, and then
            # arrive late behind the queue: the plan goes back over them (GPT-2-large at 1.5x, iteration 3:
            # 80-block launches late at the start of the forward pass, 1.07x the oracle -> 1.00x).
            self.horizon = min(self.horizon, int(self.first_pos[fix].min()))
        if not self._shift_it:
            # The victim pool waited (``_pool_stale``) for the predictions made through this iteration's moves;
            # with the remap dropped and the moved blocks now predicted where they are recorded, only those of
            # the moved blocks not settled (first used by the running launch, not yet committed) are left.
            # (Predictions made through a layer stride this iteration keep the wait as it is.)
            left = self.nu[self.moved_to & (self.first_it != self.iters_seen)]
            left = left[left < INF]
            wait = int(left.max()) + 1 if left.size else 0
            if wait < self._pool_stale:
                self.stats["pool_waits_lifted"] += 1
            self._pool_stale = wait
        self.moved_to[:] = False
        self._pool_on = False  # (refilled at the next decision)
        self._v_lo, self._v_hi = 0, -1

    def _learn_shift(self, blocks: np.ndarray, writes: np.ndarray) -> None:
        """The pointer follows an earlier launch of this iteration with other blocks: a repeated layer (the
        first iteration, before any record of the next layer exists). Its blocks are the recorded ones shifted
        by the distance between layers, one for weights and one for activations (the caching allocator lays
        both out layer after layer). Learned from this launch against the recorded one (``learn_shift``);
        ``candidates`` applies it to the positions ahead, which then predict the coming layers."""
        a, b = self._span(self.p, self.p + 1)
        ok_o, d_o, ok_n, d_n = _k.learn_shift(self.f_blk.view()[a:b], self.f_w.view()[a:b], blocks, writes,
                                               self.w_iter, self.iters_seen)
        if ok_o:
            self.s_old = int(d_o)
        if ok_n:
            self.s_new = int(d_n)
        if ok_o or ok_n:  # shifted predictions lie within this iteration's record so far
            self._pool_on = False
            self._pool_stale = max(self._pool_stale, self.end + 1)
        if self.s_old or self.s_new:
            self._shift_it = True

    def _shift_from(self) -> int:
        """First history position whose blocks ``candidates`` shifts by the layer stride (INF: none)."""
        p = self.p
        if p is None or p < self.iter_start or not (self.s_old or self.s_new):
            return INF
        return self.iter_start

    def _classify_soft(self, blocks: np.ndarray, writes: np.ndarray) -> None:
        """A soft match (same kernel, other blocks) is data-dependent only if a block it reads that was not
        predicted is older data (e.g. another expert's weights). New blocks that hold what this iteration wrote
        (activations the allocator placed elsewhere) or that the launch writes itself are a move: the slot
        stays predictable, and its blocks keep the right to evict (``guard_soft``)."""
        pred = self._blocks_at(self.p)
        if self.params.track_moves and self.stats["moved_blocks"]:
            pred = self.remap[pred]
        new = blocks[~np.isin(blocks, pred)]
        if new.size == blocks.size:
            return  # nothing as predicted: another tensor altogether, not a moved one
        if new.size:
            fresh = self.w_iter[new] == self.iters_seen
            if writes.size:
                fresh |= np.isin(new, writes, assume_unique=True)
            if not fresh.all():
                return
        self.soft = 0
        self.stats["soft_moves"] += 1

    def _remap_lim(self) -> int:
        """Positions before this one take the learned moves (``candidates``): the end of the recorded iteration the
        pointer follows (the moves pair its blocks with this iteration's); 0 when there are none to apply."""
        p = self.p
        # (``remap`` is the identity again from each iteration's end until the next move is learned: 0 then,
        # which spares the kernels the translation and lets the window pass stop at its cap)
        if (not self.params.track_moves or self.stats["moved_blocks"] == self._moved_at_start or p is None
                or p >= self.iter_start):
            return 0
        return self._record_end(p)

    def _record_end(self, p: int) -> int:
        """One past the last position of the recorded iteration that holds position ``p`` (before this one)."""
        i = bisect.bisect_right(self.iter_starts, p)
        return self.iter_starts[i] if i < len(self.iter_starts) else self.iter_start

    def _advance(self, q: int) -> None:
        self.p = q
        lim = self._remap_lim()
        if lim:  # (next uses set through the translation: the window pass's verified span is gone)
            self._v_lo, self._v_hi = 0, -1
        # (with the pool on, ``pool_due`` first)
        self._pool_n = _k.advance(q, self.h_ptr._a, self.base, self.fbase, self.h_ptr.n, self.f_blk.n, self.f_blk._a,
                                  self.f_next._a, self.remap, self.rend, lim, self.nu, self.first_it,
                                  self.first_pos, self.iters_seen, self.dead, self._pool_on, self._in_pool,
                                  self._pool_ids, self._pool_n)

    def _rebuild_nu(self, q: int) -> None:
        """Predicted next use of every block after a jump of the pointer to ``q`` (O(history))."""
        self._pool_on = False
        self._v_lo, self._v_hi = 0, -1
        self._pool_stale = self.end + 1 if (self.s_old or self.s_new) else 0
        a, b = self._span(q + 1, self.end) if q + 1 < self.end else (len(self.f_blk), len(self.f_blk))
        # nu = INF, then each block's first entry in [a, b) (positions from q + 1); bounded cost: beyond
        # scan_max entries, next uses count as unknown.
        _k.rebuild_nu(self.nu, self.f_blk.view(), a, b, self.h_ptr.view(), self.base, self.fbase, q + 1,
                      self.params.scan_max, INF)

    def _until(self, p: int, pos):
        """Predicted compute time from the start of launch ``p + 1`` to the start of ``pos`` (>= p + 1)."""
        hc = self.h_cum.view()
        return hc[np.asarray(pos) - self.base] - hc[p + 1 - self.base]

    def _positions(self, lo: int, hi: int, a: int, b: int) -> np.ndarray:
        """History position of each flat entry in ``[a, b)`` = positions ``lo..hi-1``."""
        hp = self.h_ptr.view()[lo - self.base:hi - self.base] - self.fbase
        lens = np.diff(np.append(hp, b))
        return np.repeat(np.arange(lo, hi, dtype=np.int64), lens)

    # ------------------------------------------------------------------------------------ planning
    def _plan(self, info: LaunchInfo, state: ResidencyView, cur: np.ndarray) -> Decision | None:
        P = self.params
        p = self.p
        if p is not None and self._fast_plan:
            return self._plan_paced(info, state, cur, p)
        scan_hi = p if p is not None else -1
        res_, infl = state.resident, state.in_flight
        miss = EMPTY
        if cur.size:
            miss = _k.missing(cur, res_, infl)
        pa = pb = sa = sb = 0
        lo = 0
        if P.prefetch and p is not None:
            w = self.monitor.window
            lo = max(p + 1, self.horizon)
            hi = min(p + w, self.end - 1)
            if lo > p + 1:  # always re-check the very next launch (a block may have been evicted since)
                pa, pb = self._span(p + 1, p + 2)
            if lo <= hi:
                # Scan in growing chunks and stop once more blocks are missing than this decision could
                # place (free room + what the link can take before the next decision): the rest would be
                # re-read next time anyway, and scanning it is the policy's main cost.
                free0 = max(0, state.capacity_blocks - state.used_blocks - self.margin_blocks)
                if P.pace and P.pre_evict and self.t_blk > 0:
                    spare = (state.now + float(info.duration) + P.lead_s - max(self.q_end, state.now)) / self.t_blk
                    if P.stall_aware and self.cur_waits:
                        spare = (float(info.duration) + P.lead_s) / self.t_blk  # see the pacing below
                    cap = free0 + max(0, int(spare)) + 8
                else:
                    cap = free0 + state.capacity_blocks
                if free0 == 0 and cap <= 8 and not (P.deadline and P.pace):
                    hi = min(hi, p + 1)  # link busy, no room: only the next launch can be served now
                # Link-bound stretches (a burst of launches needing more link time than their compute) must
                # be started early: keep scanning while the queue would not deliver by a launch's start.
                chase = P.deadline and P.pace and P.pre_evict and self.t_blk > 0
                q0 = max(self.q_end, state.now) + (miss.size if cur.size else 0) * self.t_blk
                t0 = state.now + float(info.duration)
                # One kernel: chunks of 16, 32, ... positions; the chunks are contiguous in the flat history,
                # so the candidates read are the flat span [sa, sb) of positions lo..scan_hi.
                scan_hi, sa, sb = _k.scan_window(
                    self.h_ptr.view(), self.base, self.fbase, len(self.f_blk), self.end, self.f_blk.view(), res_,
                    infl, self.h_cum.view(), lo, hi, p, cap, chase, q0, t0, self.t_blk, P.scan_max, scan_hi)
        if not (miss.size or pb > pa or sb > sa):
            return self._margin(state, cur) if P.pre_evict and self.margin_blocks else None
        # Candidates in order of need (running launch's misses, the next launch, the scanned span); recorded
        # blocks -> where they live now; ``nu`` updated from what the plan just read (the freshest prediction
        # of these blocks' next use, so a block brought in or kept for launch j is never a victim for a later
        # need: the earliest position ahead of ``p`` wins); then blocks resident or in flight and repeats go.
        blk, pos = _k.candidates(
            miss, self.f_blk.view(), pa, pb, (p + 1) if p is not None else -1, sa, sb, self.h_ptr.view(),
            self.base, self.fbase, lo, self.remap, self.rend,
            self._remap_lim(), self.nu, p if p is not None else -1,
            p is not None, res_, infl, self._mark, self._shift_from(), self.s_old, self.s_new, self.w_iter,
            self.iters_seen, self.dead)
        n = blk.shape[0]
        free = max(0, state.capacity_blocks - state.used_blocks - self.margin_blocks)
        now = state.now
        q = max(self.q_end, now)
        evict = discard = EMPTY
        if not P.pre_evict:
            # Without our own victims the driver evicts (least recently migrated) for whatever we queue:
            # the running and the next launch's blocks go beyond the free room (DeepUM's "prefetch only"),
            # further ones only into free room, or the driver would evict blocks needed sooner.
            near = int((pos <= (p + 1 if p is not None else -1)).sum())
            placed = min(n, max(near, free))
        else:
            placed = min(free, n)
            rest = n - placed
            guess = None
            if rest and p is not None and P.guard_soft:
                # Launches whose blocks changed the last time (data-dependent) get free room only: evicting
                # a sure block for a guess is how a wrong prediction turns into thrash.
                hs = self.h_soft.view() < 2
                sure = np.ones(rest, dtype=bool)
                tail = pos[placed:]
                known = tail >= self.base
                sure[known] = hs[tail[known] - self.base]
                if P.guess_unpredicted:
                    guess = ~sure  # kept: they may take dead / unpredicted victims below
                elif not sure.all():
                    blk = np.concatenate([blk[:placed], blk[placed:][sure]])
                    pos = np.concatenate([pos[:placed], tail[sure]])
                    n = blk.shape[0]
                    rest = n - placed
            if rest and P.pace and self.t_blk > 0:
                # Evictions for launches after the next one only while the link has spare time before the
                # next decision point (decided before choosing victims: choosing them is the costly part).
                until = now + float(info.duration) + P.lead_s
                if P.stall_aware and self.cur_waits:
                    # The running launch waits for blocks still in flight: the next decision point comes
                    # only after they arrive (about when the queue drains), so the link has that much longer.
                    until += max(0.0, q - now)
                near = _k.count_le(pos, placed, p + 1 if p is not None else -1)
                # (rounded up while the running launch matched its record exactly: the link stays busy up to the
                # next decision point instead of idling for part of a block at each one; at ~1-block launches
                # that idle was a fifth of the link, ResNet-152 at 2x in its steady state 1.05x the oracle ->
                # 1.01x. Rounded down while following the record softly (moved activations, data-dependent
                # slots): one more eviction on an uncertain prediction costs more than the idle (ResNet-152 at
                # 1.5x, iteration 1: 1.46x the oracle rounded up, 1.35x down).)
                room = (until - (q + placed * self.t_blk)) / self.t_blk
                budget = max(0, int(np.ceil(room) if not self.soft else room))
                rest_paced = min(rest, near + budget)
                if P.whole and budget > 0 and rest_paced < rest:
                    # As the oracle: the launch the budget reaches into is queued whole (a launch waits for
                    # its last block, so a part of its blocks early buys nothing).
                    tail = pos[placed:]
                    rest_paced = int(np.searchsorted(tail, tail[rest_paced - 1], side="right")) if rest_paced else 0
                if P.deadline and p is not None and p + 1 < self.end:
                    # The link is behind schedule up to the last candidate that, queued now in order, would
                    # still arrive after its launch's predicted start: deferring those only makes them later.
                    tail = pos[placed:]
                    arrive = q + self.t_blk * (placed + np.cumsum(~self.dead[blk[placed:]]))
                    need_t = now + float(info.duration) + self._until(p, np.maximum(tail, p + 1))
                    late = np.flatnonzero(arrive > need_t)
                    if late.size:
                        rest_paced = max(rest_paced, min(rest, int(late[-1]) + 1))
                rest = rest_paced
            k_ok = 0
            if guess is not None and rest < guess.shape[0]:
                guess = guess[:rest]
            if rest:
                vict, vkey = self._victims(state, cur, rest)
                m = vict.shape[0]
                if guess is not None and guess.any():
                    ok = vkey > pos[placed:placed + m]
                    # A guessed block (data-dependent slot) never evicts a block with a predicted reuse.
                    ok &= ~guess[:m] | (vkey > INF)
                    k_ok = int(np.argmin(ok)) if not ok.all() else m
                else:  # the first victim whose key is not above the position it would make room for
                    k_ok = _k.first_not_above(vkey, pos, placed)
                if k_ok:
                    chosen = vict[:k_ok]
                    # Dead ones are discarded, the others evicted. Our own Belady choice of a prefetched block
                    # for a sooner need is not thrash by itself (the link did useful work ahead); it counts when
                    # it happens with the window at its reach, i.e. for victims whose predicted use is within
                    # the next launches (``_note_thrash`` with ``within=p + 1``). Then they are clean.
                    pw = p if p is not None else -1
                    evict, discard, wasted, mis = _k.take_victims(
                        chosen, self.dead, self.dirty, self.pf_unused, self.nu, self.thrashed, pw,
                        (p + 1 if p is not None else -1) + max(1, self.monitor.window // 8), INF)
                    self.stats["mispredicted_blocks"] += mis
                    self.stats["thrash_blocks"] += wasted
                    self.stats["evicted_blocks"] += evict.shape[0]
                    self.stats["discarded_blocks"] += discard.shape[0]
                placed += k_ok
        if P.prefetch:
            pf = blk[:placed]
            pp = pos[:placed]
            lat = self.ctx.gpu.fault_batch_latency_s if self.ctx else 0.0
            if pf.size and q > now + lat:
                # The H2D queue is busy: the running launch's own misses fault instead (faults go ahead
                # of queued prefetches); their room was reserved above.
                keep = pp >= 0
                if (P.fault_late or P.fault_late_soft) and p is not None and (
                        P.fault_late or (p + 1 < self.end and self.h_soft.view()[p + 1 - self.base] > 0)):
                    # So do the next launch's blocks that would arrive (FIFO, behind the queue) after it
                    # starts: a fault would fetch them sooner. At a soft slot only its blocks of older data:
                    # those are the guesses (another expert's weights); what this iteration wrote is where the
                    # record said (a slot marked soft because the allocator moved its activations the last
                    # time; ResNet-152 at 2x, end of the backward pass: 80 blocks faulted a launch late).
                    arrive = q + self.t_blk * np.cumsum(~self.dead[pf])
                    late = (pp == p + 1) & (arrive > now + float(info.duration) + lat)
                    if not P.fault_late:
                        late &= self.w_iter[pf] != self.iters_seen
                    keep &= ~late
                pf = pf[keep]
        else:
            pf = EMPTY
        done = placed == n
        if p is not None and P.prefetch:
            if done:
                self.horizon = max(self.horizon, scan_hi + 1)
            elif placed:
                self.horizon = max(self.horizon, int(pos[placed]) if pos[placed] >= 0 else p + 1)
        if pf.size:
            live = _k.mark_prefetched(pf, self.pf_unused, self.dead)  # unused until touched; live ones move
            self.q_end = q + live * self.t_blk
            self.stats["prefetched_blocks"] += pf.shape[0]
            self.it_link_blocks += live
        if not (pf.size or evict.size or discard.size):
            return None
        return Decision(prefetch=pf, evict=evict, discard=discard)

    def _plan_paced(self, info: LaunchInfo, state: ResidencyView, cur: np.ndarray, p: int) -> Decision | None:
        """``_plan`` for its common case in one kernel (``_uvmkernels.plan_paced``): the same decisions, the
        Python code above stays the reference (``_fast_plan`` off) and covers the other settings."""
        P = self.params
        n = ids_in_use(state)  # (the live runtime's arrays span the device; its ids stop at n)
        self._pool_age += 1
        on = self._pool_on and self._pool_age <= P.pool_launches
        res = _k.plan_paced(
            cur, state.resident[:n], state.in_flight[:n], state.capacity_blocks, state.used_blocks, self.margin_blocks,
            state.now, float(info.duration), P.lead_s, self.q_end, self.cur_waits, P.stall_aware, not self.soft, p,
            self.monitor.window, self.horizon, self.h_ptr.view(), self.base, self.fbase, self.h_ptr.n, self.f_blk.n,
            self.f_blk._a, self.h_soft._a, P.scan_max, self.remap, self.rend,
            self._remap_lim(), self.nu, self._mark, self.dead, self.dirty, self.last_use,
            self.pf_unused, self.thrashed, self.t_blk, self._lat, P.fault_late_soft, INF, _K_DEAD, _K_DIRTY,
            _K_CLEAN, _AGE, P.dead_reuse, self._shift_from(), self.s_old, self.s_new, self.w_iter, self.iters_seen,
            self._pool_ids, self._pool_n, self._in_pool, self._pool_on, on, self._pool_min,
            self._pool_k if p >= self._pool_stale else 0, self._v_lo, self._v_hi)
        return self._after_plan(res, state, cur, n)

    def _after_plan(self, res: tuple, state: ResidencyView, cur: np.ndarray, n: int) -> Decision | None:
        """``_plan_paced`` after its kernel (``res``: what ``plan_paced`` returns): the pool, the decision."""
        (status, pf, evict, discard, self.horizon, self.q_end, wasted, mis, live, pool_new,
         self._pool_min, pooled, pool_n, self._v_lo, self._v_hi) = res
        if pool_new.shape[0]:  # a full scan refilled the pool (as ``after_match``)
            self._pool_n = _k.pool_refill(pool_new, cur, state.in_flight[:n], pf, self._in_pool, self._pool_ids, pool_n)
            self._pool_on = True
            self._pool_age = 0
        else:
            self._pool_n = pool_n
        return self._decide(status, pf, evict, discard, wasted, mis, live, pooled, pool_new.shape[0] > 0, state, cur)

    def _decide(self, status: int, pf: np.ndarray, evict: np.ndarray, discard: np.ndarray, wasted: int, mis: int,
                live: int, pooled: bool, refilled: bool, state: ResidencyView, cur: np.ndarray) -> Decision | None:
        """The decision of a plan made in one kernel (``plan_paced``, directly or in ``after_match``), and its
        counts (``_uvmkernels.count_plan``, which ``step`` calls too): ``status`` 0 means no prediction to follow
        (then only the free margin)."""
        _k.count_plan(self._cnt, self._reg, pooled, refilled, status, mis, wasted, pf.shape[0], evict.shape[0],
                      discard.shape[0], live)
        return self._decision(status, pf, evict, discard, state, cur)

    def _decision(self, status: int, pf: np.ndarray, evict: np.ndarray, discard: np.ndarray, state: ResidencyView,
                  cur: np.ndarray) -> Decision | None:
        """What a one-kernel plan decided (``status`` 0: no prediction to follow, then only the free margin);
        None when it moves nothing."""
        if not status:
            return self._margin(state, cur) if self.margin_blocks else None
        if not (pf.shape[0] or evict.shape[0] or discard.shape[0]):
            return None
        return Decision(prefetch=pf, evict=evict, discard=discard)

    def _victims(self, state: ResidencyView, cur: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``k`` resident blocks in eviction order, with their keys (larger = evict first): one pass of
        ``_uvmkernels.victims`` with bounded heaps, the same blocks in the same order as ``_victims_ref``
        (equal keys go by block id, highest first, in both)."""
        p = self.p if self.p is not None else -1
        vict, vkey, _ = _k.victims(state.resident[:ids_in_use(state)], cur, self.dead, self.nu, self.dirty,
                                   self.last_use, p, k, self._mark, INF, _K_DEAD, _K_DIRTY, _K_CLEAN, _AGE,
                                   self.params.dead_reuse)
        return vict, vkey

    def _victim_dead(self, p: int) -> np.ndarray:
        """The blocks that rank as dead victims (first, whatever their address's future): every dead block, or
        with ``dead_reuse`` only those whose address has no predicted use; the others rank by that use like
        live blocks (the caching allocator hands a freed address to the next tensor within a few launches:
        evicting it there only sends it back through the H2D queue). Chosen, a dead block is discarded either
        way (no write-back). The kernel ``_uvmkernels.victims`` applies the same rule per block."""
        if not self.params.dead_reuse:
            return self.dead
        nu = self.nu
        return self.dead & ((nu >= INF) | (nu <= p))

    def _victims_ref(self, state: ResidencyView, cur: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Reference of ``_victims`` (NumPy): up to ``k`` resident blocks in eviction order, with their keys."""
        if cur.size:
            mask = state.resident.copy()
            mask[cur] = False
            res = np.flatnonzero(mask)
        else:
            res = np.flatnonzero(state.resident)
        if not res.size:
            return EMPTY, EMPTY
        # Equal keys: the highest address leaves first (``res`` descends; the sorts are stable). The caching
        # allocator hands out free space best fit by (size, address), the dryrun runtime the lowest hole that
        # fits, so of equal holes the lowest is taken first; without discards (the live default) a dead block
        # that leaves and is taken again comes back over the link.
        res = res[::-1]
        p = self.p if self.p is not None else -1
        dead = self._victim_dead(p)[res]
        nd = int(dead.sum())
        # Dead blocks go first, ranked apart (one partition over all blocks with thousands of equal dead keys
        # measured ~0.8 ms for 15k blocks on this machine): the address reused last (a new tensor will land
        # there: resident, it comes back without a fault) leaves first.
        head = res[dead]
        if nd:
            dn = self.nu[head]
            dn = np.where((dn >= INF) | (dn <= p), INF, dn)  # INF: no reuse predicted
            head = head[np.argsort(-dn, kind="stable")]
        if nd >= k:
            return head[:k], np.full(k, _K_DEAD, dtype=np.int64)
        res = res[~dead]
        need = k - nd
        nu = self.nu[res]
        unpred = (nu >= INF) | (nu <= p)
        # Ties inside a class (nothing predicted, e.g. the first iteration): least recently used first.
        age = _AGE - self.last_use[res]
        key = np.where(unpred, np.where(self.dirty[res], _K_DIRTY, _K_CLEAN) + age, nu)
        order = np.argsort(-key, kind="stable")[:need]  # equal keys: the highest block first (``res`` descends)
        return (np.concatenate([head, res[order]]),
                np.concatenate([np.full(nd, _K_DEAD, dtype=np.int64), key[order]]))

    def _margin(self, state: ResidencyView, cur: np.ndarray) -> Decision | None:
        short = self.margin_blocks - (state.capacity_blocks - state.used_blocks)
        if short <= 0:
            return None
        vict, vkey = self._victims(state, cur, short)
        c = int(np.count_nonzero(vkey > INF))  # only dead or unpredicted blocks go for the margin (a prefix)
        if not c:
            return None
        vict = vict[:c]
        d = self.dead[vict]
        self.dirty[vict] = False
        return Decision(evict=vict[~d], discard=vict[d])

    # ------------------------------------------------------------------------------------ advice
    def _plan_advice(self) -> None:
        st = self.stats
        out = []
        if self.iters_seen >= 2:
            ro = (self.prev_uses > 0) & (self.uses > 0) & ~self.written & (self.advice == 0)
            b = np.flatnonzero(ro)
            if b.size:
                self.advice[b] = int(Advice.READ_MOSTLY)
                out.append((b, Advice.READ_MOSTLY))
                st["read_mostly_blocks"] += b.size
        undo = np.flatnonzero((self.advice == int(Advice.READ_MOSTLY)) & self.written)
        if undo.size:
            self.advice[undo] = 0
            out.append((undo, Advice.UNSET))
        # Remote access pays only when the link, not compute, bounds the iteration.
        link_s = self.it_link_blocks * self.t_blk
        if self.iters_seen >= 2 and link_s > 1.1 * self.it_compute and self.t_blk > 0:
            gpu = self.ctx.gpu
            remote_s = self.ctx.block_size / (gpu.remote_access_bw or gpu.link_htod_bw)
            k = int((link_s - self.it_compute) / (self.t_blk + remote_s))
            once = np.flatnonzero((self.uses == 1) & (self.prev_uses == 1) & ~self.written &
                                  (self.advice != int(Advice.PREFER_HOST)))
            if k > 0 and once.size:
                b = once[:k]
                self.advice[b] = int(Advice.PREFER_HOST)
                out.append((b, Advice.PREFER_HOST))
                st["prefer_host_blocks"] += b.size
        self.pending_advice.extend(out)
