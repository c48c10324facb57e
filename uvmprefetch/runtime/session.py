"""One live run: observer -> policy -> backend, plus the report and the trace written at exit.

Safety contract (issue 5, item 7): nothing here may kill or corrupt the user's training. Every runtime
error inside a hook goes to ``Session.fail``, which logs it once and switches the session off (the program
goes on with plain managed memory on the GPU, plain CPU tensors in dryrun); the report still gets written.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import sys
import threading
import time

import numpy as np

from ..config import RuntimeConfig
from ..errors import ConfigError
from ..policy import DEFAULT_POLICY, available, make_policy
from ..policy.base import LaunchInfo, Policy
from ..trace.format import PHASE, READ, WRITE
from ..trace.recorder import _DTYPE_NAMES, cached_exec_id, cached_flops, scan_op
from ..trace.roofline import estimator
from .observe import StorageTracker, make_mode, tensor_extent
from .iterations import IterationEnds

log = logging.getLogger("uvmprefetch.runtime")

# Best first: the live runtime uses the first of these that is registered and importable.
_PREFERENCE = (DEFAULT_POLICY, "deepum", "demand")


def default_policy() -> str:
    """The best online policy available now (the registry may list policies still being written)."""
    have = available()
    for name in _PREFERENCE:
        if name in have:
            return name
    raise ConfigError(f"no online policy is available (registered and importable: {', '.join(have) or 'none'})")


def build_policy(cfg: RuntimeConfig) -> Policy:
    """The policy ``cfg`` asks for, with ``cfg.window`` applied.

    Raises
    ------
    ConfigError
        Unknown policy, an offline policy (it needs the whole trace in advance), or a window for a policy
        without a ``window`` parameter.
    """
    spec = cfg.policy or default_policy()
    pol = make_policy(spec)
    if pol.offline or pol.ideal:
        raise ConfigError(f"UVMPREFETCH_POLICY={spec!r}: policy {pol.name} is a simulator baseline (offline or "
                          f"infinite memory); a live run needs an online one: {', '.join(_PREFERENCE)}")
    if cfg.window is not None:
        names = {f.name for f in dataclasses.fields(pol.Params)}
        if "window" not in names:
            raise ConfigError(f"UVMPREFETCH_WINDOW={cfg.window}: policy {pol.name} has no window parameter")
        # an explicit window is a fixed window: the adaptive monitor (when the policy has one) is switched off
        kw = {"window": cfg.window}
        if "adaptive_window" in names:
            kw["adaptive_window"] = False
        if "window_min" in names:
            kw["window_min"] = min(pol.params.window_min, cfg.window)
        if "window_max" in names:
            kw["window_max"] = max(pol.params.window_max, cfg.window)
        try:
            pol = type(pol)(dataclasses.replace(pol.params, **kw))
        except ConfigError as e:
            raise ConfigError(f"UVMPREFETCH_WINDOW={cfg.window}: {e}") from None
    return pol


def native_unsupported(cfg: RuntimeConfig) -> str:
    """Why the C++ observer cannot serve ``cfg`` ('' when it can: every configuration today; discards on the cuda
    backend need it, for the caching allocator's events)."""
    return ""


def make_backend(cfg: RuntimeConfig, policy: Policy):
    if cfg.backend == "dryrun":
        from .dryrun import DryrunBackend
        return DryrunBackend(cfg, policy)
    from .cuda_backend import CudaBackend
    return CudaBackend(cfg, policy)


_EMPTY = np.zeros(0, dtype=np.int64)


def _union(arrays: list) -> np.ndarray:
    """Sorted unique block ids of several small id arrays (what ``np.unique(np.concatenate(...))`` gives;
    in Python sets for the few ids of a typical launch, ~3x cheaper than NumPy's set routines there)."""
    if not arrays:
        return _EMPTY.copy()
    if len(arrays) == 1 and arrays[0].size <= 1:
        return arrays[0].astype(np.int64, copy=True)
    if sum(a.size for a in arrays) > 256:  # big launches: NumPy wins
        return np.unique(np.concatenate(arrays)).astype(np.int64, copy=False)
    ids: set = set()
    for a in arrays:
        ids.update(a.tolist())
    return np.array(sorted(ids), dtype=np.int64)


class Session:
    """A live run of the runtime in this process.

    Parameters
    ----------
    cfg
        Validated configuration.
    backend
        Optional backend object (tests); default from ``cfg.backend``.
    rank
        This process's ``ranks.Rank`` in a distributed job (None: a single process). The policy is told its
        ``rank`` and ``world`` before it starts, as in the simulator's several-GPU replay.
    dormant
        With the C++ observer: let the planner sleep until the live bytes reach half the capacity (the default);
        False plans every launch from the start (small models in tests, like a trace does).

    Raises
    ------
    ConfigError, DeviceError
        At construction: bad policy/window, no GPU or a missing driver feature for the cuda backend.
    """

    def __init__(self, cfg: RuntimeConfig, backend=None, rank=None, dormant: bool = True) -> None:
        self.cfg = cfg
        self.rank = rank
        self._dormant_ok = dormant
        self.policy = build_policy(cfg)
        if rank is not None:
            self.policy.rank, self.policy.world = rank.rank, rank.world_size
        self.backend = backend if backend is not None else make_backend(cfg, self.policy)
        self.block_size = self.backend.block_size
        # a launch's (address, length, mode) spans -> its sorted unique block ids and written block ids
        self._launch_blocks = getattr(self.backend, "launch_blocks", None) or self._blocks_by_range
        self.tracker = StorageTracker(self.block_size, virtual=self.backend.virtual_addresses)
        if hasattr(self.backend, "copy_status"):  # the copy path (cuda): an allocation is observed once an op touched it
            self.backend.observed = self.tracker.live.__contains__
        self.device_type = self.backend.device_type
        self.gpu = getattr(self.backend, "gpu", None)
        self._estimate = estimator(self.gpu) if self.gpu is not None else None
        self.active = False
        self.index = 0
        self.iteration = 0
        self.in_optimizer = False
        self.iter_ends = IterationEnds()  # after each hooked step, or inferred while there is none
        self.names: dict[str, int] = {}
        self.errors: list[str] = []
        self.degraded = False
        self.window_log: list[tuple[int, float]] = []
        self.monitor: list[dict] = []  # per iteration (_monitor_tick)
        self._monitor_prev: dict = {}
        self.iter_wall: list[float] = []
        self.phase_launches = {p: 0 for p in ("forward", "backward", "optimizer", "other")}
        # Host seconds per dispatched op, accumulated by the dispatch mode (``observe.make_mode``): the op itself
        # (``op_s``: PyTorch's dispatch below the mode and the kernel launch) and the runtime after it
        # (``after_op_s``: observation + the launch hook, whose own split is the backend's ``host_time``).
        self.ops = 0
        self.op_s = 0.0
        self.after_op_s = 0.0
        self._t_iter = time.perf_counter()
        self._t0 = self._t_iter
        self._t_window = 0.0  # when the policy's window was last sampled
        self._lock = threading.RLock()
        self._mode = None
        self._hooks: list = []
        self._stopped = False
        self.builder = None
        if cfg.trace:
            from ..trace.format import TraceBuilder
            self.builder = TraceBuilder({"source": "uvmprefetch live runtime", "backend": cfg.backend,
                                         "gpu": getattr(self.gpu, "name", ""), "durations": "estimated",
                                         "policy": self.policy.name})
            self.builder.iteration = 0
        self._alloc_seen = 0
        self.observer = "python"  # which observer sees the ops, and why the C++ one does not (when it does not)
        self.observer_why = ""
        self.native = None  # planner.NativeObservation while the C++ observer runs

    # -------------------------------------------------------------------------------------- lifecycle
    def start(self) -> "Session":
        """Start the C++ observer and the planner thread (or, where it cannot be used, enter the Python
        dispatcher mode on this thread), hook optimizer steps, write the report at exit.

        Raises
        ------
        ConfigError
            ``UVMPREFETCH_OBSERVER=native`` where the C++ observer cannot be used (the message says why).
        """
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        self._torch = torch
        self.active = True
        if not self._start_native():
            self._mode = make_mode(self)
            self._mode.__enter__()
        self._hooks = [register_optimizer_step_pre_hook(self._opt_pre),
                       register_optimizer_step_post_hook(self._opt_post)]
        atexit.register(self.stop)
        # A forked child (DataLoader worker) inherits the mode and this object: it must neither observe (its
        # ops are not the GPU's; CUDA calls fail after fork) nor write the parent's report at its exit.
        os.register_at_fork(after_in_child=self._forked)
        return self

    def _start_native(self) -> bool:
        """Start the C++ observer if it can be used here; say (once) why not where it cannot."""
        from .native import NativeBuildError
        choice = self.cfg.observer
        why = "UVMPREFETCH_OBSERVER=python" if choice == "python" else native_unsupported(self.cfg)
        if not why:
            from . import native_observer
            from .planner import NativeObservation
            try:
                lib = native_observer.load(say=self._say if self.cfg.log != "quiet" else None)
                self.native = NativeObservation(self, lib, self._dormant_ok).start()
                self.observer = "native"
                if self.cfg.log in ("info", "debug"):
                    self._say(f"observer: C++ (RecordFunction, built for torch {lib.torch_version}); planner "
                              + ("dormant until the live bytes reach half the capacity" if self.native.planner.dormant
                                 else "active"))
                return True
            except NativeBuildError as e:
                self.native = None
                why = str(e)
        if choice == "native":
            self.active = False
            raise ConfigError(f"UVMPREFETCH_OBSERVER=native: the C++ observer cannot be used here: {why}")
        self.observer_why = why
        fallback = getattr(self.backend, "observer_fallback", None)
        if choice != "python" and fallback is not None:
            fallback()
        if choice != "python" and self.cfg.log != "quiet":
            self._say(f"observer: Python dispatch mode (the C++ observer is unavailable: {why}); every op costs "
                      "tens of microseconds more on the training thread")
        return False

    @staticmethod
    def _say(msg: str) -> None:
        print(f"uvmprefetch: {msg}", file=sys.stderr, flush=True)

    def flush(self) -> None:
        """Wait until every op observed so far is planned (the C++ observer plans on its own thread)."""
        if self.native is not None:
            self.native.planner.flush()

    def _forked(self) -> None:
        self.active = False
        self._stopped = True
        self._report = None
        if self.native is not None:
            self.native.forked()

    def stop(self) -> dict:
        """Leave the mode, write the report (and trace); idempotent. Returns the report."""
        with self._lock:
            if self._stopped:
                return self._report
            self._stopped = True
        for h in self._hooks:
            h.remove()
        if self.native is not None:
            try:
                self.native.stop()  # the callbacks go, then what is left in the rings is planned
            except Exception as e:  # noqa: BLE001
                self._note_error("observer stop", e)
        settle = getattr(self.backend, "settle", None)  # moves still queued: made now, so a late error is reported
        if settle is not None and not self.degraded:
            try:
                settle()
            except Exception as e:  # noqa: BLE001 - the prefetcher never kills training
                self.fail(getattr(e, "where", "backend"), e)
        self.active = False
        if self._mode is not None:
            try:
                self._mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - another mode may sit above ours at exit; nothing to undo then
                pass
        from .report import build_report, write_outputs
        self._report = build_report(self)
        write_outputs(self, self._report)
        try:
            self.backend.close()
        except Exception as e:  # noqa: BLE001
            self._note_error("close", e)
        return self._report

    def fail(self, where: str, exc: BaseException) -> None:
        """A runtime error: say it once, stop prefetching, let the program go on."""
        self._note_error(where, exc)
        if not self.degraded:
            self.degraded = True
            self.active = False
            if self.native is not None:
                try:
                    self.native.halt()
                except Exception as e:  # noqa: BLE001
                    self._note_error("observer halt", e)
            rest = ("training continues on plain managed memory" if self.cfg.backend == "cuda"
                    else "the program continues unobserved")
            print(f"uvmprefetch: {where} failed ({type(exc).__name__}: {exc}); the prefetcher is off for the rest "
                  f"of this run, {rest}", file=sys.stderr)

    def _note_error(self, where: str, exc: BaseException) -> None:
        self.errors.append(f"{where}: {type(exc).__name__}: {exc}")
        if self.cfg.log == "debug":
            log.exception("uvmprefetch %s failed", where, exc_info=exc)

    # -------------------------------------------------------------------------------------- hooks
    def _opt_pre(self, opt, args, kwargs) -> None:
        self.in_optimizer = True
        if self.native is not None:
            self.native.optimizer(True)

    def _opt_post(self, opt, args, kwargs) -> None:
        self.in_optimizer = False
        if self.native is not None:
            self.native.optimizer(False)  # a mark in the op stream: the planner ends the iteration in order
            return
        if not self.iter_ends.step() or not self.active:
            return
        with self._lock:
            self._end_iteration()

    def step_done(self, t: float) -> None:
        """The planner reached an optimizer step's end (hooked at ``t``, perf_counter seconds); lock held."""
        if self.iter_ends.step() and self.active:
            self._end_iteration(t)

    def _end_iteration(self, now: float | None = None) -> None:
        """The iteration ended (after its last launch): tell the backend (and through it the policy), count it."""
        try:
            self._drain_frees()
            self.backend.end_iteration(self.iteration)
            now = time.perf_counter() if now is None else now
            self._monitor_tick()
            self.iter_wall.append(now - self._t_iter)
            self._t_iter = now
            self.iteration += 1
            if self.builder is not None:
                self.builder.iteration = self.iteration
        except Exception as e:  # noqa: BLE001
            self.fail("end of iteration", e)

    def _monitor_tick(self) -> None:
        """One iteration's monitor (late prefetches, faults, prefetched blocks evicted unused), from the backend's
        cumulative counts."""
        mon = getattr(self.backend, "monitor", None)
        if mon is None:
            return
        now = mon()
        prev, self._monitor_prev = self._monitor_prev, now
        self.monitor.append({k: (v - prev.get(k, 0) if isinstance(v, int) and isinstance(prev.get(k, 0), int) else v)
                             for k, v in now.items()})

    def _drain_frees(self) -> None:
        died, freed = self.tracker.drain_dead()
        if self.builder is not None:
            for s in died:
                if s.id < self._alloc_seen:
                    self.builder.free(s.id)
        if freed:
            self.backend.free(np.asarray(sorted(freed), dtype=np.int64))

    def on_op(self, func, args, kwargs, out, backward: bool) -> None:
        """One kernel-launching op ran (called by the Python dispatcher mode: the fallback observer).

        One flat walk of the arguments gives the accesses and the shape key (``scan_op``); execution ids and
        shape-only FLOP counts are memoised per (op, shapes). The C++ observer hands the planner the same facts
        (``planner.py``), which then calls ``launch`` as this does.
        """
        with self._lock:
            if not self.active:
                return
            if self.tracker.dead:
                self._drain_frees()
            acc, key, ckey = scan_op(func, args, kwargs, out, self.device_type)
            if not acc:
                return
            phase = "optimizer" if self.in_optimizer else "backward" if backward else "forward"
            if phase == "optimizer" and all(t.dim() == 0 for t, _ in acc):
                return  # AdamW's step counters: host work in a GPU run (as the recorder counts it)
            lookup = self.tracker.lookup
            accesses: dict = {}  # (storage, offset, length) -> mode: in-place ops name a range twice
            for t, mode in acc:
                s = lookup(t.untyped_storage())
                if s is None:
                    continue
                if self.builder is not None and s.id == self._alloc_seen:  # ids follow first-sight order
                    self._note_alloc(s, isinstance(t, self._torch.nn.Parameter), self.in_optimizer)
                if t.is_contiguous():  # tensor_extent's answer without the call and the stride walk
                    es = t.element_size()
                    off, length = t.storage_offset() * es, t.numel() * es
                else:
                    off, length = tensor_extent(t)
                length = min(length, s.nbytes - off)
                if length <= 0:
                    continue
                k = (s, off, length)
                accesses[k] = accesses.get(k, 0) | mode
            name = func.name()
            flops = cached_flops(func, args, kwargs, out, ckey)
            dtype = "fp32"
            if flops:
                dtype = next((_DTYPE_NAMES.get(str(t.dtype), "fp32") for t, _ in acc if t.is_floating_point()), "fp32")
            self.launch(name, cached_exec_id(name, key, ckey), phase, accesses, flops, dtype)

    def _note_alloc(self, s, param: bool, optimizer: bool) -> None:
        """The trace's allocation for storage ``s``, seen for the first time (ids follow first-sight order)."""
        kind = "param" if param else "optimizer" if optimizer else "activation"
        self.builder.alloc(s.nbytes, kind)
        self._alloc_seen += 1

    def launch(self, name: str, exec_id: int, phase: str, accesses: dict, flops: float, dtype: str,
               infer: bool = True) -> None:
        """One launch with its ``accesses`` ({(Storage, offset, length): mode}) to the backend, the trace and the
        counts; the caller holds the lock. Each distinct byte range becomes block ids once. ``infer``: the launch
        may end an iteration by its phase (runtime/iterations.py)."""
        if infer and self.iter_ends.ends_before(phase):  # no torch.optim step seen (runtime/iterations.py)
            self._end_iteration()
            if not self.active:
                return
        spans = [(s.base + off, ln, m) for (s, off, ln), m in accesses.items()]
        b, w = self._launch_blocks(spans)
        nid = self.names.get(name)
        if nid is None:
            nid = self.names[name] = len(self.names)
        self.phase_launches[phase] += 1
        nbytes = sum(ln * (2 if m == READ | WRITE else 1) for _, ln, m in spans)
        builder = self.builder
        if flops and builder is not None:
            # as the recorder does: a replay on another profile re-estimates from FLOPs in this dtype
            # (without it every bf16 matmul of a live trace counted as fp32)
            builder.note_flop_dtype(dtype)
        duration = self._estimate(flops, nbytes, dtype) if self._estimate is not None else 0.0
        info = LaunchInfo(index=self.index, exec_id=exec_id, name=nid, phase=PHASE[phase], iteration=self.iteration,
                          duration=duration, blocks=b, write_blocks=w)
        self.backend.launch(info)
        if builder is not None:
            builder.launch(name, [(s.id, off, ln, m) for (s, off, ln), m in accesses.items()], duration=duration,
                           flops=flops, nbytes=nbytes, exec_id=exec_id, phase=phase, iteration=self.iteration)
        self.index += 1
        if self.index % 64 == 0:
            now = time.perf_counter()
            if now - self._t_window >= 0.05:  # the policy's report sums its tables: ~10 us per launch every 64
                self._t_window = now
                self._sample_window()

    def _blocks_by_range(self, spans: list) -> tuple[np.ndarray, np.ndarray]:
        """``launch_blocks`` for a backend without one: its ``block_ids`` per span, in span order (the cuda
        backend numbers blocks in first-sight order)."""
        block_ids = self.backend.block_ids
        rs = [(block_ids(st, ln), m) for st, ln, m in spans]
        return _union([r for r, _ in rs]), _union([r for r, m in rs if m & WRITE])

    def _sample_window(self) -> None:
        try:
            rep = self.policy.report()
        except Exception:  # noqa: BLE001
            return
        w = rep.get("window") if isinstance(rep, dict) else None
        if isinstance(w, (int, float)) and (not self.window_log or self.window_log[-1][1] != float(w)):
            self.window_log.append((self.index, float(w)))  # changes only: the report stays small
