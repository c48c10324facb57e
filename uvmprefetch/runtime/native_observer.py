"""observe (live, native): the C++ observer library (``kernels/observer.cpp``, ``cpu_alloc.cpp``, ``gate.cpp``)
seen from Python: build and load it, start and switch it, drain its rings into NumPy arrays, and say why it is
not available where it is not (then the runtime falls back to the Python dispatch mode, ``observe.py``).

The op ring's records (``kernels/uvmobs.h``) are four little-endian 64-bit words; ``OP_DTYPE`` mirrors them.
The allocator ring's records mirror ``uvm::AllocEvent`` (``kernels/uvmevents.h``): ``ALLOC_DTYPE``.
"""

from __future__ import annotations

import collections
import ctypes
import threading

import numpy as np

from . import native
from .observe import GpuProgress

ABI = 1  # kernels/observer.cpp kAbi

OP_DTYPE = np.dtype([("a", "<u8"), ("b", "<u8"), ("c", "<u8"), ("d", "<u8")])
ALLOC_DTYPE = np.dtype([("seq", "<u8"), ("addr", "<u8"), ("size", "<u8"), ("stream", "<u8"), ("action", "<u4"),
                        ("device", "<i4")])
assert OP_DTYPE.itemsize == 32 and ALLOC_DTYPE.itemsize == 40

# record kinds (top byte of word c) and their fields (uvmobs.h)
HEAD, HEAD2, RANGE, MARK, GATE = 1, 2, 3, 4, 5
MARK_OPT_PRE, MARK_OPT_POST = 1, 2
ALLOC, FREE_COMPLETED = 0, 2  # uvm::AllocAction
LEN_MASK = (1 << 48) - 1
LEAF_GRAD = 1
STATE_OFF, STATE_DORMANT, STATE_ACTIVE, STATE_FAILED = 0, 1, 2, 3
COUNTERS = ("recorded", "dropped", "callback_ns", "gate_late", "gate_fault", "gate_waits", "op_ids")

_u64p = ctypes.POINTER(ctypes.c_uint64)
# Short calls made with the GIL held (``ObserverLib.held``): no lock shared with a thread that may wait for the GIL.
_HELD = ("uvmobs_drain", "uvmalloc_drain", "uvmobs_seq", "uvmobs_state", "uvmobs_counters", "uvmalloc_stats",
         "uvmobs_op_name", "uvmobs_set_optimizer", "uvmobs_mark", "uvmobs_turn", "uvmobs_parked")


