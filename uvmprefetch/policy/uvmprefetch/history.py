"""The launch history: every launch, in order, with the blocks it touched, and each block's predicted next use.

A launch is *pending* while it runs and is committed to the history when the next one arrives (its blocks are
known only then when it learns from faults). Positions are absolute: position ``base + i`` is entry ``i`` of the
per-position arrays (``h_*``); its blocks are the flat entries ``f_blk[h_ptr[i] - fbase : h_ptr[i + 1] - fbase]``
(sorted), with ``f_w`` (0 read, 1 written, 2 written while dead: a new tensor's first write) and ``f_next`` (the
position of the block's next entry, ``INF`` none yet). The oldest half is forgotten when more than
``history_launches`` positions are kept (``trim``).

The *pointer* ``p`` (``has_p``) is the position matched to the running launch (the correlation part finds it);
``nu[b]`` is the position where block ``b`` is next predicted to be used: moved on along ``f_next`` as the pointer
advances, rebuilt (bounded by ``scan_max`` entries) when it jumps, and set at commit time for a block with no use
ahead: its first position in this iteration's record (``first_pos``, the same offset of the next step).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .parts import Part

INF = np.iinfo(np.int64).max // 4  # "no predicted use": above every position
MAX_STARTS = 64  # iteration starts kept (older ones fall out of the trimmed history anyway)

HISTORY = np.dtype([
    ("n", np.int64), ("fn", np.int64),  # positions kept, flat entries kept
    ("base", np.int64), ("fbase", np.int64),  # absolute position / flat index of the first kept entry
    ("iter_start", np.int64), ("prev_start", np.int64),  # first position of this iteration / of the last one
    ("iters", np.int64), ("n_starts", np.int64),  # iterations seen; later iterations' starts kept in ``starts``
    ("p", np.int64), ("has_p", np.bool_),  # the pointer (-1 when none)
    ("soft", np.int64),  # how the running launch matched: 0 exactly, 1 same kernel other blocks, 2 that twice
    ("cum", np.float64),  # recorded compute time before the history's end
    # the pending launch: its blocks in pbuf[:pk], their write flags in wbuf[:pk] when phas_w
    ("pend", np.bool_), ("pk", np.int64), ("phas_w", np.bool_), ("pkey", np.int64), ("pname", np.int64),
    ("psig", np.int64), ("pstab", np.int64), ("pngram", np.int64), ("pdur", np.float64),
    ("limit", np.int64), ("scan_max", np.int64),  # settings: history_launches, entries a rebuild reads
    ("boundary", np.bool_),  # setting (``first_pos_boundary``): the pending last launch keeps its iteration
], align=True)

FIELDS = ("s", "h_cum", "h_key", "h_name", "h_sig", "h_soft", "h_ptr", "f_blk", "f_w", "f_next", "nu", "last_flat",
          "first_it", "first_pos", "starts", "pbuf", "wbuf")


class History(Part, fields=FIELDS):
    """The history part: see the module docstring. ``n_blocks`` is the number of block ids."""

    def __init__(self, n_blocks: int, limit: int, scan_max: int, boundary: bool = False) -> None:
        self.record_of(HISTORY, limit=limit, scan_max=scan_max, p=-1, boundary=boundary)
        h, f = 1024, 1 << 14  # initial room (positions, flat entries); doubled as needed
        self.h_cum = np.zeros(h, dtype=np.float64)
        self.h_key = np.zeros(h, dtype=np.int64)
        self.h_name = np.zeros(h, dtype=np.int64)
        self.h_sig = np.zeros(h, dtype=np.int64)
        self.h_soft = np.zeros(h, dtype=np.int8)
        self.h_ptr = np.zeros(h, dtype=np.int64)
        self.f_blk = np.zeros(f, dtype=np.int64)
        self.f_w = np.zeros(f, dtype=np.int8)
        self.f_next = np.full(f, INF, dtype=np.int64)
        self.nu = np.full(n_blocks, INF, dtype=np.int64)
        self.last_flat = np.full(n_blocks, -1, dtype=np.int64)  # each block's last flat entry (absolute)
        self.first_it = np.full(n_blocks, -1, dtype=np.int64)  # iteration of first_pos
        self.first_pos = np.zeros(n_blocks, dtype=np.int64)  # a block's first position in this iteration's record
        self.starts = np.zeros(MAX_STARTS, dtype=np.int64)
        self.pbuf = np.zeros(n_blocks, dtype=np.int64)
        self.wbuf = np.zeros(n_blocks, dtype=np.int8)
        self.build()

    def grow(self) -> None:
        """Room for the pending launch's commit (the per-position arrays grow together, so do the flat ones)."""
        r = self.r
        if r["n"] + 1 > self.h_ptr.shape[0]:
            for f in ("h_cum", "h_key", "h_name", "h_sig", "h_soft", "h_ptr"):
                setattr(self, f, _grown(getattr(self, f), int(r["n"]) + 1, 0))
        if r["fn"] + r["pk"] > self.f_blk.shape[0]:
            for f, fill in (("f_blk", 0), ("f_w", 0), ("f_next", INF)):
                setattr(self, f, _grown(getattr(self, f), int(r["fn"] + r["pk"]), fill))
        self.build()

    # ------------------------------------------------------------------------------- reading (Python side)
    @property
    def end(self) -> int:
        """Absolute position one past the last committed launch."""
        return int(self.r["base"] + self.r["n"])

    @property
    def p(self) -> int | None:
        return int(self.r["p"]) if self.r["has_p"] else None

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """Flat index range (relative to ``fbase``) of positions ``lo..hi-1``."""
        return flat_span(self.ref, lo, hi)

    def blocks_at(self, pos: int) -> np.ndarray:
        a, b = self.span(pos, pos + 1)
        return self.f_blk[a:b]

    def view(self, name: str) -> np.ndarray:
        """The filled part of a per-position (``h_*``) or flat (``f_*``) array."""
        n = self.r["n"] if name.startswith("h_") else self.r["fn"]
        return getattr(self, name)[:n]

    def until(self, p: int, pos):
        """Predicted compute time from the start of launch ``p + 1`` to the start of ``pos`` (>= p + 1)."""
        hc, base = self.h_cum, int(self.r["base"])
        return hc[np.asarray(pos) - base] - hc[p + 1 - base]

    def record_end(self, q: int) -> int:
        """One past the last position of the recorded iteration that holds position ``q`` (before this one)."""
        return int(record_end(self.ref, q))

    def append(self, key: int, name: int, sig: int, blocks: np.ndarray, wmask: np.ndarray | None = None,
               dur: float = 0.0) -> int:
        """Commit a launch directly (the pending one must be committed first); returns its position. For tests
        and tools that build a history without running launches; the correlation tables do not learn it."""
        blocks = np.asarray(blocks, dtype=np.int64)
        k = blocks.shape[0]
        r = self.r
        r["pend"], r["pk"], r["pkey"], r["pname"], r["psig"], r["pdur"] = True, k, key, name, sig, dur
        self.pbuf[:k] = blocks
        r["phas_w"] = wmask is not None and len(wmask) == k
        if r["phas_w"]:
            self.wbuf[:k] = wmask
        self.grow()
        return int(commit_pending(self.ref))



