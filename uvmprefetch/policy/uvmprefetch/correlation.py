"""The correlation tables: where in the history the running launch is (DeepUM's execution-id correlation,
generalised to a pointer into recorded history).

Four set-associative position tables (``policy/tables.py``'s compiled table: 8 ways a set, least recently used
out first, 64-bit hashed keys) map a key to the last position that had it, most specific first:

- ``sig_pos``: the exact signature (kernel name + blocks, ``launch_sig``; learned from faults: the exec id);
- ``stab_pos``: the *stable signature* (exec id + the blocks of older data the launch reads, ``stable_sig``) with
  how many times it occurred before in this iteration: while the caching allocator still moves a step's
  activations (the first iterations), exact signatures miss but a layer's weights say which layer this is;
- ``exec_pos``: the exec-id n-gram (``ngram`` predecessors + the launch) with its occurrence in the iteration (the
  k-th time a context occurs matches the k-th time in the last iteration that had it, not the previous layer);
- ``name_pos``: the kernel-name n-gram.

``ngram_count`` / ``stab_count`` count the occurrences in this iteration (stamped with the iteration, not a clock).
``find`` applies them to the pointer's next position; the step moves the pointer where it says.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..tables import assoc_count, assoc_get, assoc_put, assoc_table, mix64
from .history import record_start
from .parts import Part

CORRELATION = np.dtype([
    ("clock", np.int64),  # the position tables' LRU clock
    ("n_recent", np.int64),  # launches ``recent`` holds (at most ngram + 1)
    ("ngram", np.int64),  # the running launch's counted exec-id n-gram key (0: none)
    ("n", np.int64),  # setting: predecessors in an n-gram
    ("stable_sync", np.bool_),  # setting: count and use stable signatures
    ("follow_cold", np.bool_),  # setting: following the cold iteration's record, go on by name before a jump
    ("visit_len", np.float64),  # setting: ... once the visits below last this many launches on average
    ("follow_later", np.bool_),  # setting: following a later record, go on by name before a jump back
    # the pointer's visits to this step's earlier launches while it follows the cold record: how many ended, their
    # launches in all, when the running one began (-1: none); whether ``follow_cold`` acts now
    ("visits", np.int64), ("visited", np.int64), ("visit_at", np.int64), ("cold_on", np.bool_),
], align=True)

FIELDS = ("s", "sig_pos", "stab_pos", "exec_pos", "name_pos", "ngram_count", "stab_count", "recent")
TABLES = ("sig_pos", "stab_pos", "exec_pos", "name_pos")  # (the position tables, as ``report`` names them)

# How ``find`` placed the pointer: on the next position (exact), through a stable signature, on the next position
# by kernel name only (soft), nowhere, through another table (a jump)
M_MATCHED, M_STABLE, M_SOFT, M_NONE, M_RESYNC = range(5)
_SEED = np.int64(0x5EED)


class Correlation(Part, fields=FIELDS):
    """The correlation part: see the module docstring."""

    def __init__(self, entries: int, n: int, stable_sync: bool, follow_cold: bool = True,
                 visit_len: float = 0.0, follow_later: bool = False) -> None:
        self.record_of(CORRELATION, n=n, stable_sync=stable_sync, follow_cold=follow_cold, visit_len=visit_len,
                       visit_at=-1, cold_on=follow_cold and visit_len <= 0, follow_later=follow_later)
        for f in ("sig_pos", "stab_pos", "exec_pos", "name_pos", "ngram_count", "stab_count"):
            setattr(self, f, assoc_table(entries))
        self.recent = np.zeros((2, n + 1), dtype=np.int64)  # the last exec ids / names committed
        self.build()

    def used(self) -> dict:
        return {t: int(np.count_nonzero(getattr(self, t)[:, 2])) for t in TABLES}



# ------------------------------------------------------------------------------------------- compiled
@nb.njit(cache=True, nogil=True, inline="always")
def _seq_key(row, a, b, last):
    """The key of the sequence ``row[a:b]`` followed by ``last``."""
    h = _SEED
    for i in range(a, b):
        h = mix64(h, row[i])
    return mix64(h, last)


@nb.njit(cache=True, nogil=True)
def launch_sig(name, blocks):
    """The exact signature of a launch with known accesses: a hash of its kernel name and its blocks (sorted),
    never 0 (the tables' "none"); deterministic, unlike Python's salted ``hash`` of bytes."""
    h = mix64(_SEED, name)
    for i in range(blocks.shape[0]):
        h = mix64(h, blocks[i])
    return mix64(h, blocks.shape[0])


@nb.njit(cache=True, nogil=True)
def stable_sig(blocks, writes, w_iter, it, key):
    """The *stable signature* of a launch: a hash of its exec id and the blocks it reads that hold data from
    before this iteration (not written by it, not written earlier in this iteration: weights, optimizer state,
    inputs), 0 when it reads none. Unlike the exact signature it does not see where the caching allocator placed
    this step's activations. ``blocks`` sorted, ``writes`` a sorted subset."""
    h = np.uint64(key & 0x7FFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
    n = 0
    j = 0
    nw = writes.shape[0]
    for i in range(blocks.shape[0]):
        x = blocks[i]
        while j < nw and writes[j] < x:
            j += 1
        if (j < nw and writes[j] == x) or w_iter[x] == it:
            continue
        h = (h ^ np.uint64(x)) * np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
        n += 1
    if n == 0:
        return 0
    return np.int64(h >> np.uint64(2)) + 1


@nb.njit(cache=True, nogil=True)
def name_key(c, name):
    """The name n-gram of a launch named ``name``: the last ``n`` committed names and it."""
    s = c.s[0]
    return _seq_key(c.recent[1], s.n_recent - s.n, s.n_recent, name)


@nb.njit(cache=True, nogil=True)
def count(c, key, stable, sig_args):
    """The running launch (exec id ``key``) counted in this iteration (generation ``it + 1``): its exec-id n-gram
    key (0 while fewer than ``n`` launches were committed) and, with ``stable``, its stable key (0: it reads no
    older data). ``sig_args`` is ``(blocks, writes, w_iter, it)``. Returns ``(stab, ngram)``."""
    s = c.s[0]
    blocks, writes, w_iter, it = sig_args
    ngram = np.int64(0)
    if s.n_recent >= s.n:
        g = _seq_key(c.recent[0], s.n_recent - s.n, s.n_recent, key)
        ngram = mix64(g, assoc_count(c.ngram_count, g, it + 1))
    stab = np.int64(0)
    if stable:
        h = stable_sig(blocks, writes, w_iter, it, key)
        if h != 0:
            stab = mix64(h, assoc_count(c.stab_count, h, it + 1))
    s.ngram = ngram
    return stab, ngram


@nb.njit(cache=True, nogil=True)
def commit(c, key, name, sig, r, keys):
    """The tables learn the launch committed at position ``r``: its signature, its stable and exec n-gram keys
    (``keys``: ``(stab, ngram)``, 0: none) and, once ``n`` launches precede it, its name n-gram all map to ``r``;
    its exec id and name join ``recent``."""
    s = c.s[0]
    stab, ngram = keys
    n = s.n
    s.clock = assoc_put(c.sig_pos, sig, r, s.clock)
    if stab != 0:
        s.clock = assoc_put(c.stab_pos, stab, r, s.clock)
    m = s.n_recent
    recent = c.recent
    if m == n + 1:
        for i in range(n):
            recent[0, i] = recent[0, i + 1]
            recent[1, i] = recent[1, i + 1]
        m = n
    recent[0, m] = key
    recent[1, m] = name
    m += 1
    s.n_recent = m
    if m == n + 1:
        if ngram != 0:
            s.clock = assoc_put(c.exec_pos, ngram, r, s.clock)
        s.clock = assoc_put(c.name_pos, _seq_key(recent[1], 0, n, name), r, s.clock)


@nb.njit(cache=True, nogil=True)
def _get(c, table, key):
    s = c.s[0]
    v, s.clock = assoc_get(table, key, s.clock)
    return v


@nb.njit(cache=True, nogil=True)
def find(c, h, launch, moved=False):
    """Where the running launch is in the history ``h``. ``launch`` is ``(key, name, sig, stab)``. Returns ``(how,
    q, soft)``: one of ``M_*``, the position (-1 with ``M_NONE``) and how the launch matched (``soft``).

    Most specific first: the next recorded launch with the same exact signature, the last position with it, then
    the stable signature, but only into the records of this iteration and the last (further back is another
    pattern, e.g. alternating sequence lengths, whose exact signatures and n-grams find it when it returns; a
    jump there re-plans the end of the step for a pattern that may not come next: the second occurrence of a
    pattern ran 14 % above its steady time instead of 3 %); then the next launch by name (same kernel, other
    data: keep going); then the n-gram tables.

    An exact signature seen earlier in this iteration (a buffer every layer touches alike) is not a place to jump
    to while the pointer follows a later record than the cold iteration's and it goes on with this kernel: a
    repeat inside the step (jumping there and back rebuilt every block's next use once a layer; GPT-2-large at 2x,
    iterations 2-3 went from 1.12-1.18x the oracle to 1.02-1.04x). While it follows the cold iteration's record
    (``follow_cold``), no exact signature elsewhere is: an encoder-decoder's launches that read the encoder's
    output, or a buffer every layer touches, sent the pointer to the previous layer of this step or another place
    in the record and back every few launches, each jump rebuilding every next use without the learned moves (T5
    base at 3x: iteration 1 took 0.99 s, 1.52x the oracle, with 27 GB H2D against its 16 GB; 0.84 s without the
    jumps, ``bench/refetch.py``). Off, the previous layer of this iteration, shifted by the layer stride, may
    predict the cold record's activations better (BERT large at 1.5x, iteration 1: 0.637 s against 0.665 s). So
    ``follow_cold`` acts only once the pointer's visits there (``visit``) have lasted ``visit_len`` launches on
    average, over two at least: T5 base's visit 4.5 launches each, BERT, GPT-2 and ViT large's 1.2-1.6. While it
    follows a later record (``follow_later``), an exact signature at an earlier position of that record is not one
    either: T5 base at 3x, following iteration 2's record, jumped 28 times to another layer 90-100 launches back;
    one in an older record (another pattern: alternating sequence lengths ran 14 % slower without it) still is."""
    s = h.s[0]
    key, name, sig, stab = launch
    base = s.base
    end = base + s.n
    nxt = s.p + 1 if s.has_p else np.int64(-1)
    if 0 <= nxt < end and h.h_sig[nxt - base] == sig:
        return M_MATCHED, nxt, 0
    q = _get(c, c.sig_pos, sig)
    if 0 <= nxt < s.iter_start and q != nxt and h.h_name[nxt - base] == name:
        if s.n_starts > 0 and h.starts[0] <= nxt:  # (a later record than the cold one)
            if q >= s.iter_start or (c.s[0].follow_later and q < nxt and (moved or record_start(h, nxt) <= q)):
                q = -1
        elif c.s[0].cold_on:
            q = -1
    if not base <= q < end and stab != 0:
        q2 = _get(c, c.stab_pos, stab)
        # (a position before ``base`` was forgotten: the history was trimmed past the last iteration's start)
        if max(s.prev_start, base) <= q2 < end and h.h_key[q2 - base] == key and q2 != nxt:
            return M_STABLE, q2, 1
    if not base <= q < end:
        if 0 <= nxt < end and h.h_name[nxt - base] == name:
            return M_SOFT, nxt, 2 if h.h_soft[nxt - base] else 1
        q = -1
        if c.s[0].n_recent >= c.s[0].n:
            ngram = c.s[0].ngram
            if ngram != 0:
                q = _get(c, c.exec_pos, ngram)
            if not base <= q < end:
                q = _get(c, c.name_pos, name_key(c, name))
        if not base <= q < end:
            return M_NONE, np.int64(-1), 0
    if q == nxt:
        return M_MATCHED, q, 0
    return M_RESYNC, q, 0


@nb.njit(cache=True, nogil=True)
def visit(c, h, p, q, launches):
    """The pointer jumps from ``p`` to ``q`` at launch count ``launches``: a jump from the cold record into this
    step's earlier launches begins a visit, one back into a record ends it; ``follow_cold`` acts from the end of the
    second visit on while the visits so far lasted ``visit_len`` launches on average."""
    cs = c.s[0]
    s = h.s[0]
    if not cs.follow_cold or cs.cold_on:
        return
    if p < s.iter_start <= q and (s.n_starts == 0 or p < h.starts[0]):
        cs.visit_at = launches
    elif q < s.iter_start <= p and cs.visit_at >= 0:
        cs.visits += 1
        cs.visited += launches - cs.visit_at
        cs.visit_at = -1
        cs.cold_on = cs.visits >= 2 and cs.visited >= cs.visit_len * cs.visits
