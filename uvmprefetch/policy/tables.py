"""Shared, bounded tables every learned policy builds on (after ChampSim's ``msl/lru_table.h``).

- ``LruMap``: a dict with a size bound that forgets the least recently used key.
- ``SetAssocTable``: a hardware-style set-associative table (``rows`` sets of ``ways`` entries, LRU inside
  a set): what DeepUM's per-kernel block correlation tables are. Storage is allocated per touched set, so
  thousands of mostly-empty tables stay cheap, but the bound is always ``rows * ways`` entries.
- ``assoc_table`` / ``assoc_get`` / ``assoc_put`` / ``assoc_count``: the same set-associative LRU table for
  compiled code, in one int64 array of ``(key, value, stamp)`` entries with 64-bit hashed keys (the correlation
  tables of ``uvmprefetch``); ``mix64`` is its hash.
- ``SaturatingCounter``: an integer clamped to ``[lo, hi]`` (hysteresis for the window monitor).
- ``GrowArray``: an append-only NumPy array with amortised O(1) appends (the launch history).

All of them report their size (``len``) and an estimate of their memory (``nbytes``) so that a policy can
put its state size in ``report()``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator

import numba as nb
import numpy as np

from ..errors import ConfigError

# Rough CPython sizes for the memory estimate (a dict slot + boxed key + small object).
_PY_ENTRY_BYTES = 100


def _positive(owner: str, name: str, v: int) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
        raise ConfigError(f"{owner}: {name} must be a positive integer, got {v!r}")
    return int(v)


class LruMap:
    """A mapping of at most ``capacity`` entries; inserting beyond it evicts the least recently used key.

    ``get`` and ``put`` both count as a use.

    Raises
    ------
    ConfigError
        If ``capacity`` is not a positive integer.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = _positive("LruMap", "capacity", capacity)
        self._d: OrderedDict = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d

    def get(self, key: Hashable, default: Any = None) -> Any:
        d = self._d
        if key in d:
            d.move_to_end(key)
            return d[key]
        return default

    def put(self, key: Hashable, value: Any) -> None:
        d = self._d
        if key in d:
            d.move_to_end(key)
        d[key] = value
        if len(d) > self.capacity:
            d.popitem(last=False)
            self.evictions += 1

    def pop(self, key: Hashable, default: Any = None) -> Any:
        return self._d.pop(key, default)

    def items(self) -> Iterator:
        return iter(self._d.items())

    def clear(self) -> None:
        self._d.clear()

    @property
    def nbytes(self) -> int:
        return len(self._d) * _PY_ENTRY_BYTES


class SetAssocTable:
    """``rows`` sets x ``ways`` entries, keyed by a non-negative integer tag; set = ``key % rows``.

    ``get`` refreshes the entry's LRU position; ``put`` replaces the least recently used way of a full set.
    Values are arbitrary Python objects (DeepUM keeps a short successor list per entry).

    Raises
    ------
    ConfigError
        If ``rows`` or ``ways`` is not a positive integer.
    """

    def __init__(self, rows: int, ways: int) -> None:
        self.rows = _positive("SetAssocTable", "rows", rows)
        self.ways = _positive("SetAssocTable", "ways", ways)
        self._sets: dict[int, list] = {}  # set index -> [[key, value], ...] in LRU order (MRU last)
        self._n = 0
        self.evictions = 0

    def __len__(self) -> int:
        return self._n

    def get(self, key: int, default: Any = None) -> Any:
        s = self._sets.get(key % self.rows)
        if s is not None:
            for k in range(len(s) - 1, -1, -1):
                if s[k][0] == key:
                    if k != len(s) - 1:
                        s.append(s.pop(k))
                    return s[-1][1]
        return default

    def __contains__(self, key: int) -> bool:
        s = self._sets.get(key % self.rows)
        return s is not None and any(e[0] == key for e in s)

    def put(self, key: int, value: Any) -> None:
        idx = key % self.rows
        s = self._sets.get(idx)
        if s is None:
            self._sets[idx] = [[key, value]]
            self._n += 1
            return
        for k, e in enumerate(s):
            if e[0] == key:
                s.pop(k)
                e[1] = value
                s.append(e)
                return
        if len(s) >= self.ways:
            s.pop(0)
            self.evictions += 1
            self._n -= 1
        s.append([key, value])
        self._n += 1

    def keys(self) -> list[int]:
        return [e[0] for s in self._sets.values() for e in s]

    @property
    def nbytes(self) -> int:
        return self._n * _PY_ENTRY_BYTES


