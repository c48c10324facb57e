"""The policy interface: the one contract the simulator (``sim/``) and the live runtime (``runtime/``) share.

A policy *observes* through hooks and *decides* by returning a ``Decision``; it never moves memory itself.
The simulator and the runtime are the only places that act. Everything is in **blocks**: dense integer ids
``0 <= b < ctx.max_blocks`` of ``ctx.block_size``-byte pieces of managed memory (2 MB by default, the
driver's VA block). The simulator numbers blocks from its address layout; the runtime maps real
addresses (``ptr // block_size``) to dense ids on first sight. Block-id arrays are ``int64``.

Hook order, per launch ``i`` (the same in the simulator and the runtime)::

    on_start(ctx)                       once, before anything
    on_free(blocks)                     for each range that died since launch i-1 (dead: no write-back needed)
    on_launch(info, state) -> Decision  launch i is the next to run; its accesses are in ``info``
        ... the caller applies the Decision: discards, evictions, populates, then prefetches in the order given ...
    on_fault(info, blocks)              blocks launch i needed that were neither resident nor in flight
    on_evict(blocks)                    blocks the *driver/simulator* evicted on its own (not by Decision)
    on_iteration(k)                     after the last launch of iteration k (optimizer step done; live without a
                                        hooked step: before the first launch after a backward pass)
    report() -> dict                    at the end: policy-specific figures (window over time, table sizes)

Timing. ``on_launch`` is called when launch ``i`` is about to start on the GPU's compute stream (the
runtime calls it when the launch is dispatched and keeps prefetch decisions relative to what the GPU is
executing). Prefetches are queued on the host-to-device copy engine in the order given, behind earlier ones;
a block of launch ``i`` still in flight when it starts makes the launch wait (a *late* prefetch, counted
as stall but not as a fault). Blocks of launch ``i`` that are neither resident nor queued fault.

Capacity. The caller never exceeds capacity: when a prefetch or fault needs room and the policy left none,
the caller evicts by the driver's rule (least recently *migrated* 2 MB block, never a block of the running
launch) and reports it through ``on_evict``. A policy that wants control pre-evicts in its ``Decision``.
Blocks of the running launch and of launches already queued on the GPU are never evicted, whatever the
Decision says (the caller drops such evictions).
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from ..gpus import GpuProfile

EMPTY = np.zeros(0, dtype=np.int64)
EMPTY_PATH = np.zeros(0, dtype=np.int8)


class Advice(enum.IntEnum):
    """Memory advice a policy may ask for, per block (maps to ``cudaMemAdvise``)."""

    UNSET = 0  # undo earlier advice
    READ_MOSTLY = 1  # cudaMemAdviseSetReadMostly: read-only copies on both sides, eviction is free
    PREFER_HOST = 2  # cudaMemAdviseSetPreferredLocation(host) + AccessedBy(gpu): kernels read it over the link


class EvictPath(enum.IntEnum):
    """Where an evicted block goes (``Decision.evict_path``, ``Policy.evict_path``; docs/simulator.md "Eviction
    paths")."""

    DEFAULT = 0  # the policy's own default (``Policy.evict_path``)
    UVM = 1  # UVM's eviction: cudaMemPrefetchAsync to the host (written back at the driver's speed)
    COPY = 2  # copy-out into a pinned host mirror + discard; back by repopulate + copy-in. Only for blocks whose
    # every allocation the runtime fully observes; any other block (and any block where the copy path is off)
    # goes by UVM


@dataclass(frozen=True)
class PolicyContext:
    """What a policy knows about its world at ``on_start``.

    ``trace`` and ``layout`` are given only to policies with ``offline = True`` (planners and the oracle,
    which see the whole run in advance); online policies get ``None`` there and learn from hooks.
    """

    block_size: int
    capacity_blocks: int
    max_blocks: int
    gpu: GpuProfile
    live: bool = False  # True in the runtime (decision cost matters), False in the simulator
    # False where dead data cannot be dropped: the live cuda backend without UVMPREFETCH_DISCARD=1 (its default),
    # the simulator's --no-discard, the dryrun backend alike. A Decision's discards are then evictions, written
    # back like live data, and freed memory comes back over the link when the allocator hands it out again.
    discards: bool = True
    trace: typing.Any = None  # uvmprefetch.trace.Trace, offline policies only
    layout: typing.Any = None  # uvmprefetch.sim.layout.Layout (alloc -> blocks, per-launch blocks), offline only
    # True where the caller has the copy path (``--evict copy|auto`` on a profile with copy bandwidth): evictions of
    # copy-eligible blocks can leave at the copy engines' speed without holding the thread (docs/simulator.md)
    copy_path: bool = False
    # True where the caller populates (``Decision.populate``): dead data is dropped and the GPU profile has a cost for
    # mapping a dropped range without data (docs/simulator.md "Populates"); elsewhere populates are prefetches
    populates: bool = False
    # True where memory no launch has touched yet is mapped without data when first touched or brought in (the driver
    # zero-fills it): the simulator given the trace's fresh blocks on a profile that models populates
    # (docs/simulator.md "Cold start"); False elsewhere, where such memory may hold data and moves like any other
    fresh_memory: bool = False
    # True where the decisions' calls (evictions, prefetches) run on the thread that makes the decisions, not on a
    # mover thread of their own: the simulator's host models without a mover (``live-sync``), the live runtime under
    # the Python observer without ``UVMPREFETCH_MOVER=thread``; False under the C++ observer (its mover thread issues
    # them) and where no host model runs
    sync_moves: bool = False


@dataclass
class LaunchInfo:
    """One launch as the hooks see it.

    ``blocks`` is the sorted unique set of blocks the launch touches, ``write_blocks`` the subset it writes,
    when the observer knows them (the simulator always does; the runtime does for PyTorch ops through the
    dispatcher). ``known_accesses`` is False when only the launch itself was seen (e.g. a cuBLAS launch seen
    by CUPTI, or DeepUM's setting, which learns from faults only): then ``blocks`` is empty.
    """

    index: int
    exec_id: int
    name: int
    phase: int
    iteration: int
    duration: float
    blocks: np.ndarray = field(default_factory=lambda: EMPTY)
    write_blocks: np.ndarray = field(default_factory=lambda: EMPTY)
    known_accesses: bool = True


@dataclass
class Decision:
    """What a policy wants done now. Arrays are int64 block ids; any may be empty.

    The caller applies, in this order: ``discard`` (drop contents, no write-back: the data is dead),
    ``evict`` (move to host, written back if dirty), ``advise``, ``populate``, then ``prefetch`` (to the GPU,
    queued in the order given: put the soonest-needed first). Blocks already where they are asked to go are skipped.
    ``populate``: blocks the policy takes to be dead whose pages the runtime dropped (discarded), to be mapped on
    the GPU without data, beside the H2D queue instead of behind it (docs/simulator.md "Populates"); the caller
    prefetches a block it does not know to be so instead (its data moves; nothing is lost either way).
    ``evict`` leaves by UVM's eviction or by the copy path (``evict_path``, ``EvictPath``); ``PREFER_HOST``
    advice is the third way: the block stays in host memory and kernels reach it over the link.
    """

    prefetch: np.ndarray = field(default_factory=lambda: EMPTY)
    evict: np.ndarray = field(default_factory=lambda: EMPTY)
    discard: np.ndarray = field(default_factory=lambda: EMPTY)
    advise: tuple = ()  # ((blocks ndarray, Advice), ...)
    # Evict to the SSD tier (applied after ``evict``): resident blocks leave the GPU and those that need a
    # write-back are written to the SSD instead of host memory (clean blocks with a current copy are dropped);
    # blocks already off the GPU whose data sits in host memory move host -> SSD. Needs a GPU profile with
    # ``ssd_bw > 0`` (docs/tiers.md).
    evict_ssd: np.ndarray = field(default_factory=lambda: EMPTY)
    # Per block of ``evict`` (same length; empty = every block ``EvictPath.DEFAULT``): the way out it takes under
    # ``--evict auto``, an ``EvictPath``. A caller without the copy path ignores it (every eviction is UVM's).
    evict_path: np.ndarray = field(default_factory=lambda: EMPTY_PATH)
    populate: np.ndarray = field(default_factory=lambda: EMPTY)

    def is_empty(self) -> bool:
        return not (self.prefetch.size or self.evict.size or self.discard.size or self.advise or self.evict_ssd.size
                    or self.populate.size)


class ResidencyView(typing.Protocol):
    """What the caller lets a policy read about memory right now (the runtime's view is its own bookkeeping).

    ``resident`` and ``in_flight`` are dense bool arrays of length ``max_blocks`` (read-only by contract);
    ``used_blocks`` counts resident + in-flight; ``now`` is the GPU time in seconds. Optional ``n_ids``: every
    block id in use is below it (the live runtime sizes its arrays for the whole device but numbers blocks
    densely: a scan over all blocks may stop there; ``ids_in_use`` reads it).
    """

    resident: np.ndarray
    in_flight: np.ndarray
    used_blocks: int
    capacity_blocks: int
    now: float


@dataclass(frozen=True)
class Params:
    """Base of every policy's parameters: a frozen dataclass validated in ``__post_init__``."""

    def check_ints(self, owner: str, names: tuple[str, ...], least: int = 1) -> None:
        """Each field in ``names`` must be an integer (not a bool) >= ``least``: else a ConfigError naming it."""
        for f in names:
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                what = "a positive integer" if least == 1 else f"an integer >= {least}"
                raise ConfigError(f"{owner}: {f} must be {what}, got {v!r}")


class Policy:
    """Base class: every hook is a no-op; override only what you need.

    Subclasses set ``name`` (the registry key), ``Params`` (a frozen dataclass of tunables) and optionally
    ``offline = True`` (sees the whole trace: planners, oracle). ``ideal = True`` tells the simulator to
    model infinite memory (only the ``ideal`` baseline sets it).

    ``rank`` / ``world``: which of ``world`` data-parallel GPUs this policy object runs on (set before
    ``on_start`` by ``sim/multigpu.py``; 0 / 1 everywhere else). Only multi-GPU-aware policies read them.
    """

    name: ClassVar[str] = ""
    offline: ClassVar[bool] = False
    ideal: ClassVar[bool] = False
    # Under ``--evict auto``: how the caller evicts for this policy (its Decision's ``evict`` blocks without an
    # ``evict_path`` of their own, and the caller's own evictions when the policy left no room). COPY: by the copy
    # path wherever the block is eligible (the runtime's rule); UVM: by UVM's eviction (``demand``, ``deepum``:
    # the driver's mechanisms, which have no copy path).
    evict_path: ClassVar[EvictPath] = EvictPath.COPY
    Params: ClassVar[type] = Params
    description: ClassVar[str] = ""
    rank: int = 0
    world: int = 1

    def __init__(self, params: Params | None = None, **overrides) -> None:
        if params is None:
            params = parse_params(self.Params, overrides, owner=self.name)
        elif overrides:
            params = dataclasses.replace(params, **overrides)
        self.params = params
        self.ctx: PolicyContext | None = None

    # ----------------------------------------------------------------------------------------- hooks
    def on_start(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    def on_launch(self, info: LaunchInfo, state: ResidencyView) -> Decision | None:
        return None

    def on_fault(self, info: LaunchInfo, blocks: np.ndarray) -> None:
        pass

    def on_evict(self, blocks: np.ndarray) -> None:
        pass

    def on_free(self, blocks: np.ndarray) -> None:
        pass

    def on_iteration(self, k: int) -> None:
        pass

    def report(self) -> dict:
        return {}


def parse_params(cls: type, values: dict | str | None, owner: str = "policy") -> Params:
    """Build ``cls`` (a frozen dataclass) from a dict or a ``"k=v,k=v"`` string, converting strings to the
    field's type. Unknown keys and bad values raise one ``ConfigError`` naming the parameter; a key in the class's
    optional ``REMOVED`` mapping (name -> what became of it) raises one that says so."""
    if values is None:
        values = {}
    if isinstance(values, str):
        items = {}
        for part in filter(None, (p.strip() for p in values.split(","))):
            k, sep, v = part.partition("=")
            if not sep:
                raise ConfigError(f"{owner}: parameter {part!r} must look like name=value")
            items[k.strip()] = v.strip()
        values = items
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    removed = [k for k in unknown if k in getattr(cls, "REMOVED", {})]
    if removed:  # (a parameter that existed once: say what became of it)
        raise ConfigError(f"{owner}: parameter {removed[0]} {cls.REMOVED[removed[0]]}")
    if unknown:
        valid = ", ".join(fields) or "(none)"
        raise ConfigError(f"{owner}: unknown parameter(s) {', '.join(unknown)}; valid: {valid}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for k, v in values.items():
        typ = hints.get(k, str)
        if isinstance(v, str) and typ is not str:
            try:
                if typ is bool:
                    if v.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                        raise ValueError(v)
                    v = v.lower() in ("1", "true", "yes", "on")
                elif typ in (int, float):
                    v = typ(float(v)) if typ is int and float(v).is_integer() else typ(v)
            except ValueError:
                raise ConfigError(f"{owner}: parameter {k}={v!r} is not a valid {typ.__name__}") from None
        kwargs[k] = v
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{owner}: {e}") from None


def ids_in_use(state: ResidencyView) -> int:
    """How many block ids a scan over ``state`` must visit: ``state.n_ids`` where the view has it."""
    n = getattr(state, "n_ids", None)
    m = state.resident.shape[0]
    return m if n is None else min(int(n), m)
