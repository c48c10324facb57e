"""The host threads that issue the launches and the moves, for the simulator's host clock (docs/simulator.md "Host
clock"): their model (``HostModel``), the named presets of ``--host``, and a launch on those clocks (``host_launch``).

Two shapes of runtime: decisions and moves on the training thread (``planner=False``, the synchronous runtime of
``live-sync``), or the runtime as built now (``live``): the training thread pays the C++ observer's callback per op,
a planner thread runs the policy on what the observer pushed (``planner=True``; its decisions take effect
``planner_lag`` launches later at the earliest, and only once the planner has had the time to make them), and a mover
thread issues the moves (``mover=True``: UVM's eviction holds the mover, not the training thread)."""

from __future__ import annotations

import collections
import dataclasses
import math
import time

from ..errors import ConfigError
from ..policy.base import Decision, LaunchInfo


@dataclasses.dataclass(frozen=True)
class HostModel:
    """The host thread that issues the launches (docs/simulator.md "Host clock"). All costs in seconds.

    ``launch_s``: per launch, outside the policy (framework dispatch, the runtime's observation);
    ``decision_s``: a fixed decision cost per launch; ``measure_decision``: add the policy's own ``on_launch``
    wall time on this machine times ``decision_scale`` (not reproducible run to run; for benchmarks);
    ``discard_block_s``: per block a decision discards; ``blocking_evict``: the host waits until the D2H engine has
    finished the write-backs its decision queued (the live cuda backend's synchronous eviction calls);
    ``sync_iterations``: at each iteration's end the host waits for the GPU to finish (a training loop that reads
    its loss, ``loss.item()``), so no lead the host built up in one iteration carries into the next.

    ``prefetch_block_s``: per block a decision's prefetches queue (``cudaMemPrefetchAsync`` to the GPU holds its
    caller while the driver maps the range). ``discard_call_s``: per discard call a decision issues (a batched discard
    of dead blocks: one call per decision that discards; with ``discard_block_s`` per block: discards of dead data
    move no bytes and cost their caller this).

    The runtime's threads (``live``): ``planner``: the decision (``decision_s``, the measured time) runs on a planner
    thread with a clock of its own; the training thread pays ``launch_s`` only. ``planner_lag``: the planner takes up
    launch ``i`` once the training thread has issued ``planner_lag`` more (it drains the observer's ring in batches)
    and it has finished decision ``i - 1``. ``mover``: the decision's calls (evictions, discards, copies) run on a
    mover thread, one decision after the other, instead of the training thread: with ``blocking_evict`` the mover
    waits for the UVM write-backs it queued. A decision is applied at the first launch the GPU reaches after its calls
    could start (planner done, mover free), never before its own launch.

    The copy path (``--evict copy|auto``; ``blocking_evict`` does not apply to it): ``copy_call_s`` per copy or
    repopulate call it issues for a decision (asynchronous: the issue cost only), ``copy_discard_call_s`` per discard
    call and ``copy_discard_block_s`` per block such a discard drops, and with ``discard_waits_for_copy`` the host
    waits until the copy-outs it queued have ended (a discard queued behind its copy-out that returns only when the
    copy is done).
    """

    launch_s: float = 0.0
    decision_s: float = 0.0
    measure_decision: bool = False
    decision_scale: float = 1.0
    discard_block_s: float = 0.0
    blocking_evict: bool = False
    sync_iterations: bool = False
    copy_call_s: float = 0.0
    copy_discard_call_s: float = 0.0
    copy_discard_block_s: float = 0.0
    discard_waits_for_copy: bool = False
    discard_call_s: float = 0.0
    prefetch_block_s: float = 0.0
    planner: bool = False
    planner_lag: int = 0
    mover: bool = False

    def __post_init__(self) -> None:
        for f in ("launch_s", "decision_s", "decision_scale", "discard_block_s", "copy_call_s",
                  "copy_discard_call_s", "copy_discard_block_s", "discard_call_s", "prefetch_block_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"host model: {f} must be a number >= 0, got {v!r}")
        if not (isinstance(self.planner_lag, int) and not isinstance(self.planner_lag, bool) and self.planner_lag >= 0):
            raise ConfigError(f"host model: planner_lag must be a whole number of launches >= 0, got "
                              f"{self.planner_lag!r}")
        if self.planner_lag and not self.planner:
            raise ConfigError("host model: planner_lag needs planner=true (decisions on a planner thread)")


# Named host models for the command line (``--host``); docs/simulator.md "Host clock" says where they come from.
HOST_PRESETS = {
    "free": None,  # the host never limits: launch i is issued the moment launch i-1 ends
    "none": None,  # (the same, its earlier name)
    # The synchronous runtime as it ran on the H100 and H200 (the GPU runs of bench/gpu/, bench/baselines/gpu.json):
    # decisions on the training thread (measured here, without Numba's compilation), its calls there too, and the
    # loss read at each iteration's end (bench/gpu/train_worker.py: ``loss.item()``). Measured on the H100:
    # - 480 us per launch for PyTorch's dispatch (10 us, assumed) and the Python observer (470 us:
    #   overhead/gpt2-medium/fits ``observe_us_per_launch``);
    # - evictions that hold the thread until their write-back ends (diagnose/*: ``evict_s_per_iter``);
    # - 65 us per block prefetched (diagnose/gpt2-large/uvmprefetch/1.5: ``prefetch_s_per_iter`` 2.345 s for
    #   69.9 GiB H2D, 35.8k blocks; 73 us at 2x; 53 us on the H200);
    # - discards that held the thread 159 us per block (9.82 s for 61 739 blocks, GPT-2 large at 1.5x).
    # The copy path's calls (that runtime had none): 5 us each, assumed until bench/gpu/evict_microbench.py has
    # measured ``evict/copy_out`` managed_to_pinned host_us at 2 MiB and ``evict/discard`` ranges host_per_call_us /
    # host_per_block_us and behind_copy.waits_for_copy.
    "live-sync": HostModel(launch_s=480e-6, measure_decision=True, blocking_evict=True, discard_block_s=159e-6,
                           prefetch_block_s=65e-6, sync_iterations=True, copy_call_s=5e-6, copy_discard_call_s=5e-6),
    # The runtime as built now (C++ observer, planner and mover threads; docs/runtime.md "Threads"), the default of
    # ``uvmprefetch bench`` and ``replay``:
    # - training thread: 10 us of PyTorch dispatch per launch (assumed, as live-sync) + 3 us of the C++ observer's
    #   callback (the dryrun report's ``observe_time.callback_us_per_launch``: 3.0 us, GPT-2 4 layers, this 2-core CPU);
    # - planner: 20 us per decision, a modelled cost so that runs repeat (bench/policy_cost.py, uvmprefetch on
    #   GPT-2 large at 2x: on_launch median 16-23 us, other hooks 2 us); its decisions take effect 4 launches later at
    #   the earliest (the same dryrun run: 4 983 launches planned in 1 118 ring drains, 4.5 launches a drain);
    # - mover: UVM's eviction holds it until the write-back ends (cudaMemPrefetchAsync to the host, docs/design.md §3);
    #   discards of dead blocks cost it 20 us per call + 2 us per block and move no bytes (the profile's copy-path
    #   discard figures, assumed until bench/gpu/evict_microbench.py's ``evict/discard`` has run);
    # - the loss read at each iteration's end, as live-sync.
    "live": HostModel(launch_s=13e-6, decision_s=20e-6, planner=True, planner_lag=4, mover=True, blocking_evict=True,
                      discard_call_s=20e-6, discard_block_s=2e-6, sync_iterations=True, copy_call_s=5e-6,
                      copy_discard_call_s=5e-6),
}
DEFAULT_HOST = "live"


def parse_host(spec: "str | HostModel | None") -> "HostModel | None":
    """``None``/``"free"``, a preset name (``live``, ``live-sync``), ``"k=v,..."``, or ``"preset:k=v,..."``."""
    if spec is None or isinstance(spec, HostModel):
        return spec
    from ..policy.base import parse_params
    name, sep, rest = str(spec).partition(":")
    name = name.strip()
    if not sep and "=" in name:
        name, rest = "", spec
    if name and name not in HOST_PRESETS:
        raise ConfigError(f"host model {name!r} is unknown; valid: {', '.join(HOST_PRESETS)} or k=v pairs "
                          f"({', '.join(f.name for f in dataclasses.fields(HostModel))})")
    base = HOST_PRESETS.get(name) if name else HostModel()
    if not rest.strip():
        return base
    keys = {p.partition("=")[0].strip() for p in rest.split(",")}
    # (parsed on a model with a planner, so that planner_lag alone passes; only the keys given are taken)
    over = parse_params(HostModel, rest + ("" if "planner" in keys else ",planner=true"), owner="host model")
    changed = {f.name: getattr(over, f.name) for f in dataclasses.fields(HostModel) if f.name in keys}
    out = dataclasses.replace(base or HostModel(), **changed)
    if out.planner_lag and not out.planner:
        raise ConfigError("host model: planner_lag needs planner=true (decisions on a planner thread)")
    return out


def host_name(host: "HostModel | None") -> str:
    """The preset a host model is (``live``, ``live-sync``, ``free``), else ``custom``."""
    if host is None:
        return "free"
    return next((k for k, v in HOST_PRESETS.items() if v == host), "custom")


class _CompileClock:
    """Seconds Numba spent compiling, summed over the process (a ``numba:compile`` event listener): a measured
    decision excludes them, so that a policy's first calls do not charge its compilation as decision time."""

    total = 0.0
    _installed = False

    @classmethod
    def now(cls) -> float:
        if not cls._installed:
            cls._installed = True
            try:
                from numba.core import event
            except ImportError:  # (no Numba: nothing compiles)
                return 0.0

            class _Listener(event.Listener):
                depth = 0
                t0 = 0.0

                def on_start(self, ev) -> None:
                    if self.depth == 0:
                        self.t0 = time.perf_counter()
                    self.depth += 1

                def on_end(self, ev) -> None:
                    self.depth -= 1
                    if self.depth == 0:
                        _CompileClock.total += time.perf_counter() - self.t0
            event.register("numba:compile", _Listener())
        return cls.total


class HostThreads:
    """The clocks of the runtime's threads beside the training thread's (``GpuModel.host_t``): the planner's, the
    mover's, and the decisions made but not yet applied (time the planner finished it, Decision)."""

    def __init__(self) -> None:
        self.planner_t = 0.0
        self.mover_t = 0.0
        self.pending: collections.deque = collections.deque()


def _decide(gm, info: LaunchInfo, host: HostModel) -> tuple["Decision | None", float]:
    """The policy's Decision for ``info`` and what it costs (``decision_s`` + the measured time without compiling)."""
    if not host.measure_decision:
        return gm.policy.on_launch(info, gm), host.decision_s
    c0 = _CompileClock.now()
    t0 = time.perf_counter()
    dec = gm.policy.on_launch(info, gm)
    took = time.perf_counter() - t0 - (_CompileClock.total - c0)
    return dec, host.decision_s + max(took, 0.0) * host.decision_scale


def host_launch(gm, info: LaunchInfo, now: float, host: HostModel) -> tuple[float, "Decision | None"]:
    """``on_launch`` of the GPU model ``gm`` (a ``GpuModel``) and its Decision on the host clock: returns when the
    launch was issued (the compute stream cannot start it earlier) and the Decision."""
    if host.planner:
        return _planned_launch(gm, info, now, host)
    m = gm.m
    dec, cost = _decide(gm, info, host)
    m["host_decision_s"] += cost
    h = gm.host_t + host.launch_s + cost
    if dec is not None and dec.discard.size:
        h += host.discard_call_s + host.discard_block_s * dec.discard.size
    if h > now:  # host-bound: the GPU idles until the launch is issued; the decision's moves start then
        m["host_stall_s"] += h - now
        now = h
        gm._advance(now)
    if dec is not None and not dec.is_empty():
        d2h_before = gm.uvm_d2h_end
        mark = gm._copy_mark() if gm.copy_on else None
        issued = _issued(gm)
        gm._apply(dec, now)
        if host.prefetch_block_s and _issued(gm) > issued:
            h += host.prefetch_block_s * (_issued(gm) - issued)
            if h > now:  # the prefetch calls return before the launch is issued
                m["host_stall_s"] += h - now
                now = h
                gm._advance(now)
        if host.blocking_evict and gm.uvm_d2h_end > d2h_before and gm.uvm_d2h_end > now:
            # the eviction calls return when their write-backs are done (one FIFO stream: the earlier
            # ones first): the host waits for the D2H queue it just added to, then issues the launch
            wait = gm.uvm_d2h_end - now
            m["host_blocked_s"] += wait
            m["host_stall_s"] += wait
            now = h = gm.uvm_d2h_end
            gm._advance(now)
        if mark is not None:
            now, h = gm._copy_host(host, mark, now, h)
    gm.host_t = h
    return now, dec


def _planned_launch(gm, info: LaunchInfo, now: float, host: HostModel) -> tuple[float, "Decision | None"]:
    """``host_launch`` with the planner and mover threads (``HostModel.planner``): the training thread issues the
    launch (``launch_s``); the planner takes it up once the training thread has issued ``planner_lag`` more (a ring
    drain: ``planner_lag * launch_s`` later) and it has finished the previous decision; a decision starts on the
    mover once that is done and the mover is free. The decisions that start by the time the GPU reaches this launch
    are applied, in order, before it runs (at the GPU's time: a decision is never applied before its own launch)."""
    m, th = gm.m, gm.threads
    h = gm.host_t + host.launch_s
    if h > now:
        m["host_stall_s"] += h - now
        now = h
        gm._advance(now)
    gm.host_t = h
    dec, cost = _decide(gm, info, host)
    m["host_decision_s"] += cost
    th.planner_t = max(th.planner_t, h + host.planner_lag * host.launch_s) + cost
    if dec is not None and not dec.is_empty():
        th.pending.append((th.planner_t, dec))
    last = None
    while th.pending:
        ready, d = th.pending[0]
        start = max(ready, th.mover_t) if host.mover else ready
        if start > now:
            break
        th.pending.popleft()
        _apply_on_mover(gm, d, now, start, host)
        last = d
    if len(th.pending) > m["planner_pending_max"]:
        m["planner_pending_max"] = len(th.pending)
    return now, last


def _issued(gm) -> int:
    """Blocks prefetched or populated so far: each a ``cudaMemPrefetchAsync`` range (``prefetch_block_s``)."""
    return gm.m["prefetch_issued_bytes"] // gm.block_size + gm.m["populated_blocks"]


def _apply_on_mover(gm, dec: Decision, now: float, start: float, host: HostModel) -> None:
    """Apply ``dec`` at the GPU's time ``now``; its calls run from ``start`` on the mover thread (``mover``; without
    it the planner makes them): what they hold (UVM write-backs with ``blocking_evict``, discard calls, the copy
    path's calls) holds that thread."""
    m, th = gm.m, gm.threads
    d2h_before = gm.uvm_d2h_end
    mark = gm._copy_mark() if gm.copy_on else None
    issued = _issued(gm)
    gm._apply(dec, now)
    # The calls run on the thread's own clock from ``start`` (<= now); the write-backs the engine queued at ``now``:
    # a blocking eviction holds the thread until they end (busy from ``now``, the gap before is the thread's idle).
    t = start + host.prefetch_block_s * (_issued(gm) - issued)
    if dec.discard.size:
        t += host.discard_call_s + host.discard_block_s * dec.discard.size
    if mark is not None:
        t = gm._copy_host_end(host, mark, t)[0]
    busy = t - start
    if host.blocking_evict and gm.uvm_d2h_end > d2h_before and gm.uvm_d2h_end > t:
        busy += gm.uvm_d2h_end - max(t, now)
        t = gm.uvm_d2h_end
    m["mover_busy_s"] += busy
    if host.mover:
        th.mover_t = t
    else:  # the planner makes the calls itself: its next decisions wait for them
        th.planner_t = max(th.planner_t, t)