class SaturatingCounter:
    """An integer clamped to ``[lo, hi]``.

    Raises
    ------
    ConfigError
        If ``lo > hi`` or ``init`` is outside ``[lo, hi]``.
    """

    __slots__ = ("lo", "hi", "value")

    def __init__(self, lo: int, hi: int, init: int | None = None) -> None:
        if lo > hi:
            raise ConfigError(f"SaturatingCounter: lo {lo} > hi {hi}")
        init = lo if init is None else init
        if not lo <= init <= hi:
            raise ConfigError(f"SaturatingCounter: init {init} outside [{lo}, {hi}]")
        self.lo, self.hi, self.value = int(lo), int(hi), int(init)

    def add(self, n: int = 1) -> int:
        self.value = min(self.hi, max(self.lo, self.value + int(n)))
        return self.value

    @property
    def saturated(self) -> bool:
        return self.value >= self.hi

    def reset(self, value: int | None = None) -> None:
        self.value = self.lo if value is None else min(self.hi, max(self.lo, int(value)))


class GrowArray:
    """An append-only 1-D NumPy array: ``extend`` is amortised O(n); ``view()`` is the filled part."""

    def __init__(self, dtype, fill=0, initial: int = 1024) -> None:
        self._a = np.full(max(16, initial), fill, dtype=dtype)
        self._fill = fill
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def reserve(self, n: int) -> np.ndarray:
        """Room for ``n`` entries; returns the whole buffer (entries ``len(self)..`` hold the fill value), for
        kernels that write several arrays' new entries in one call; the caller then sets ``n`` (at most the
        buffer's size)."""
        self._reserve(n)
        return self._a

    def _reserve(self, n: int) -> None:
        if n > self._a.shape[0]:
            # (a zero fill comes from np.zeros, whose large buffers the OS zeroes page by page as they are first
            # written: the growth then writes only the kept entries; np.full wrote the whole doubled buffer, the
            # policy's largest one-launch stall: 26-60 ms on GPT-2 large at 2x, measured by bench/decision_budget.py)
            m = max(n, 2 * self._a.shape[0])
            if self._fill == 0:
                a = np.zeros(m, dtype=self._a.dtype)
            else:
                a = np.empty(m, dtype=self._a.dtype)
                a[self.n:] = self._fill
            a[: self.n] = self._a[: self.n]
            self._a = a

    def append(self, v) -> None:
        n = self.n
        if n >= self._a.shape[0]:
            self._reserve(n + 1)
        self._a[n] = v
        self.n = n + 1

    def extend(self, values: np.ndarray) -> None:
        k = values.shape[0]
        self._reserve(self.n + k)
        self._a[self.n:self.n + k] = values
        self.n += k

    def extend_fill(self, k: int) -> None:
        """``extend`` by ``k`` entries of the fill value (the unfilled part always holds it: no copy)."""
        self._reserve(self.n + k)
        self.n += k

    def view(self) -> np.ndarray:
        """The filled part (a view: writes go to the array)."""
        return self._a[: self.n]

    def drop_front(self, k: int) -> None:
        """Forget the first ``k`` entries (bounded history)."""
        k = min(k, self.n)
        self._a[: self.n - k] = self._a[k: self.n].copy()
        self._a[self.n - k: self.n] = self._fill
        self.n -= k

    @property
    def nbytes(self) -> int:
        return int(self._a.nbytes)


