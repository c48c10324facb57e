"""decide (live, native observer): the planner thread.

With the C++ observer (``native_observer.py``) the training thread only runs the RecordFunction callback, which
pushes each op's records into a ring. This thread drains that ring and the allocator's event ring in batches
(the drain calls release the GIL), merges them in the order they happened (one process-wide sequence number),
and does what the Python observer does on the training thread: storage addresses (and, for dryrun, the
simulated GPU's address space), tensor deaths, iteration ends, the policy's hooks and the backend (the
simulated GPU for dryrun; the books and the mover's queue for cuda), the report's counts and the trace.

**Dormant when nothing needs to move.** Until the live bytes reach half the capacity (dryrun: the CPU
allocator's count, kept in C++; cuda: the shim's managed bytes), the observer's callback is disabled (the
dispatcher runs no RecordFunction for it) and this thread only waits, without the GIL, for the allocator to say
that the threshold was crossed; then it switches the observer on and starts planning. A run whose model fits
never leaves that state: the training thread pays nothing per op (dryrun: the allocator wrapper's bookkeeping
per allocation), and the report counts iterations but no launches. (``UVMPREFETCH_TRACE`` keeps it awake: a
trace needs every launch.)

**Gaps.** A full ring drops records and counts them; when the counts grow, the planner tells the backend that
its knowledge has a gap (``backend.gap()``: no block counted dead before it may be discarded after it).

Errors: anything raised here goes to ``Session.fail("planner", ...)`` (one line, the runtime switches off,
training goes on); an error inside the observer's callback switches the observer off and reaches
``Session.fail("observer", ...)`` from here.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from . import native_observer as no

PHASE_NAMES = ("forward", "backward", "optimizer")  # kernels/uvmobs.h Phase
DTYPES = ("fp32", "bf16", "fp16")  # kernels/observer.cpp dtype_code


def _fail_after(what: str) -> int:
    """Tests: ``UVMPREFETCH_TEST_FAIL=<what>[:N]`` makes ``what`` fail after N launches (default 20); -1: off."""
    spec = os.environ.get("UVMPREFETCH_TEST_FAIL", "")
    name, _, n = spec.partition(":")
    if name != what:
        return -1
    return int(n) if n.isdigit() else 20


class Planner:
    """Drains the observer's rings and drives ``session`` from a thread of its own (see the module docstring).

    Parameters
    ----------
    session
        The ``Session`` (its ``launch``, tracker, backend, lock and counts are used from this thread).
    lib
        The loaded ``ObserverLib``.
    pressure_bytes
        Live bytes from which there is something to plan; ``0``: never dormant.
    managed_bytes
        cuda: a callable returning the managed bytes now (the shim's count); ``None`` for dryrun (the CPU
        allocator's count, waited on in C++).
    """

    def __init__(self, session, lib, pressure_bytes: int, managed_bytes=None) -> None:
        self.s = session
        self.lib = lib
        self.pressure_bytes = int(pressure_bytes)
        self.managed_bytes = managed_bytes
        self.dormant = self.pressure_bytes > 0
        self._dropped = (lib.counters()["dropped"], lib.alloc_stats()["dropped"])
        self.woke_at: dict | None = None
        self.batches = 0
        self.records = 0
        self.gaps = 0
        self.busy_s = 0.0
        self.done_seq = 0  # the newest op or mark planned
        self.slice_s = float(os.environ.get("UVMPREFETCH_PLANNER_SLICE_MS", "2")) / 1e3
        self._held_since = 0.0
        self._carry = np.zeros(0, dtype=no.ALLOC_DTYPE)  # allocator events newer than the batch's newest op
        self._op_carry = np.zeros(0, dtype=no.OP_DTYPE)  # the start of a run still being written
        self._stop = threading.Event()
        self._fail_after = _fail_after("planner")
        self._note_seq = getattr(session.backend, "note_seq", None)
        self._note_gate = getattr(session.backend, "note_gate", None)
        # cuda: the caching allocator's events (alloc_feed.py): merged with the ops below; their deaths reach the
        # backend right before the first op numbered after them
        self._feed = getattr(session.backend, "feed", None)
        self._deaths = getattr(session.backend, "deaths_before", None) if self._feed is not None else None
        self._feed_allocs = getattr(session.backend, "allocator_events", None)  # the copy path's book (cuda)
        self._thread = threading.Thread(target=self._run, name="uvmprefetch-planner", daemon=True)

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> "Planner":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then plan what is left in the rings (the caller's thread, the observer stopped)."""
        self._stop.set()
        self.lib.lib.uvmalloc_wake()
        self._thread.join(timeout=60)
        if self.s.active:
            try:
                self._batch()
            except Exception as e:  # noqa: BLE001 - the prefetcher never kills training
                self.s.fail(getattr(e, "where", "planner"), e)

    # ------------------------------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            init = getattr(self.s.backend, "thread_init", None)
            if init is not None:
                init()
            while not self._stop.is_set():
                if self.dormant:
                    if self._pressure():
                        self._wake()
                    self._batch()  # optimizer-step marks come while dormant too: iterations are counted
                    continue
                if not self._batch():
                    time.sleep(0.0005)  # nothing queued: let the training thread have the GIL
                if not self.s.active:
                    return
        except Exception as e:  # noqa: BLE001 - the prefetcher never kills training
            self.s.fail(getattr(e, "where", "planner"), e)

    def _pressure(self) -> bool:
        """Wait up to 200 ms (dryrun) for the live bytes to reach the threshold (no GIL held while waiting)."""
        if self.managed_bytes is None:
            return bool(self.lib.lib.uvmalloc_wait_pressure(self.pressure_bytes, 200)) and not self._stop.is_set()
        if self.managed_bytes() >= self.pressure_bytes:
            return True
        self._stop.wait(0.02)
        return False

    def _wake(self) -> None:
        s = self.s
        with s._lock:
            if not s.active:
                return
            self.lib.lib.uvmalloc_set_events(1)
            if self.lib.set_active(True) != no.STATE_ACTIVE:
                raise RuntimeError(f"the observer did not switch to full records: {self.lib.error() or 'failed'}")
            self.dormant = False
            self.woke_at = {"iteration": s.iteration, "t_s": round(time.perf_counter() - s._t0, 6),
                            "live_bytes": self.lib.alloc_stats()["live_bytes"] if self.managed_bytes is None
                            else int(self.managed_bytes())}

    def _batch(self) -> bool:
        """Drain and plan one batch; False when both rings were empty."""
        ops = self._whole_runs(self.lib.drain_ops())
        allocs = self._drain_allocs()
        if self.lib.state() == no.STATE_FAILED:
            self.s.fail("observer", RuntimeError(self.lib.error() or "failed"))
            return False
        if not len(ops) and not len(allocs) and not len(self._carry):
            return bool(len(self._op_carry))
        t0 = self._held_since = time.perf_counter()
        with self.s._lock:
            if self.s.active:
                self._check_gaps()
                self._plan(ops, allocs)
        self.busy_s += time.perf_counter() - t0
        self.batches += 1
        self.records += len(ops) + len(allocs)
        return True

    def _drain_allocs(self) -> np.ndarray:
        """The allocator events since the last batch: the CPU allocator's (dryrun) and the CUDA caching allocator's
        (cuda, fed to the backend's liveness as they are drained)."""
        allocs = self.lib.drain_allocs()
        if self._feed is None:
            return allocs
        cuda = self._feed.take_events()
        if self.dormant:
            self._deaths(1 << 62)  # (no op to order them by while dormant: none is recorded; hand them out now)
        return cuda if not len(allocs) else np.concatenate([allocs, cuda]) if len(cuda) else allocs

    def _whole_runs(self, ops: np.ndarray) -> np.ndarray:
        """The drained records up to the last whole op run; a run whose producer was still writing its last
        records when the drain stopped is kept for the next batch (runs are contiguous, so only the last one
        can be cut)."""
        if len(self._op_carry):
            ops = np.concatenate([self._op_carry, ops])
        heads = _heads(ops)
        if heads.size:
            last = int(heads[-1])
            kind = int(ops["c"][last]) >> 56
            if kind == no.HEAD and last + 2 + int(ops["d"][last]) > len(ops):
                self._op_carry = ops[last:].copy()
                return ops[:last]
        self._op_carry = ops[:0]
        return ops

    def _check_gaps(self) -> None:
        c, a = self.lib.counters()["dropped"], self.lib.alloc_stats()["dropped"]
        if (c, a) != self._dropped:
            self._dropped = (c, a)
            self.gaps += 1
            gap = getattr(self.s.backend, "gap", None)
            if gap is not None:
                gap()

    # ------------------------------------------------------------------------------------------ planning
    def _plan(self, ops: np.ndarray, allocs: np.ndarray) -> None:
        """Apply allocator events and ops in sequence order. Allocator events newer than the newest op of the
        batch wait for the next one (an op is pushed after its outputs' allocations, so an event older than an
        op is always drained with or before it)."""
        events = np.concatenate([self._carry, allocs]) if len(self._carry) else allocs
        if len(events) > 1:
            events = events[np.argsort(events["seq"], kind="stable")]
        heads = _heads(ops)
        last = int(ops["a"][heads[-1]]) if heads.size else None
        if last is not None and len(events):
            cut = int(np.searchsorted(events["seq"], last))
            self._carry, events = events[cut:].copy(), events[:cut]
        else:
            self._carry = events[:0]
        if self._feed_allocs is not None and len(events):
            self._feed_allocs(events)
        ev_seq, ev_addr = events["seq"].tolist(), events["addr"].tolist()
        ev_act = (events["action"] & 0xFF).tolist()  # (without the private-pool flag)
        j = 0
        tracker = self.s.tracker
        a, b, c, d = (ops[k].tolist() for k in "abcd")
        f = ops["a"].view("<f8").tolist()
        order = heads if _sorted(ops["a"][heads]) else heads[np.argsort(ops["a"][heads], kind="stable")]
        for i in order.tolist():
            seq = a[i]
            while j < len(ev_seq) and ev_seq[j] < seq:
                if ev_act[j] == no.FREE_COMPLETED or ev_act[j] == no.ALLOC:  # an ALLOC over a live one: a missed free
                    tracker.kill(ev_addr[j])
                j += 1
            if self._deaths is not None:
                self._deaths(seq)
            kind = c[i] >> 56
            if kind == no.MARK:
                self._mark(c[i] & 0xFFFFFFFF, b[i])
                continue
            self._op(a, b, c, d, f, i)
            if not self.s.active:
                return
            now = time.perf_counter()
            if now - self._held_since > self.slice_s:
                # A training thread that ran an op in C++ (GIL released) waits for the GIL to come back; Python
                # hands it over only every switch interval (5 ms) unless the holder lets go. Letting go every
                # slice bounds that wait; the planner's own wait to get it back is the price.
                time.sleep(0)
                self._held_since = time.perf_counter()
        for k in range(j, len(ev_seq)):
            tracker.kill(ev_addr[k])
        if last is not None:
            self.done_seq = max(self.done_seq, last)

    def flush(self, timeout: float = 30.0) -> None:
        """Return once everything the observer published before this call is planned (tests, the end of a run)."""
        if self.dormant or not self._thread.is_alive():
            return
        seq = self.lib.lib.uvmobs_mark(0, 0)
        t_end = time.perf_counter() + timeout
        while self.done_seq < seq and self.s.active and not self.dormant and time.perf_counter() < t_end:
            time.sleep(0.001)

    def _mark(self, code: int, t_ns: int) -> None:
        if code == no.MARK_OPT_POST:
            self.s.step_done(t_ns / 1e9)

    def _op(self, a, b, c, d, f, i: int) -> None:
        s = self.s
        if s.tracker.dead:
            s._drain_frees()
        ng = (c[i] >> 40) & 0xFF  # GATE records, after the ranges (cuda)
        n = d[i] - ng
        if ng and self._note_gate is not None:
            gate = range(i + 2 + n, i + 2 + n + ng)
            self._note_gate([a[j] for j in gate if b[j] == 1], [a[j] for j in gate if b[j] == 2])
        phase = PHASE_NAMES[(c[i] >> 32) & 0xFF]
        at = s.tracker.at
        builder = s.builder
        accesses: dict = {}
        for j in range(i + 2, i + 2 + n):
            st = at(a[j], d[j])
            if builder is not None and st.id == s._alloc_seen:
                s._note_alloc(st, bool((c[j] >> 52) & no.LEAF_GRAD), phase == "optimizer")
            k = (st, b[j], c[j] & no.LEN_MASK)
            accesses[k] = accesses.get(k, 0) | ((c[j] >> 48) & 0xF)
        if self._note_seq is not None:
            self._note_seq(a[i])
        # A forward-phase op on another thread than the training loop's (a communication library's worker:
        # gloo's copies while FSDP2 all-gathers during the backward pass) says nothing about where iterations end.
        infer = phase != "forward" or not (c[i] >> 48) & 1
        s.launch(self.lib.op_name(c[i] & 0xFFFFFFFF), b[i], phase, accesses, f[i + 1], DTYPES[c[i + 1] & 0xFF],
                 infer=infer)
        if self._fail_after >= 0 and s.index >= self._fail_after:
            raise RuntimeError("injected planner failure (UVMPREFETCH_TEST_FAIL=planner)")

    def result(self) -> dict:
        return {"dormant": self.dormant, "woke": self.woke_at, "pressure_bytes": self.pressure_bytes,
                "batches": self.batches, "records": self.records, "gaps": self.gaps,
                "busy_s": round(self.busy_s, 6)}


def _heads(ops: np.ndarray) -> np.ndarray:
    """Indices of the op heads and marks in a drained batch (each op's run is contiguous)."""
    kind = ops["c"] >> np.uint64(56)
    return np.flatnonzero((kind == no.HEAD) | (kind == no.MARK))


def _sorted(x: np.ndarray) -> bool:
    return x.size < 2 or bool(np.all(x[1:] >= x[:-1]))


__all__ = ["Planner"]


class NativeObservation:
    """The C++ observer, the CPU allocator's events (dryrun) and the planner thread, for one session.

    Raises
    ------
    NativeBuildError
        At ``start``: the CPU allocator slot is held by another allocator (dryrun), or the observer did not
        start.
    """

    def __init__(self, session, lib, dormant_ok: bool = True) -> None:
        self.dormant_ok = dormant_ok
        self.s = session
        self.lib = lib
        self.planner: Planner | None = None
        self._base = lib.counters()  # the library's counters are per process: this session's are the growth

    def start(self) -> "NativeObservation":
        from .native import NativeBuildError
        s, lib = self.s, self.lib
        dryrun = bool(s.backend.virtual_addresses)
        if dryrun:
            rc = lib.lib.uvmalloc_install()
            if rc != 0:
                raise NativeBuildError("another CPU allocator with a higher priority is installed: the allocator's "
                                       "events (tensor deaths) cannot be seen" if rc == -1 else
                                       "c10 has no CPU allocator to wrap")
        cap = int(getattr(s.backend, "capacity_bytes", 0) or 0)
        pressure = 0 if s.cfg.trace or not self.dormant_ok else max(cap // 2, 1)
        managed = None if dryrun else (lambda: s.backend.shim.stats()["managed_bytes"])
        attach = getattr(s.backend, "attach_native", None)
        if attach is not None:
            attach(lib)
        lib.drain_ops()  # the rings are process-wide: what an earlier session left there is not this run's
        lib.drain_allocs()
        self.planner = Planner(s, lib, pressure, managed)
        lib.lib.uvmalloc_set_events(0 if self.planner.dormant else 1)
        lib.lib.uvmobs_set_optimizer(0)
        lib.lib.uvmobs_set_timing(1)
        lib.lib.uvmobs_test_fail_after(_fail_after("observer"))
        lib.start(s.device_type, active=not self.planner.dormant)
        self.planner.start()
        return self

    def optimizer(self, on: bool) -> None:
        self.lib.lib.uvmobs_set_optimizer(int(on))
        if not on:
            self.lib.lib.uvmobs_mark(no.MARK_OPT_POST, time.perf_counter_ns())

    def stop(self) -> None:
        """No more records (the callbacks go), plan what is left, give the allocator slot back."""
        self.lib.stop()
        if self.planner is not None:
            self.planner.stop()
        self.lib.lib.uvmalloc_set_events(0)
        self.lib.lib.uvmalloc_uninstall()

    def halt(self) -> None:
        """After a failure: the callbacks go at once (the planner thread ends by itself)."""
        self.lib.stop()
        self.lib.lib.uvmalloc_set_events(0)

    def forked(self) -> None:
        """In a forked child: observe nothing (lock-free: another thread may have held a lock at the fork)."""
        self.lib.lib.uvmobs_quiet()
        self.lib.lib.uvmalloc_set_events(0)

    def result(self) -> dict:
        c = {k: v - self._base.get(k, 0) for k, v in self.lib.counters().items()}
        out = {"observer": "native", "library": self.lib.path, "built_for_torch": self.lib.torch_version,
               "recorded": c["recorded"], "dropped_records": c["dropped"],
               "callback_s": round(c["callback_ns"] / 1e9, 6),
               "callback_us_per_launch": round(c["callback_ns"] / 1e3 / c["recorded"], 3) if c["recorded"] else None,
               "gate": {"late_blocks": c["gate_late"], "fault_blocks": c["gate_fault"], "waits": c["gate_waits"]},
               "allocator": self.lib.alloc_stats(),
               "note": "callback_s: host seconds inside the C++ callbacks on the training thread(s); while the planner "
                       "is dormant the callback is off (the dispatcher runs none) and no launch is counted"}
        if self.planner is not None:
            out["planner"] = self.planner.result()
        return out
