"""decide (live, native observer): the planner thread.

With the C++ observer (``native_observer.py``) the training thread only runs the RecordFunction callback, which
pushes each op's records into a ring. This thread drains that ring and the allocator's event ring in batches,
merges them in the order they happened (one process-wide sequence number),
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

**Turns: the planner gets the GIL when it asks, the training thread waits a bounded share.** Planning a launch
is Python (the policy's kernels are Numba without the GIL; the bookkeeping, and for dryrun the simulated GPU,
are not): tens of microseconds against a few for a small CPU op. A training loop of small ops lets the GIL go
and takes it back around every op and nearly always wins the race for it, so a planner that simply competes
waits milliseconds after every call that released the GIL (the policy's kernels included), plans next to
nothing, and each hand-over it does win costs both threads a wait for the scheduler. So the planner asks the
observer for a turn (``uvmobs_turn_wait``): while the turn is set, the training thread parks in the callbacks,
where it holds no GIL; the call lets the GIL go and returns once the training thread is parked (or after
``_TURN_WAIT_US``), so the planner, not a training thread just back from an op, takes the GIL next; it then plans for ``UVMPREFETCH_PLANNER_SLICE_MS`` (1 ms), gives the turn
back and, if the training thread was parked waiting for it, rests without the GIL long enough to keep the
training thread's wait at ``UVMPREFETCH_PLANNER_SHARE`` of its time (0.1). A training thread that waits for the
GPU or runs long ops never parks: the planner then plans on without resting. The report has the training
thread's parks and parked seconds (``training_parks``, ``training_parked_s``). The planner's short calls into
the library (drains, counters) keep the GIL (``ObserverLib.held``).

**Lag and shedding.** Launches are planned in order, late when the planner lags: its decisions then apply to
launches after the ones they were made for (the policy predicts ahead). When more than
``UVMPREFETCH_PLANNER_LAG`` launches (4096) wait to be planned, the planner switches the observer off (the
callback disabled, as when dormant: the training thread pays nothing per op) until it has planned what it
holds, then on again: the launches of that window are never seen (``shed_windows``, ``shed_s`` in the report)
and the backend is told its knowledge has a gap. The allocator's events keep flowing meanwhile, so tensor
deaths stay exact, and a callback without inputs stays on for the turns (the dispatcher boxes nothing for it).
With a backlog the planner converts ``_CHUNK`` launches of records to Python at a time, so a burst's cost does
not grow with the lag. A trace (``UVMPREFETCH_TRACE``) needs every launch: it never sheds.

**Gaps.** A full ring drops records and counts them; when the counts grow, the planner tells the backend that
its knowledge has a gap (``backend.gap()``: no block counted dead before it may be discarded after it).

Errors: anything raised here goes to ``Session.fail("planner", ...)`` (one line, the runtime switches off,
training goes on); an error inside the observer's callback switches the observer off and reaches
``Session.fail("observer", ...)`` from here.
"""

from __future__ import annotations

import collections
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


