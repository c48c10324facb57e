"""The LD_PRELOAD shim (``kernels/uvmshim.c``): build it on first use, find it, read it through ctypes.

The shim is built from source by the native builder (``runtime/native.py``) into a private cache folder keyed
by the source's hash and the compiler, so an edited shim is rebuilt and two versions never collide. Reading it in-process works because ``ctypes.CDLL`` on the path of an
already preloaded library returns that same library (same ring, same counters).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

from ..errors import ShimError
from . import native

LIB_NAME = "libuvmshim.so"
ABI = 2  # must equal UVMSHIM_ABI in uvmshim.c


def source_dir() -> Path:
    """Folder holding ``uvmshim.c`` and its Makefile (the repository's ``kernels/``)."""
    try:
        src = native.source_dir()
    except native.NativeBuildError as e:
        raise ShimError(str(e)) from None
    if not (src / "uvmshim.c").is_file():
        raise ShimError(f"shim source uvmshim.c not found in {src}")
    return src


def cache_dir() -> Path:
    """Where built shims live: ``$UVMPREFETCH_SHIM_DIR``, else the native build cache (``native.cache_root``)."""
    d = os.environ.get("UVMPREFETCH_SHIM_DIR")
    return Path(d) if d else native.cache_root()


def built_path() -> Path:
    """Path the shim for the current source and compiler has (or will have) once built."""
    source_dir()
    try:
        key, _ = native.build_key(native.SHIM)
    except native.NativeBuildError as e:
        raise ShimError(str(e)) from None
    return native.folder_for(native.SHIM, key) / LIB_NAME


def shim_path(build: bool = True) -> Path:
    """The shim's path, building it first if needed (and ``build``). The cache rules are the native builder's
    (``runtime/native.py``): private folders only, and a library whose owner, mode or recorded hash does not
    match is rebuilt, never loaded.

    Raises
    ------
    ShimError
        No C compiler / make, the build failed (the compiler's last lines are in the message), the cache is
        not private, or the shim is not built and ``build`` is False.
    """
    source_dir()
    if not build:
        path, why = native.built(native.SHIM)
        if path is None:
            raise ShimError(f"shim not built yet ({built_path()}: {why}); run `uvmprefetch shim-path` to build it")
        return path
    for tool in ("make", os.environ.get("CC", "cc")):
        if shutil.which(tool) is None:
            raise ShimError(f"building the shim needs `{tool}` on PATH (a C compiler and make; no CUDA needed)")
    try:
        return native.build(native.SHIM)
    except native.NativeBuildError as e:
        raise ShimError(str(e).replace("libuvmshim.so", "the shim", 1)) from None


# ------------------------------------------------------------------------------------------ ctypes view


class Stats(ctypes.Structure):
    """Mirror of ``struct uvmshim_stats``."""

    _fields_ = [(n, ctypes.c_uint64) for n in (
        "abi", "managed_enabled", "managed_bytes", "peak_managed_bytes", "limit_bytes", "n_alloc", "n_free",
        "n_refused", "n_errors", "n_launches", "n_launches_dropped", "cudart_found")]

    def as_dict(self) -> dict:
        return {n: int(getattr(self, n)) for n, _ in self._fields_}


LIMIT_MODES = {1: "host", 2: "gpu-free", 3: "bytes"}  # enum in uvmshim.c


class LimitInfo(ctypes.Structure):
    """Mirror of ``struct uvmshim_limit``: the managed-memory limit and the figures it came from."""

    _fields_ = [(n, ctypes.c_uint64) for n in (
        "limit_bytes", "mode", "requested", "device_free", "device_total", "gpu_cap", "host_known", "mem_available",
        "cgroup_room", "cgroup_version", "host_margin", "host_backed")]

    def as_dict(self) -> dict:
        """Every field; ``mode`` as its name; ``cgroup_room`` None where no cgroup sets a limit."""
        d = {n: int(getattr(self, n)) for n, _ in self._fields_}
        d["mode"] = LIMIT_MODES.get(d["mode"], str(d["mode"]))
        d["host_known"] = bool(d["host_known"])
        if d["cgroup_room"] == 2**64 - 1:
            d["cgroup_room"] = None
        return d


class LaunchRecord(ctypes.Structure):
    """Mirror of ``struct uvmshim_launch``."""

    _fields_ = [("index", ctypes.c_uint64), ("func", ctypes.c_uint64), ("stream", ctypes.c_uint64),
                ("t_ns", ctypes.c_uint64), ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3),
                ("shared_mem", ctypes.c_uint64), ("status", ctypes.c_int32), ("_pad", ctypes.c_int32)]