def group_by(keys: np.ndarray, vals: np.ndarray, n: int, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``vals`` grouped by integer ``keys`` in ``0..n-1`` as CSR: group ``k`` is ``out[ptr[k]:ptr[k+1]]``.
    Inside a group, values come in ``order``'s ascending order (ties, and ``order=None``: input order). The
    planners' per-launch action lists (evict / prefetch at launch ``k``) are built with it."""
    idx = np.lexsort((order, keys)) if order is not None else np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, vals[idx]



# ------------------------------------------------------------------ a set-associative table for compiled code
ASSOC_WAYS = 8  # ways a set
_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_GOLD, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def assoc_table(entries: int) -> np.ndarray:
    """An empty compiled table of at least ``entries`` entries (whole sets of ``ASSOC_WAYS``): an int64 array of
    ``(key, value, stamp)`` rows, stamp 0 meaning empty. Keys are any int64 (hashes), values non-negative."""
    rows = max(1, int(entries) // ASSOC_WAYS)
    return np.zeros((rows * ASSOC_WAYS, 3), dtype=np.int64)


@nb.njit(cache=True, nogil=True, inline="always")
def mix64(h, v):
    """A 64-bit hash of ``h`` combined with ``v`` (splitmix64's finaliser), never 0 (the tables' "none")."""
    x = np.uint64(h) ^ (np.uint64(v) + _GOLD)
    x = (x ^ (x >> _U30)) * _M1
    x = (x ^ (x >> _U27)) * _M2
    k = np.int64(x ^ (x >> _U31))
    return k if k != 0 else np.int64(1)


@nb.njit(cache=True, nogil=True, inline="always")
def assoc_set(table, key):
    """Index of the first entry of ``key``'s set."""
    return np.int64(np.uint64(mix64(key, 0)) % np.uint64(table.shape[0] // ASSOC_WAYS)) * ASSOC_WAYS


@nb.njit(cache=True, nogil=True)
def assoc_get(table, key, clock):
    """``(value, clock)``: the value of ``key`` (-1 if absent) and the LRU clock after the lookup. A hit is a use:
    the entry is stamped with the clock, advanced."""
    s = assoc_set(table, key)
    for i in range(s, s + ASSOC_WAYS):
        if table[i, 2] != 0 and table[i, 0] == key:
            clock += 1
            table[i, 2] = clock
            return table[i, 1], clock
    return np.int64(-1), clock


@nb.njit(cache=True, nogil=True)
def assoc_put(table, key, value, clock):
    """``key`` -> ``value`` (a use); a new key takes an empty way of its set, else the least recently used one.
    Returns the clock, advanced."""
    s = assoc_set(table, key)
    j = s
    for i in range(s, s + ASSOC_WAYS):
        st = table[i, 2]
        if st != 0 and table[i, 0] == key:
            j = i
            break
        if st < table[j, 2]:
            j = i
    clock += 1
    table[j, 0] = key
    table[j, 1] = value
    table[j, 2] = clock
    return clock


@nb.njit(cache=True, nogil=True)
def assoc_count(table, key, gen):
    """How many times ``key`` was counted before in generation ``gen`` (> 0; entries of older generations are
    free), this time counted: the table as a bounded counter per key, stamped with the generation instead of
    the clock. A set full of this generation's keys starts its first way over."""
    s = assoc_set(table, key)
    j = -1
    for i in range(s, s + ASSOC_WAYS):
        if table[i, 2] == gen:
            if table[i, 0] == key:
                c = table[i, 1]
                table[i, 1] = c + 1
                return c
        elif j < 0:
            j = i
    if j < 0:
        j = s
    table[j, 0] = key
    table[j, 1] = 1
    table[j, 2] = gen
    return np.int64(0)