def _knob(name: str, default: float, lo: float, hi: float) -> float:
    """An internal tuning variable (docs/runtime.md §6 "Internal"), within [lo, hi].

    Raises
    ------
    ConfigError
        Not a number or out of range (the message names the variable).
    """
    from ..errors import ConfigError
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not lo <= v <= hi:
        raise ConfigError(f"{name}={raw!r}: expected a number from {lo:g} to {hi:g}")
    return v


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

    Raises
    ------
    ConfigError
        A pacing variable (``UVMPREFETCH_PLANNER_SLICE_MS``, ``_SHARE``, ``_LAG``) has a bad value.
    """

    def __init__(self, session, lib, pressure_bytes: int, managed_bytes=None) -> None:
        self.s = session
        self.lib = lib
        self.pressure_bytes = int(pressure_bytes)
        self.managed_bytes = managed_bytes
        self.dormant = self.pressure_bytes > 0
        self._dropped = (lib.counters()["dropped"], lib.alloc_stats()["dropped"])
        self._parked0 = lib.parked()  # per process: this session's are the growth
        self.woke_at: dict | None = None
        self.batches = 0
        self.records = 0
        self.gaps = 0
        self.busy_s = 0.0
        self.done_seq = 0  # the newest op or mark planned
        self.slice_s = _knob("UVMPREFETCH_PLANNER_SLICE_MS", 1.0, 0.05, 1000.0) / 1e3
        share = _knob("UVMPREFETCH_PLANNER_SHARE", 0.1, 0.01, 1.0)
        self.rest_factor = (1.0 - share) / share
        lag = int(_knob("UVMPREFETCH_PLANNER_LAG", 4096, 0, 1 << 30))
        self.max_lag = 0 if session.cfg.trace else lag  # 0: never shed
        self.rests = 0
        self.shedding = False
        self.shed_windows = 0
        self.shed_s = 0.0
        self._shed_t0 = 0.0
        self._seq_seen = 0
        self._segs: collections.deque = collections.deque()  # [records, head indices, next head] not planned yet
        self._waiting = 0  # op launches in them
        self._events = np.zeros(0, dtype=no.ALLOC_DTYPE)  # allocator events not applied yet, in sequence order
        self._fed = 0  # how many of them the copy path's book has (_to_copy_book)
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
                self._batch(final=True)
            except Exception as e:  # noqa: BLE001 - the prefetcher never kills training
                self.s.fail(getattr(e, "where", "planner"), e)
        if self.shedding:
            self.shedding = False
            self.shed_s += time.perf_counter() - self._shed_t0
            self.lib.lib.uvmobs_set_light(0)

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
                if not self._queued():
                    time.sleep(0.0005)  # nothing queued: the training thread has the GIL to itself
                    continue
                # (the GIL goes while the call waits for the training thread to park at its next op, so that it
                # comes back to this thread, not to one that would then wait for the whole burst in the GIL)
                self.lib.lib.uvmobs_turn_wait(_TURN_WAIT_US)
                parked = 0
                try:
                    t0 = time.perf_counter()
                    self._batch(until=t0 + self.slice_s)
                finally:
                    parked = self.lib.held.uvmobs_turn(0)
                self._rest(time.perf_counter() - t0, bool(parked))
                if not self.s.active:
                    return
        except Exception as e:  # noqa: BLE001 - the prefetcher never kills training
            self.s.fail(getattr(e, "where", "planner"), e)

    def _queued(self) -> bool:
        """Anything to plan: records pending, or the record sequence moved since the planner last looked."""
        seq = self.lib.held.uvmobs_seq()
        moved, self._seq_seen = seq != self._seq_seen, seq
        return moved or bool(self._segs) or bool(len(self._events)) or bool(len(self._op_carry))

    def _rest(self, wall: float, parked: bool) -> None:
        """After a burst of ``wall`` seconds: if the training thread was parked waiting for it (it was issuing ops
        and wanted to go on), let it run without us long enough to keep its wait at the share. A training thread
        that waits for the GPU or runs long ops is not parked: no rest, plan on."""
        if parked:
            self.rests += 1
            # (a first burst that loads the policy's kernels parks the training thread for long: capped)
            time.sleep(min(wall, 4 * self.slice_s) * self.rest_factor)

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

    def _batch(self, until: float | None = None, final: bool = False) -> bool:
        """Drain both rings into the pending records, then plan them in order until ``until`` (perf_counter
        seconds; None: all of them). False when nothing was pending."""
        new_ops = self._whole_runs(self.lib.drain_ops())
        new_ev = self._drain_allocs()
        if self.lib.state() == no.STATE_FAILED:
            self.s.fail("observer", RuntimeError(self.lib.error() or "failed"))
            return False
        if len(new_ops):
            self.push_ops(new_ops)
        if len(new_ev):
            ev = np.concatenate([self._events, new_ev]) if len(self._events) else new_ev
            self._events = ev if _sorted(ev["seq"]) else ev[np.argsort(ev["seq"], kind="stable")]
        if not self._segs and not len(self._events):
            return bool(len(self._op_carry))
        t0 = time.perf_counter()
        with self.s._lock:
            if self.s.active:
                self._check_gaps()
                self._plan(until)
                if not self._segs and (final or self.lib.state() != no.STATE_ACTIVE):
                    self._apply_events(len(self._events))  # no op can come before them any more
                if not final:
                    self._shed()
        self.busy_s += time.perf_counter() - t0
        self.batches += 1
        self.records += len(new_ops) + len(new_ev)
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
            self._gap()

    def _gap(self) -> None:
        self.gaps += 1
        gap = getattr(self.s.backend, "gap", None)
        if gap is not None:
            gap()

    def _shed(self) -> None:
        """Switch the observer off while more than ``max_lag`` launches wait, on again once they are planned."""
        if self.dormant or not self.max_lag or self._stop.is_set():
            return
        waiting = self._waiting
        if not self.shedding and waiting > self.max_lag:
            if self.lib.set_active(False) == no.STATE_DORMANT:
                self.lib.lib.uvmobs_set_light(1)  # the turns still need the training thread to pass a callback
                self.shedding = True
                self.shed_windows += 1
                self._shed_t0 = time.perf_counter()
        elif self.shedding and waiting == 0:
            self._gap()  # the launches of the window were never seen
            self.shedding = False
            self.shed_s += time.perf_counter() - self._shed_t0
            self.lib.lib.uvmobs_set_light(0)
            if self.lib.set_active(True) != no.STATE_ACTIVE:
                raise RuntimeError(f"the observer did not switch back on: {self.lib.error() or 'failed'}")

    # ------------------------------------------------------------------------------------------ planning
    def push_ops(self, ops: np.ndarray) -> None:
        """Queue whole op runs (and marks) for planning, in sequence order."""
        ops = _in_order(ops)
        heads = _heads(ops)
        if heads.size:
            self._segs.append([ops, heads, 0])
            self._waiting += int(np.count_nonzero((ops["c"][heads] >> np.uint64(56)) == no.HEAD))

    def _plan(self, until: float | None) -> None:
        """Plan the queued ops (and apply the allocator events older than each) in sequence order until ``until``
        (None: all). Allocator events newer than the newest queued op wait for the next one (an op is pushed after
        its outputs' allocations, so an event older than an op is always drained with or before it)."""
        while self._segs and self.s.active:
            seg = self._segs[0]
            more = self._plan_chunk(seg, until)
            if seg[2] >= len(seg[1]):
                self._segs.popleft()
            if not more:
                return

    def _plan_chunk(self, seg: list, until: float | None) -> bool:
        """Plan up to ``_CHUNK`` heads of ``seg`` (records, heads, next head); False when ``until`` passed."""
        all_ops, all_heads, pos = seg
        stop = min(pos + _CHUNK, len(all_heads))
        lo = int(all_heads[pos])
        ops = all_ops[lo:int(all_heads[stop]) if stop < len(all_heads) else len(all_ops)]
        hl = (all_heads[pos:stop] - lo).tolist()
        ev = self._events
        if self._feed_allocs is not None and len(ev):  # the copy path's book: the events up to this chunk's last op
            k = _upto(ev, 0, int(ops["a"][hl[-1]])) if hl else len(ev)
            self._to_copy_book(ev, k, keep=True)
        ev_seq: list = []
        ev_addr: list = []
        ev_kill: list = []
        j, m, tgt = 0, 0, -1  # events applied; converted to lists (a prefix: those before the op seq ``tgt``)
        kill, live, deaths, session = self.s.tracker.kill, self.s.tracker.live, self._deaths, self.s
        a, b, c, d = (ops[k].tolist() for k in "abcd")
        f = ops["a"].view("<f8").tolist()
        clock = time.perf_counter
        done, more = len(hl), True
        for n, i in enumerate(hl):
            seq = a[i]
            if j == m and m < len(ev) and seq > tgt:  # (the next heads' worth: those an op of this chunk can apply)
                tgt = a[hl[min(n + 64, len(hl) - 1)]]
                m2 = _upto(ev, m, tgt)
                part = ev[m:m2]
                ev_seq += part["seq"].tolist()
                ev_addr += part["addr"].tolist()
                act = part["action"] & 0xFF  # (without the private-pool flag)
                ev_kill += ((act == no.FREE_COMPLETED) | (act == no.ALLOC)).tolist()
                m = m2
            while j < m and ev_seq[j] < seq:
                if ev_kill[j] and ev_addr[j] in live:  # a FREE, or an ALLOC over a live storage: a free not seen
                    kill(ev_addr[j])
                j += 1
            if deaths is not None:
                deaths(seq)
            if c[i] >> 56 == _MARK:
                self._mark(c[i] & 0xFFFFFFFF, b[i])
            else:
                self._waiting -= 1
                self._op(a, b, c, d, f, i)
            if seq > self.done_seq:
                self.done_seq = seq
            if not session.active:
                done, more = n + 1, False
                break
            if until is not None and clock() >= until:
                done, more = n + 1, False
                break
        self._events = ev[j:]
        self._fed = max(0, self._fed - j)
        seg[2] = pos + done
        return more

    def _apply_events(self, k: int) -> None:
        """Apply the first ``k`` pending allocator events: a FREE (or an ALLOC over a live storage: a missed free)
        queues the storage at that address dead. Allocator events between two op records reach the planner's
        books here and in ``_plan``; the cuda backend's allocator tracker feeds the same ring."""
        ev, self._events = self._events[:k], self._events[k:]
        self._to_copy_book(ev, k)
        kill = self.s.tracker.kill
        act = ev["action"] & 0xFF
        for addr in ev["addr"][(act == no.FREE_COMPLETED) | (act == no.ALLOC)].tolist():
            kill(addr)

    def _to_copy_book(self, ev: np.ndarray, k: int, keep: bool = False) -> None:
        """Hand the first ``k`` pending allocator events (those not handed over yet) to the cuda backend's copy path
        book (``allocator_events``), which applies them up to the op it plans; ``keep``: they stay pending here."""
        if self._feed_allocs is not None and k > self._fed:
            self._feed_allocs(ev[self._fed:k])
            self._fed = k
        if not keep:
            self._fed = max(0, self._fed - k)

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
        tracker = s.tracker
        live, at = tracker.live, tracker.at
        builder = s.builder
        accesses: dict = {}
        for j in range(i + 2, i + 2 + n):
            st = live.get(a[j])
            if st is None or st.nbytes != d[j]:  # (``at``'s own first test, without the call for a known storage)
                st = at(a[j], d[j])
            if builder is not None and st.id == s._alloc_seen:
                s._note_alloc(st, bool((c[j] >> 52) & no.LEAF_GRAD), phase == "optimizer")
            k = (st, b[j], c[j] & _LEN_MASK)
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
        parks, ns = self.lib.parked()
        return {"dormant": self.dormant, "woke": self.woke_at, "pressure_bytes": self.pressure_bytes,
                "batches": self.batches, "records": self.records, "gaps": self.gaps,
                "busy_s": round(self.busy_s, 6), "rests": self.rests, "max_lag": self.max_lag,
                "shed_windows": self.shed_windows, "shed_s": round(self.shed_s, 6),
                "training_parks": parks - self._parked0[0], "training_parked_s": round((ns - self._parked0[1]) / 1e9, 6)}


_TURN_WAIT_US = 300  # how long a turn waits for the training thread to park (a few of its small ops)
_LEN_MASK, _MARK = no.LEN_MASK, no.MARK
_CHUNK = 256  # launches converted to Python lists per burst (a burst plans tens of them)


def _heads(ops: np.ndarray) -> np.ndarray:
    """Indices of the op heads and marks in a drained batch (each op's run is contiguous)."""
    kind = ops["c"] >> np.uint64(56)
    return np.flatnonzero((kind == no.HEAD) | (kind == no.MARK))


def _in_order(ops: np.ndarray) -> np.ndarray:
    """The runs of ``ops`` in sequence order (two threads may publish out of order): whole runs moved."""
    heads = _heads(ops)
    seqs = ops["a"][heads]
    if _sorted(seqs):
        return ops
    lengths, order = np.diff(np.append(heads, len(ops))), np.argsort(seqs, kind="stable")
    starts, lens = heads[order], lengths[order]
    idx = np.repeat(starts - np.cumsum(np.append(0, lens[:-1])), lens) + np.arange(int(lens.sum()))
    return ops[idx]


def _upto(ev: np.ndarray, lo: int, seq: int) -> int:
    """The count of events ``ev`` (sorted by seq, the first ``lo`` before ``seq``) before ``seq``: galloping, as
    ``np.searchsorted`` copies a strided field whole (a long backlog made each call O(n))."""
    hi, step, n = lo, 256, len(ev)
    while hi + step < n and ev["seq"][hi + step] < seq:
        hi, step = hi + step, step * 2
    return hi + int(np.searchsorted(ev["seq"][hi:min(hi + step + 1, n)], seq))


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
        self.lib.held.uvmobs_set_optimizer(int(on))
        if not on:
            self.lib.held.uvmobs_mark(no.MARK_OPT_POST, time.perf_counter_ns())

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