class Shim:
    """The shim loaded in this process (normally already there through ``LD_PRELOAD``).

    Raises
    ------
    ShimError
        The library cannot be loaded or has another ABI version.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise ShimError(f"cannot load the shim {path}: {e}") from None
        try:
            abi = self.lib.uvmshim_abi()
        except AttributeError:
            raise ShimError(f"{path} is not the uvmprefetch shim (no uvmshim_abi)") from None
        if abi != ABI:
            raise ShimError(f"shim {path} has ABI {abi}, this package needs {ABI}: rebuild it")
        self.lib.uvmshim_ring_read.restype = ctypes.c_size_t
        self.lib.uvmshim_ring_read.argtypes = [ctypes.POINTER(LaunchRecord), ctypes.c_size_t,
                                               ctypes.POINTER(ctypes.c_uint64)]
        self.lib.uvmshim_plan_limit.restype = ctypes.c_int
        self.lib.uvmshim_plan_limit.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_char_p,
                                                ctypes.POINTER(LimitInfo)]
        self.lib.uvmshim_parse_limit.restype = ctypes.c_int
        self.lib.uvmshim_parse_limit.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
        self.lib.uvmshim_segments.restype = ctypes.c_size_t
        self.lib.uvmshim_segments.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                                              ctypes.c_size_t]
        self._cursor = ctypes.c_uint64(0)
        self._buf = (LaunchRecord * 4096)()

    def stats(self) -> dict:
        s = Stats()
        self.lib.uvmshim_get_stats(ctypes.byref(s))
        return s.as_dict()

    def limit(self) -> dict:
        """The managed-memory limit in force (``LimitInfo.as_dict``). Fixes it now if no allocation has yet:
        call it once CUDA is initialised, as the cuda backend does."""
        out = LimitInfo()
        self.lib.uvmshim_limit_info(ctypes.byref(out))
        return out.as_dict()

    def plan_limit(self, device_free: int, device_total: int, spec: str | None) -> dict:
        """The limit ``spec`` (a ``UVMPREFETCH_MANAGED_LIMIT`` value; None: the default) would give on a device
        with ``device_free`` of ``device_total`` bytes free (0: unknown), with this machine's host memory.

        Raises
        ------
        ShimError
            ``spec`` is not a valid value.
        """
        out = LimitInfo()
        if not self.lib.uvmshim_plan_limit(device_free, device_total,
                                           None if spec is None else spec.encode(), ctypes.byref(out)):
            raise ShimError(f"UVMPREFETCH_MANAGED_LIMIT={spec!r} is not a valid value")
        return out.as_dict()

    def parse_limit(self, spec: str) -> tuple[str, int] | None:
        """The shim's own reading of a ``UVMPREFETCH_MANAGED_LIMIT`` value: ``(mode, bytes)``, None if invalid."""
        n = ctypes.c_uint64(0)
        mode = self.lib.uvmshim_parse_limit(spec.encode(), ctypes.byref(n))
        return (LIMIT_MODES[mode], int(n.value) if mode == 3 else 0) if mode else None

    def read_launches(self) -> list[LaunchRecord]:
        """Launch records published since the last call (oldest first)."""
        out = []
        while True:
            n = self.lib.uvmshim_ring_read(self._buf, len(self._buf), ctypes.byref(self._cursor))
            out.extend(LaunchRecord.from_buffer_copy(self._buf[i]) for i in range(n))
            if n < len(self._buf):
                return out

    def count_unknown_kernels(self, observer_lib) -> bool:
        """Count, from now on, the kernels launched that no op ``observer_lib`` (the C++ observer's loaded ``CDLL``)
        records accounts for (``uvmshim_set_observer``; ``None`` stops counting: call it before the observer can
        go). False where the shim or the observer library predates the count (rebuild them)."""
        fn = getattr(self.lib, "uvmshim_set_observer", None)
        if fn is None:
            return False
        fn.argtypes = [ctypes.c_void_p]
        if observer_lib is None:
            fn(None)
            return True
        attribution = getattr(observer_lib, "uvmobs_launch_attribution", None)
        if attribution is None:
            return False
        fn(ctypes.cast(attribution, ctypes.c_void_p))
        return True

    def unknown_kernels(self) -> dict | None:
        """``{launches, graph_launches}`` counted since ``count_unknown_kernels``: runtime-API kernel launches made
        while the observer recorded ops and the launching thread was in none, and CUDA graph replays while it
        recorded ops; None where the shim has no such count."""
        fn = getattr(self.lib, "uvmshim_unknown_kernels", None)
        if fn is None:
            return None
        out = (ctypes.c_uint64 * 2)()
        fn(out)
        return {"launches": int(out[0]), "graph_launches": int(out[1])}

    def segments(self) -> list[tuple[int, int]]:
        """Live managed allocations as sorted ``(ptr, size)`` pairs."""
        n = 1024
        while True:
            ptrs, sizes = (ctypes.c_uint64 * n)(), (ctypes.c_uint64 * n)()
            total = self.lib.uvmshim_segments(ptrs, sizes, n)
            if total <= n:
                return sorted(zip((int(p) for p in ptrs[:total]), (int(s) for s in sizes[:total])))
            n = total + 64


_started_with: str | None = None  # set by the start-up hook before it takes the shim out of LD_PRELOAD


def remember_preloaded(path: str) -> None:
    """Record that this process started with the shim preloaded (the hook then removes it from
    ``LD_PRELOAD`` so that children do not inherit it, and ``preloaded()`` must still say so)."""
    global _started_with
    _started_with = path


def preloaded() -> str | None:
    """Path of the shim if this process was started with it in ``LD_PRELOAD``."""
    for part in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if os.path.basename(part) == LIB_NAME:
            return part
    return _started_with