class ObserverLib:
    """The loaded ``libuvmobserver.so`` (one per process: the callbacks and rings are process-wide).

    Raises
    ------
    NativeBuildError
        The library cannot be loaded or has another ABI.
    """

    def __init__(self, path) -> None:
        try:
            self.lib = lib = ctypes.CDLL(str(path))  # CDLL: every call releases the GIL
        except OSError as e:
            raise native.NativeBuildError(f"cannot load the observer {path}: {e}") from None
        if lib.uvmobs_abi() != ABI:
            raise native.NativeBuildError(f"observer {path} has ABI {lib.uvmobs_abi()}, this package needs {ABI}")
        self.path = str(path)
        sig = {
            "uvmobs_torch_version": (ctypes.c_char_p, []),
            "uvmobs_set_rules": (None, [ctypes.c_char_p, ctypes.c_char_p]),
            "uvmobs_start": (ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
            "uvmobs_set_active": (ctypes.c_int, [ctypes.c_int]),
            "uvmobs_stop": (None, []),
            "uvmobs_state": (ctypes.c_int, []),
            "uvmobs_quiet": (None, []),
            "uvmobs_set_optimizer": (None, [ctypes.c_int]),
            "uvmobs_set_timing": (None, [ctypes.c_int]),
            "uvmobs_mark": (ctypes.c_uint64, [ctypes.c_uint32, ctypes.c_uint64]),
            "uvmobs_drain": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
            "uvmobs_seq": (ctypes.c_uint64, []),
            "uvmobs_turn": (ctypes.c_int, [ctypes.c_int]),
            "uvmobs_turn_wait": (ctypes.c_int, [ctypes.c_int]),
            "uvmobs_parked": (None, [_u64p]),
            "uvmobs_set_light": (ctypes.c_int, [ctypes.c_int]),
            "uvmobs_counters": (ctypes.c_size_t, [_u64p, ctypes.c_size_t]),
            "uvmobs_op_name": (ctypes.c_size_t, [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]),
            "uvmobs_error": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
            "uvmobs_test_fail_after": (None, [ctypes.c_int64]),
            "uvmobs_dtype_name": (ctypes.c_char_p, [ctypes.c_int]),
            "uvmobs_op_facts": (None, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
            "uvmalloc_install": (ctypes.c_int, []),
            "uvmalloc_uninstall": (None, []),
            "uvmalloc_set_events": (None, [ctypes.c_int]),
            "uvmalloc_drain": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
            "uvmalloc_stats": (None, [_u64p]),
            "uvmalloc_wait_pressure": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_int]),
            "uvmalloc_wake": (None, []),
            "uvmgate_init": (ctypes.c_int, [ctypes.c_char_p]),
            "uvmgate_set_block_shift": (None, [ctypes.c_int]),
            "uvmgate_set": (None, [_u64p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint32]),
            "uvmgate_settle": (None, [_u64p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint32]),
            "uvmgate_get": (None, [_u64p, ctypes.c_size_t, _u64p]),
            "uvmgate_counters": (None, [_u64p]),
            "uvmgate_check": (None, [_u64p, _u64p, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_uint32)]),
            "uvmgate_completed_seq": (ctypes.c_uint64, []),
            "uvmgate_set_progress_every": (None, [ctypes.c_int]),
            "uvmgate_note": (None, [ctypes.c_uint64, ctypes.c_void_p]),
            "uvmgate_take_demands": (ctypes.c_size_t, [_u64p, ctypes.c_size_t]),
            "uvmgate_use_gil": (ctypes.c_int, []),
            "uvmgate_demand_counters": (None, [_u64p]),
            "uvmgate_quiesce": (ctypes.c_int, [ctypes.c_int]),
            "uvmgate_begin": (None, [_u64p, _u64p, ctypes.c_size_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]),
            "uvmgate_end": (None, []),
        }
        for name, (res, args) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        # The same library through PyDLL: these calls keep the GIL. They take microseconds, and a thread that lets
        # the GIL go gets it back only when a Python thread that keeps taking it (a training loop of small ops)
        # happens to let it win the race: the planner (drains, counters) and the optimizer hooks (marks) would
        # wait milliseconds for each call, and every hand-over costs the other thread too.
        self.held = ctypes.PyDLL(str(path))
        for name in _HELD:
            fn = getattr(self.held, name)
            fn.restype, fn.argtypes = sig[name]
        self.torch_version = lib.uvmobs_torch_version().decode()
        # the CUDA caching allocator's tracker (alloc_tracker.cpp), compiled in where a CUDA torch was found
        self.has_tracker = hasattr(lib, "uvm_alloc_tracker_attach")
        if self.has_tracker:
            for name, (res, args) in {
                "uvm_alloc_tracker_attach": (ctypes.c_int, []),
                "uvm_alloc_tracker_enable": (None, [ctypes.c_int]),
                "uvm_alloc_tracker_drain": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
                "uvm_alloc_tracker_dropped": (ctypes.c_uint64, [_u64p]),
                "uvm_alloc_tracker_barrier": (ctypes.c_int, [ctypes.c_int]),
                "uvm_alloc_tracker_next_seq": (ctypes.c_uint64, []),
                "uvm_alloc_tracker_quiesce": (ctypes.c_int, [ctypes.c_int]),
                "uvm_alloc_tracker_error": (ctypes.c_char_p, []),
                "uvm_alloc_tracker_built_for": (ctypes.c_char_p, []),
            }.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
        self._names: list[str] = []
        self._op_buf = np.zeros(1 << 15, dtype=OP_DTYPE)
        self._alloc_buf = np.zeros(1 << 14, dtype=ALLOC_DTYPE)
        self._cuda_buf = np.zeros(1 << 14, dtype=ALLOC_DTYPE)  # (drained by the planner or the mover thread)

    # ------------------------------------------------------------------------------------------ control
    def start(self, device_type: str, active: bool) -> None:
        """Register the callbacks for ``device_type`` ('cpu' or 'cuda') with the recorder's op rules."""
        from ..trace.recorder import NO_KERNEL, SKIP_NAMESPACES
        self.lib.uvmobs_set_rules("\n".join(sorted(NO_KERNEL)).encode(), "\n".join(SKIP_NAMESPACES).encode())
        if self.lib.uvmobs_start(1 if device_type == "cuda" else 0, int(active)) != 0:
            raise native.NativeBuildError(f"the observer did not start: {self.error() or 'unknown error'}")

    def set_active(self, on: bool) -> int:
        return self.lib.uvmobs_set_active(int(on))

    def stop(self) -> None:
        self.lib.uvmobs_stop()

    def state(self) -> int:
        return self.held.uvmobs_state()

    def error(self) -> str:
        buf = ctypes.create_string_buffer(512)
        self.lib.uvmobs_error(buf, len(buf))
        return buf.value.decode(errors="replace")

    def counters(self) -> dict:
        out = (ctypes.c_uint64 * len(COUNTERS))()
        self.held.uvmobs_counters(out, len(COUNTERS))
        return dict(zip(COUNTERS, (int(v) for v in out)))

    def op_name(self, op_id: int) -> str:
        """The name of op id ``op_id`` ('aten::add.Tensor'); names are interned once, then cached here."""
        while op_id >= len(self._names):
            buf = ctypes.create_string_buffer(256)
            n = self.held.uvmobs_op_name(len(self._names), buf, len(buf))
            if n == 0:
                return f"op#{op_id}"
            if n >= len(buf):
                buf = ctypes.create_string_buffer(n + 1)
                self.held.uvmobs_op_name(len(self._names), buf, len(buf))
            self._names.append(buf.value.decode())
        return self._names[op_id]

    # ------------------------------------------------------------------------------------------ rings
    def drain_ops(self) -> np.ndarray:
        """Every op record published so far (a copy, oldest first)."""
        return self._drain(self.held.uvmobs_drain, self._op_buf)

    def drain_allocs(self) -> np.ndarray:
        """Every allocator event published so far (a copy, oldest first)."""
        return self._drain(self.held.uvmalloc_drain, self._alloc_buf)

    @staticmethod
    def _drain(fn, buf: np.ndarray) -> np.ndarray:
        parts = []
        while True:
            n = fn(buf.ctypes.data, len(buf))
            if n:
                parts.append(buf[:n].copy())
            if n < len(buf):
                break
        return parts[0] if len(parts) == 1 else (np.concatenate(parts) if parts else buf[:0].copy())

    # ------------------------------------------------------------------------------------------ the allocator tracker
    def tracker_attach(self) -> str:
        """Attach the CUDA caching allocator's tracker ('' on success, else why not)."""
        if not self.has_tracker:
            return "this observer library has no allocator tracker"
        return "" if self.lib.uvm_alloc_tracker_attach() == 0 else (self.tracker_error() or "attach failed")

    def tracker_error(self) -> str:
        return (self.lib.uvm_alloc_tracker_error() or b"").decode(errors="replace")

    def tracker_built_for(self) -> str:
        return (self.lib.uvm_alloc_tracker_built_for() or b"").decode()

    def tracker_dropped(self) -> int:
        return int(self.lib.uvm_alloc_tracker_dropped(None))

    def tracker_next_seq(self) -> int:
        return int(self.lib.uvm_alloc_tracker_next_seq())

    def tracker_quiesce(self, timeout_us: int = 2000) -> int:
        """0 once every allocator event numbered before the call is in the ring (no lock taken); -1 on timeout."""
        return int(self.lib.uvm_alloc_tracker_quiesce(int(timeout_us)))

    def tracker_barrier(self, device: int) -> int:
        return int(self.lib.uvm_alloc_tracker_barrier(int(device)))

    def drain_cuda_allocs(self) -> np.ndarray:
        """Every CUDA caching allocator event published so far (a copy, oldest first)."""
        return self._drain(self.lib.uvm_alloc_tracker_drain, self._cuda_buf)

    def parked(self) -> tuple[int, int]:
        """(parks, nanoseconds): how often and how long the training thread waited for the planner's turns."""
        out = (ctypes.c_uint64 * 2)()
        self.held.uvmobs_parked(out)
        return int(out[0]), int(out[1])

    def alloc_stats(self) -> dict:
        out = (ctypes.c_uint64 * 5)()
        self.held.uvmalloc_stats(out)
        return dict(zip(("live_bytes", "peak_live_bytes", "allocations", "frees", "dropped"), (int(v) for v in out)))


