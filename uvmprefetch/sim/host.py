"""The host thread that issues the launches, for the simulator's optional host clock (docs/simulator.md "Host
clock"): its model (``HostModel``), the named presets of ``--host``, and a launch on that clock (``host_launch``)."""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        for f in ("launch_s", "decision_s", "decision_scale", "discard_block_s", "copy_call_s",
                  "copy_discard_call_s", "copy_discard_block_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"host model: {f} must be a number >= 0, got {v!r}")


# Named host models for the command line (``--host``); docs/simulator.md "Host clock" says where they come from.
HOST_PRESETS = {
    "none": None,
    # What the live cuda backend did on an H100 (the GPU runs of bench/gpu/, docs/gpu-validation.md): decisions on
    # the training thread, synchronous evictions, ~10 us of PyTorch dispatch + observation per launch (assumed, not
    # measured), discards that held the thread 159 us per block (9.82 s for 61 739 blocks, GPT-2 large at 1.5x), and
    # the loss read at each iteration's end (bench/gpu/train_worker.py: ``loss.item()``). The copy path's calls (the
    # live runtime has none yet): 5 us each on the training thread, assumed until bench/gpu/evict_microbench.py has
    # measured ``evict/copy_out`` managed_to_pinned host_us at 2 MiB and ``evict/discard`` ranges host_per_call_us /
    # host_per_block_us and behind_copy.waits_for_copy.
    "live-sync": HostModel(launch_s=10e-6, measure_decision=True, blocking_evict=True, discard_block_s=159e-6,
                           sync_iterations=True, copy_call_s=5e-6, copy_discard_call_s=5e-6),
}


def parse_host(spec: "str | HostModel | None") -> "HostModel | None":
    """``None``/``"none"``, a preset name (``live-sync``), ``"k=v,..."``, or ``"preset:k=v,..."``."""
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
    over = parse_params(HostModel, rest, owner="host model")
    changed = {f.name: getattr(over, f.name) for f in dataclasses.fields(HostModel)
               if f.name in {p.partition("=")[0].strip() for p in rest.split(",")}}
    return dataclasses.replace(base or HostModel(), **changed)



def host_launch(gm, info: LaunchInfo, now: float, host: HostModel) -> tuple[float, "Decision | None"]:
    """``on_launch`` of the GPU model ``gm`` (a ``GpuModel``) and its Decision on the host clock: returns when the
    launch was issued (the compute stream cannot start it earlier) and the Decision."""
    m = gm.m
    t0 = time.perf_counter() if host.measure_decision else 0.0
    dec = gm.policy.on_launch(info, gm)
    cost = host.decision_s + ((time.perf_counter() - t0) * host.decision_scale if host.measure_decision else 0.0)
    m["host_decision_s"] += cost
    h = gm.host_t + host.launch_s + cost
    if dec is not None and dec.discard.size:
        h += host.discard_block_s * dec.discard.size
    if h > now:  # host-bound: the GPU idles until the launch is issued; the decision's moves start then
        m["host_stall_s"] += h - now
        now = h
        gm._advance(now)
    if dec is not None and not dec.is_empty():
        d2h_before = gm.uvm_d2h_end
        mark = gm._copy_mark() if gm.copy_on else None
        gm._apply(dec, now)
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
