"""The trace: what one recorded run allocates, launches and touches. Format spec: ``docs/trace-format.md``.

In memory a trace is a structure of NumPy arrays (``Trace``); on disk it is a small header followed by
zlib-compressed array blobs, each with its CRC-32, so a file loads without a Python loop per event and a
damaged file is caught with a message that names what is wrong.

Time inside a trace is the *launch index*: an allocation made after launch ``i-1`` was issued and before
launch ``i`` has ``alloc_at == i``; a free at the same point has ``free_at == i``. ``free_at == -1`` means
alive at the end of the trace.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TraceError

MAGIC = b"UVMTRACE"
VERSION = 1
_HEADER = struct.Struct("<8sII")  # magic, version, header-json length

# Access modes (bit flags).
READ, WRITE = 1, 2
# Launch phases.
PHASES = ("other", "forward", "backward", "optimizer", "eval")
PHASE = {name: i for i, name in enumerate(PHASES)}
# Allocation kinds (what a tensor's storage is for; from the recorder's knowledge of the model).
KINDS = ("other", "param", "grad", "optimizer", "activation", "input")
KIND = {name: i for i, name in enumerate(KINDS)}

# name -> dtype of every array, in file order. The spec in docs/trace-format.md mirrors this table.
ARRAYS: dict[str, np.dtype] = {
    "alloc_size": np.dtype("<i8"),
    "alloc_at": np.dtype("<i8"),
    "free_at": np.dtype("<i8"),
    "free_rank": np.dtype("<i8"),
    "alloc_kind": np.dtype("u1"),
    "launch_name": np.dtype("<i4"),
    "launch_exec_id": np.dtype("<u8"),
    "launch_phase": np.dtype("u1"),
    "launch_iter": np.dtype("<i4"),
    "launch_flops": np.dtype("<f8"),
    "launch_bytes": np.dtype("<i8"),
    "launch_dur": np.dtype("<f8"),
    "acc_ptr": np.dtype("<i8"),
    "acc_alloc": np.dtype("<i4"),
    "acc_off": np.dtype("<i8"),
    "acc_len": np.dtype("<i8"),
    "acc_mode": np.dtype("u1"),
}


@dataclass
class Trace:
    """A recorded run. All arrays are NumPy; see the module docstring for the time convention.

    Allocation ``a`` (index = allocation id, ids in allocation order): ``alloc_size[a]`` bytes, alive for
    launches ``alloc_at[a] <= i < free_at[a]`` (``free_at == -1``: to the end), ``free_rank[a]`` its
    position among frees (-1 if never freed), ``alloc_kind[a]`` one of ``KINDS``.

    Launch ``i``: ``names[launch_name[i]]``, ``launch_exec_id[i]`` (hash of name and argument shapes),
    ``launch_phase[i]`` one of ``PHASES``, ``launch_iter[i]`` (-1 = outside any iteration),
    ``launch_flops[i]``, ``launch_bytes[i]`` (bytes the kernel reads + writes), ``launch_dur[i]``
    seconds (estimated for ``meta['gpu']`` or measured, see ``meta['durations']``). Its accesses are
    ``acc_*[acc_ptr[i]:acc_ptr[i+1]]``: allocation, byte offset, byte length, mode (READ|WRITE bits).
    """

    names: list[str]
    alloc_size: np.ndarray
    alloc_at: np.ndarray
    free_at: np.ndarray
    free_rank: np.ndarray
    alloc_kind: np.ndarray
    launch_name: np.ndarray
    launch_exec_id: np.ndarray
    launch_phase: np.ndarray
    launch_iter: np.ndarray
    launch_flops: np.ndarray
    launch_bytes: np.ndarray
    launch_dur: np.ndarray
    acc_ptr: np.ndarray
    acc_alloc: np.ndarray
    acc_off: np.ndarray
    acc_len: np.ndarray
    acc_mode: np.ndarray
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, dt in ARRAYS.items():
            setattr(self, name, np.ascontiguousarray(getattr(self, name), dtype=dt))

    @property
    def n_launches(self) -> int:
        return int(self.launch_name.shape[0])

    @property
    def n_allocs(self) -> int:
        return int(self.alloc_size.shape[0])

    @property
    def n_accesses(self) -> int:
        return int(self.acc_alloc.shape[0])

    @property
    def iterations(self) -> int:
        return int(self.launch_iter.max()) + 1 if self.n_launches and self.launch_iter.max() >= 0 else 0

    def accesses(self, i: int) -> slice:
        """Slice of the access arrays that belongs to launch ``i``."""
        return slice(int(self.acc_ptr[i]), int(self.acc_ptr[i + 1]))

    def free_at_or_end(self) -> np.ndarray:
        """``free_at`` with -1 replaced by ``n_launches`` (handy for interval arithmetic)."""
        return np.where(self.free_at < 0, self.n_launches, self.free_at)

    def fingerprint(self) -> str:
        """SHA-256 over names and arrays (not meta): equal fingerprints mean the same events."""
        h = hashlib.sha256("\0".join(self.names).encode())
        for name in ARRAYS:
            h.update(name.encode())
            h.update(getattr(self, name).tobytes())
        return h.hexdigest()

    def equals(self, other: "Trace") -> bool:
        """Event-for-event equality of names and arrays (meta ignored)."""
        return self.names == other.names and all(
            np.array_equal(getattr(self, n), getattr(other, n)) for n in ARRAYS
        )


# --------------------------------------------------------------------------------------------- validate


def validate(t: Trace) -> None:
    """Check a trace's internal consistency (vectorised).

    Raises
    ------
    TraceError
        Naming the first problem found and the launch / access / allocation index where it is.
    """
    A, L, N = t.n_allocs, t.n_launches, t.n_accesses
    for grp, n, names in (
        ("allocation", A, ("alloc_size", "alloc_at", "free_at", "free_rank", "alloc_kind")),
        ("launch", L, ("launch_name", "launch_exec_id", "launch_phase", "launch_iter", "launch_flops",
                       "launch_bytes", "launch_dur")),
        ("access", N, ("acc_alloc", "acc_off", "acc_len", "acc_mode")),
    ):
        for name in names:
            a = getattr(t, name)
            if a.ndim != 1 or a.shape[0] != n:
                raise TraceError(f"array {name} has shape {a.shape}, expected ({n},) like the other {grp} arrays")
    if t.acc_ptr.shape != (L + 1,):
        raise TraceError(f"array acc_ptr has shape {t.acc_ptr.shape}, expected ({L + 1},)")

    def first(mask: np.ndarray) -> int | None:
        idx = np.flatnonzero(mask)
        return int(idx[0]) if idx.size else None

    # allocations
    if (i := first(t.alloc_size <= 0)) is not None:
        raise TraceError(f"allocation {i}: size {t.alloc_size[i]} is not positive")
    if (i := first((t.alloc_at < 0) | (t.alloc_at > L))) is not None:
        raise TraceError(f"allocation {i}: alloc_at {t.alloc_at[i]} outside 0..{L}")
    if (i := first(np.diff(t.alloc_at) < 0)) is not None:
        raise TraceError(f"allocation {i + 1}: allocated at launch {t.alloc_at[i + 1]}, before allocation {i} "
                         f"(at {t.alloc_at[i]}); ids must be in allocation order")
    freed = t.free_at >= 0
    if (i := first(freed & ((t.free_at < t.alloc_at) | (t.free_at > L)))) is not None:
        raise TraceError(f"allocation {i}: freed at launch {t.free_at[i]}, outside {t.alloc_at[i]}..{L}")
    if (i := first(freed != (t.free_rank >= 0))) is not None:
        raise TraceError(f"allocation {i}: free_rank {t.free_rank[i]} disagrees with free_at {t.free_at[i]}")
    ranks = np.sort(t.free_rank[freed])
    if not np.array_equal(ranks, np.arange(ranks.size)):
        raise TraceError("free_rank values are not a permutation of 0..(number of frees - 1)")
    if (i := first(t.alloc_kind >= len(KINDS))) is not None:
        raise TraceError(f"allocation {i}: kind {t.alloc_kind[i]} unknown (valid 0..{len(KINDS) - 1})")
    # launches
    if (i := first((t.launch_name < 0) | (t.launch_name >= len(t.names)))) is not None:
        raise TraceError(f"launch {i}: name index {t.launch_name[i]} outside the name table ({len(t.names)})")
    if (i := first(t.launch_phase >= len(PHASES))) is not None:
        raise TraceError(f"launch {i}: phase {t.launch_phase[i]} unknown (valid 0..{len(PHASES) - 1})")
    if (i := first(~np.isfinite(t.launch_dur) | (t.launch_dur < 0))) is not None:
        raise TraceError(f"launch {i}: duration {t.launch_dur[i]} is not a finite non-negative number")
    if (i := first(~np.isfinite(t.launch_flops) | (t.launch_flops < 0))) is not None:
        raise TraceError(f"launch {i}: flops {t.launch_flops[i]} is not a finite non-negative number")
    if L and (t.acc_ptr[0] != 0 or t.acc_ptr[-1] != N):
        raise TraceError(f"acc_ptr must start at 0 and end at {N} (the number of accesses)")
    if (i := first(np.diff(t.acc_ptr) < 0)) is not None:
        raise TraceError(f"launch {i}: access offsets decrease (acc_ptr[{i}] > acc_ptr[{i + 1}])")
    # accesses
    if N:
        launch_of = np.repeat(np.arange(L), np.diff(t.acc_ptr))
        if (j := first((t.acc_alloc < 0) | (t.acc_alloc >= A))) is not None:
            raise TraceError(f"launch {launch_of[j]}: access {j} names unknown allocation {t.acc_alloc[j]}")
        a = t.acc_alloc
        if (j := first(launch_of < t.alloc_at[a])) is not None:
            raise TraceError(f"launch {launch_of[j]}: access {j} touches allocation {a[j]} before it is allocated "
                             f"(at launch {t.alloc_at[a[j]]})")
        if (j := first(launch_of >= t.free_at_or_end()[a])) is not None:
            raise TraceError(f"launch {launch_of[j]}: access {j} touches allocation {a[j]}, freed at launch "
                             f"{t.free_at[a[j]]}")
        if (j := first((t.acc_off < 0) | (t.acc_len <= 0) | (t.acc_off + t.acc_len > t.alloc_size[a]))) is not None:
            raise TraceError(f"launch {launch_of[j]}: access {j} range [{t.acc_off[j]}, {t.acc_off[j] + t.acc_len[j]}) "
                             f"out of bounds of allocation {a[j]} ({t.alloc_size[a[j]]} bytes)")
        if (j := first((t.acc_mode == 0) | (t.acc_mode > (READ | WRITE)))) is not None:
            raise TraceError(f"launch {launch_of[j]}: access {j} has mode {t.acc_mode[j]} (valid 1=read, 2=write, 3=both)")


# --------------------------------------------------------------------------------------------- file IO


def save(t: Trace, path: str | Path, level: int = 6) -> None:
    """Write ``t`` to ``path`` (validated first)."""
    validate(t)
    blobs, entries = [], []
    for name, dt in ARRAYS.items():
        raw = np.ascontiguousarray(getattr(t, name), dtype=dt).tobytes()
        comp = zlib.compress(raw, level)
        blobs.append(comp)
        entries.append({"name": name, "dtype": dt.str, "count": int(getattr(t, name).shape[0]),
                        "nbytes": len(comp), "crc32": zlib.crc32(raw)})
    header = json.dumps({"meta": t.meta, "names": t.names, "arrays": entries}, separators=(",", ":")).encode()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(_HEADER.pack(MAGIC, VERSION, len(header)))
        f.write(header)
        for b in blobs:
            f.write(b)
    tmp.replace(path)


def load(path: str | Path, check: bool = True) -> Trace:
    """Read a trace written by ``save``.

    Raises
    ------
    TraceError
        Wrong magic or version, a truncated or corrupted file, or (with ``check``) an inconsistent trace.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) < _HEADER.size:
        raise TraceError(f"{path}: truncated: {len(data)} bytes, shorter than the {_HEADER.size}-byte header")
    magic, version, hlen = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise TraceError(f"{path}: not a uvmprefetch trace (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise TraceError(f"{path}: trace format version {version} is not supported (this build reads {VERSION})")
    pos = _HEADER.size
    if len(data) < pos + hlen:
        raise TraceError(f"{path}: truncated inside the header ({len(data)} of {pos + hlen} bytes)")
    try:
        header = json.loads(data[pos:pos + hlen])
        entries = {e["name"]: e for e in header["arrays"]}
        names = list(header["names"])
    except (ValueError, KeyError, TypeError) as e:
        raise TraceError(f"{path}: header is damaged ({e})") from None
    pos += hlen
    arrays = {}
    for name, dt in ARRAYS.items():
        e = entries.get(name)
        if e is None:
            raise TraceError(f"{path}: array {name} missing from the header")
        end = pos + int(e["nbytes"])
        if end > len(data):
            raise TraceError(f"{path}: truncated in array {name} (file has {len(data)} bytes, needs {end})")
        try:
            raw = zlib.decompress(data[pos:end])
        except zlib.error:
            raise TraceError(f"{path}: array {name} is corrupted (does not decompress)") from None
        if zlib.crc32(raw) != e["crc32"]:
            raise TraceError(f"{path}: array {name} is corrupted (CRC mismatch)")
        if np.dtype(e["dtype"]) != dt or len(raw) != dt.itemsize * int(e["count"]):
            raise TraceError(f"{path}: array {name} has dtype {e['dtype']} x {e['count']}, expected {dt.str}")
        arrays[name] = np.frombuffer(raw, dtype=dt).copy()
        pos = end
    if pos != len(data):
        raise TraceError(f"{path}: {len(data) - pos} unexpected bytes after the last array")
    t = Trace(names=names, meta=header.get("meta", {}), **arrays)
    if check:
        try:
            validate(t)
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from None
    return t


# --------------------------------------------------------------------------------------------- building


def _meta_copy(meta: dict) -> dict:
    """A trace's own meta: the builder may keep noting dtype runs after a build."""
    out = dict(meta)
    if "flop_dtype_runs" in out:
        out["flop_dtype_runs"] = [list(r) for r in out["flop_dtype_runs"]]
    return out


class TraceBuilder:
    """Append-only construction of a ``Trace`` (recorders, synthetic generators, tests).

    >>> b = TraceBuilder()
    >>> x = b.alloc(4 << 20, "activation")
    >>> b.launch("fill", [(x, 0, 4 << 20, WRITE)], duration=1e-3)
    0
    >>> b.free(x); t = b.build()
    """

    def __init__(self, meta: dict | None = None) -> None:
        self.meta = dict(meta or {})
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self.alloc_size: list[int] = []
        self.alloc_at: list[int] = []
        self.free_at: list[int] = []
        self.free_rank: list[int] = []
        self.alloc_kind: list[int] = []
        self.launch_cols: dict[str, list] = {k: [] for k in ("launch_name", "launch_exec_id", "launch_phase",
                                                             "launch_iter", "launch_flops", "launch_bytes",
                                                             "launch_dur")}
        self.acc_ptr = [0]
        self.acc_cols: dict[str, list] = {k: [] for k in ("acc_alloc", "acc_off", "acc_len", "acc_mode")}
        self.n_frees = 0
        self.iteration = -1
        self.phase = PHASE["other"]

    @property
    def n_launches(self) -> int:
        return len(self.launch_cols["launch_name"])

    def note_flop_dtype(self, dtype: str) -> None:
        """The next launch's FLOPs run in ``dtype`` (``roofline.FLOP_DTYPES``): kept as run-length pairs
        ``meta['flop_dtype_runs']`` = ``[[first_launch, dtype], ...]``, which a replay on another GPU profile
        needs to re-estimate durations (``roofline.dtype_codes``)."""
        runs = self.meta.setdefault("flop_dtype_runs", [])
        if not runs or runs[-1][1] != dtype:
            runs.append([self.n_launches, dtype])

    def alloc(self, size: int, kind: str | int = "other") -> int:
        """Record an allocation of ``size`` bytes now; returns its id."""
        self.alloc_size.append(int(size))
        self.alloc_at.append(self.n_launches)
        self.free_at.append(-1)
        self.free_rank.append(-1)
        self.alloc_kind.append(KIND[kind] if isinstance(kind, str) else int(kind))
        return len(self.alloc_size) - 1

    def free(self, alloc_id: int) -> None:
        """Record the free of ``alloc_id`` now."""
        if self.free_at[alloc_id] >= 0:
            raise TraceError(f"allocation {alloc_id} freed twice")
        self.free_at[alloc_id] = self.n_launches
        self.free_rank[alloc_id] = self.n_frees
        self.n_frees += 1

    def name_id(self, name: str) -> int:
        nid = self._name_ids.get(name)
        if nid is None:
            nid = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return nid

    def launch(self, name: str, accesses, *, duration: float, flops: float = 0.0, nbytes: int | None = None,
               exec_id: int | None = None, phase: str | int | None = None, iteration: int | None = None) -> int:
        """Record a launch touching ``accesses`` = iterable of (alloc_id, offset, length, mode)."""
        accesses = list(accesses)
        c = self.launch_cols
        c["launch_name"].append(self.name_id(name))
        if exec_id is None:
            exec_id = exec_id_of(name, [(a, ln) for a, _, ln, _ in accesses])
        c["launch_exec_id"].append(int(exec_id))
        ph = self.phase if phase is None else (PHASE[phase] if isinstance(phase, str) else int(phase))
        c["launch_phase"].append(ph)
        c["launch_iter"].append(self.iteration if iteration is None else int(iteration))
        c["launch_flops"].append(float(flops))
        c["launch_bytes"].append(int(sum(ln for _, _, ln, _ in accesses) if nbytes is None else nbytes))
        c["launch_dur"].append(float(duration))
        for a, off, ln, mode in accesses:
            self.acc_cols["acc_alloc"].append(int(a))
            self.acc_cols["acc_off"].append(int(off))
            self.acc_cols["acc_len"].append(int(ln))
            self.acc_cols["acc_mode"].append(int(mode))
        self.acc_ptr.append(len(self.acc_cols["acc_alloc"]))
        return self.n_launches - 1

    def build(self, check: bool = True) -> Trace:
        t = Trace(names=list(self.names), meta=_meta_copy(self.meta), alloc_size=self.alloc_size, alloc_at=self.alloc_at,
                  free_at=self.free_at, free_rank=self.free_rank, alloc_kind=self.alloc_kind,
                  acc_ptr=self.acc_ptr, **self.launch_cols, **self.acc_cols)
        if check:
            validate(t)
        return t


def exec_id_of(name: str, shape_key) -> int:
    """DeepUM's execution id: a stable 64-bit hash of the kernel name and its arguments' shapes/sizes."""
    h = hashlib.blake2b(f"{name}|{shape_key!r}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")