class NativeProgress(GpuProgress):
    """Which planned launches the GPU has finished (cuda, C++ observer): ``observe.GpuProgress`` fed by the events
    the observer records on the ops' own streams every few launches (``kernels/gate.cpp``) instead of an event per
    launch recorded by the thread that runs the hooks (the planner's stream is not the ops'). ``seq`` is set by
    the planner to the observer's sequence number of the launch about to be recorded."""

    def __init__(self, lib: ObserverLib, max_blocks: int) -> None:
        self.lib = lib.lib
        self.pins = np.zeros(max_blocks, dtype=np.int32)
        self._pending: collections.deque = collections.deque()  # (seq, launch index, blocks)
        self.completed = -1
        self.seq = 0

    def record(self, index: int, blocks: np.ndarray) -> None:
        self.pins[blocks] += 1
        self._pending.append((self.seq, index, blocks))

    def poll(self) -> int:
        done = self.lib.uvmgate_completed_seq()
        q = self._pending
        while q and q[0][0] <= done:
            _, index, blocks = q.popleft()
            self.pins[blocks] -= 1
            self.completed = index
        return self.completed


_lock = threading.Lock()
_loaded: ObserverLib | None = None
_why_not: str | None = None


def load(say=None) -> ObserverLib:
    """The observer library, built on first use (``runtime/native.py``; ``say(msg)`` is told before a build) and
    loaded once per process.

    Raises
    ------
    NativeBuildError
        No compiler, torch headers or make, or the build failed: one line that says which.
    """
    global _loaded, _why_not
    with _lock:
        if _loaded is not None:
            return _loaded
        if _why_not is not None:
            raise native.NativeBuildError(_why_not)
        try:
            _loaded = ObserverLib(native.build(native.OBSERVER, say=say))
        except native.NativeBuildError as e:
            _why_not = str(e)
            raise
        except Exception as e:  # noqa: BLE001 - an unexpected loader failure is a fallback, never a crash
            _why_not = f"{type(e).__name__}: {e}"
            raise native.NativeBuildError(_why_not) from None
        return _loaded


def status() -> tuple[bool, str]:
    """(available, detail) without building: what ``doctor`` reports."""
    path, why = native.built(native.OBSERVER)
    if path is not None:
        import json
        rec = json.loads((path.parent / "build.json").read_text())
        return True, f"built for torch {rec.get('torch')} (C++ ABI {rec.get('abi')}): {path}"
    return False, why


__all__ = ["ALLOC_DTYPE", "NativeProgress", "OP_DTYPE", "ObserverLib", "load", "status"]