def _grown(a: np.ndarray, n: int, fill) -> np.ndarray:
    # (a zero fill comes from np.zeros, whose large buffers the OS zeroes page by page as they are first written:
    # the growth then writes only the kept entries; np.full would write the whole doubled buffer, a stall of
    # tens of milliseconds on GPT-2 large)
    m = max(n, 2 * a.shape[0])
    out = np.zeros(m, dtype=a.dtype) if fill == 0 else np.full(m, fill, dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


# ------------------------------------------------------------------------------------------- compiled
@nb.njit(cache=True, nogil=True)
def flat_span(h, lo, hi):
    """Flat index range ``(a, b)`` of the entries of positions ``lo..hi-1`` (``hi`` at most the end)."""
    s = h.s[0]
    base = s.base
    a = h.h_ptr[lo - base] - s.fbase
    b = (h.h_ptr[hi - base] - s.fbase) if hi < base + s.n else s.fn
    return a, b


@nb.njit(cache=True, nogil=True)
def record_end(h, q):
    """One past the last position of the recorded iteration that holds ``q`` (``starts``: the later iterations'
    first positions, ascending; ``iter_start`` past them)."""
    s = h.s[0]
    for i in range(s.n_starts):
        if h.starts[i] > q:
            return h.starts[i]
    return s.iter_start


@nb.njit(cache=True, nogil=True)
def record_start(h, q):
    """The first position of the recorded iteration that holds ``q`` (before this one; 0: the first recorded)."""
    s = h.s[0]
    lo = np.int64(0)
    for i in range(s.n_starts):
        if h.starts[i] > q:
            break
        lo = h.starts[i]
    return lo


@nb.njit(cache=True, nogil=True)
def has_room(h):
    """Whether the buffers can take the pending launch's commit."""
    s = h.s[0]
    return not s.pend or (s.n + 1 <= h.h_ptr.shape[0] and s.fn + s.pk <= h.f_blk.shape[0])


@nb.njit(cache=True, nogil=True)
def commit_pending(h):
    """Commit the pending launch at the history's end; returns its position ``r``. Its entry and blocks (``f_next``
    of new entries holds ``INF``, ``f_w`` 0: the buffers' fill, and the caller checked the room), the blocks'
    first position in this iteration, then each block's previous entry linked to ``r``, the new entries made the
    blocks' last, and a block with no predicted use ahead of the pointer predicted at its first position in this
    iteration's record if that is ahead, else at ``r``."""
    s = h.s[0]
    hn = s.n
    fn = s.fn
    k = s.pk
    fbase = s.fbase
    r = s.base + hn
    f0 = fbase + fn
    h.h_cum[hn] = s.cum
    h.h_key[hn] = s.pkey
    h.h_name[hn] = s.pname
    h.h_sig[hn] = s.psig
    h.h_soft[hn] = s.soft
    h.h_ptr[hn] = f0
    s.cum += s.pdur
    s.n = hn + 1
    s.fn = fn + k
    s.pend = False
    blocks = h.pbuf[:k]
    p = s.p if s.has_p else -1
    for i in range(k):
        h.f_blk[fn + i] = blocks[i]
    if s.phas_w:
        for i in range(k):
            h.f_w[fn + i] = h.wbuf[i]
    first_pos = h.first_pos
    # the launch committed first in an iteration may be the last one of the iteration before (pending across
    # ``on_iteration``): with ``boundary`` its blocks' first use in the new iteration is still to come (without,
    # their ``first_pos`` is the position before ``iter_start``, behind the pointer once the next step follows
    # this one's record)
    it = s.iters - 1 if s.boundary and r < s.iter_start else s.iters
    for i in range(k):
        x = blocks[i]
        if h.first_it[x] != it:
            h.first_it[x] = it
            first_pos[x] = r
    last_flat = h.last_flat
    for i in range(k):
        pv = last_flat[blocks[i]]
        if pv >= fbase:
            h.f_next[pv - fbase] = r
    for i in range(k):
        last_flat[blocks[i]] = f0 + i
    nu = h.nu
    for i in range(k):
        x = blocks[i]
        v = nu[x]
        if v >= INF or v <= p:
            nu[x] = first_pos[x] if first_pos[x] > p else r
    return r


@nb.njit(cache=True, nogil=True)
def _drop_front(a, n, k, fill):
    a[:n - k] = a[k:n].copy()
    a[n - k:n] = fill


@nb.njit(cache=True, nogil=True)
def trim(h, k):
    """Forget the oldest ``k`` positions and their flat entries; a pointer into them is dropped."""
    s = h.s[0]
    n = s.n
    fn = s.fn
    cut = h.h_ptr[k]
    fk = cut - s.fbase
    _drop_front(h.h_cum, n, k, 0.0)
    _drop_front(h.h_key, n, k, 0)
    _drop_front(h.h_name, n, k, 0)
    _drop_front(h.h_sig, n, k, 0)
    _drop_front(h.h_soft, n, k, 0)
    _drop_front(h.h_ptr, n, k, 0)
    _drop_front(h.f_blk, fn, fk, 0)
    _drop_front(h.f_w, fn, fk, 0)
    _drop_front(h.f_next, fn, fk, INF)
    s.n = n - k
    s.fn = fn - fk
    s.base += k
    s.fbase = cut
    if s.has_p and s.p < s.base:
        s.has_p = False
        s.p = -1


@nb.njit(cache=True, nogil=True)
def next_birth(h, x, t, lim):
    """The first position from ``t`` on (along block ``x``'s entries) where the record writes a new tensor into
    ``x`` (``f_w`` 2: written while dead); ``lim`` if none before it. In-place writes (1) keep the tensor. A
    position's blocks are sorted."""
    s = h.s[0]
    end = s.base + s.n
    while t < lim and t < end:
        a, b = flat_span(h, t, t + 1)
        lo = a + np.searchsorted(h.f_blk[a:b], x)
        if lo >= b or h.f_blk[lo] != x:
            return t  # (not recorded there: the links are stale, stop)
        if h.f_w[lo] == 2:
            return t
        t = h.f_next[lo]
    return lim


@nb.njit(cache=True, nogil=True)
def _dead_next(h, dead, x, z, f_w, nx, lim):
    """The next use of block ``z``, translated from recorded block ``x`` whose entry here (write flag ``f_w``) next
    links to ``nx``: ``nx``, but for a dead ``z`` read here (``dead_births``) the record's next birth at ``x`` from
    ``nx`` on (``lim`` if none before it). Dead memory is read only after a new tensor is written into it: a read
    here means the record's tensor lives elsewhere now, and so do its later reads."""
    if f_w == 0 and dead[z] and nx < lim:
        return next_birth(h, x, nx, lim)
    return nx


@nb.njit(cache=True, nogil=True)
def advance(h, mv, q, lim, dead):
    """The pointer moves on to ``q``: the blocks recorded there (before ``lim``: through the learned moves ``mv``)
    are next used where their entries link to. A moved block whose recorded address is next used only from
    ``lim`` on (the followed iteration's end: another tensor at that address) is next used where this iteration
    first used it (``first_pos``): the same offset of the next iteration. When the recorded address's next entry
    holds a later tensor (from ``rend``, its birth), the address itself is next used there, dead or not (the
    caching allocator hands a freed address to the next tensor; the plan's window pass lists it as a candidate
    too only while it is not dead), unless ``dead_misses`` births predicted there in a row went elsewhere while it
    was dead (``mv.missed``: the allocator does not hand it out as the record did). With ``dead_births``, a moved
    block that is dead (``dead``) where the record reads its recorded block is next used at the record's next birth
    there instead of at the read's next entry (``_dead_next``). Both are ``mv``'s settings."""
    s = h.s[0]
    s.p = q
    s.has_p = True
    a, b = flat_span(h, q, q + 1)
    nu = h.nu
    remap = mv.remap
    db = mv.s[0].dead_births
    it = s.iters
    for i in range(a, b):
        x = h.f_blk[i]
        nx = h.f_next[i]
        if lim > 0 and q < lim:
            y = remap[x]
            if y != x:
                if nx >= mv.rend[x] and not (dead[x] and 0 < mv.s[0].dead_misses <= mv.missed[x]):
                    nu[x] = nx  # the next tensor at the recorded address may stay there
                if db:
                    nx = _dead_next(h, dead, x, y, h.f_w[i], nx, lim)
                if nx >= lim and h.first_it[y] == it:
                    nx = h.first_pos[y]
            x = y
        nu[x] = nx


@nb.njit(cache=True, nogil=True)
def rebuild(h, q):
    """The pointer jumps to ``q``: every block's predicted next use is the position of its first entry after
    ``q``; only the first ``scan_max`` entries are read (further ones count as unknown: ``INF``)."""
    s = h.s[0]
    s.p = q
    s.has_p = True
    nu = h.nu
    nu[:] = INF
    base = s.base
    nh = s.n
    a = s.fn
    if q + 1 < base + nh:
        a = h.h_ptr[q + 1 - base] - s.fbase
    m = min(s.fn - a, s.scan_max)
    if m <= 0:
        return
    pos = np.empty(m, dtype=np.int64)
    t = q + 1
    for i in range(m):
        while t + 1 - base < nh and h.h_ptr[t + 1 - base] - s.fbase <= a + i:
            t += 1
        pos[i] = t
    for i in range(m - 1, -1, -1):  # the first entry of a block is written last
        nu[h.f_blk[a + i]] = pos[i]


@nb.njit(cache=True, nogil=True)
def set_pending(h, launch, cur, has_w):
    """The running launch becomes the pending one: ``launch`` is ``(key, name, sig, stab, ngram, duration)``,
    ``cur`` its blocks; with ``has_w`` their write flags are already in ``wbuf``."""
    s = h.s[0]
    key, name, sig, stab, ngram, dur = launch
    k = cur.shape[0]
    h.pbuf[:k] = cur
    s.pend = True
    s.pk = k
    s.phas_w = has_w
    s.pkey = key
    s.pname = name
    s.psig = sig
    s.pstab = stab
    s.pngram = ngram
    s.pdur = dur
