"""The parameters of ``uvmprefetch`` (``uvmprefetch:k=v,...``): one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...errors import ConfigError
from ..base import Params

# Experiment switches that were off by default and measured no better than the default (docs/policies.md lists
# what each did): a spec naming one gets an error that says so instead of "unknown parameter".
_DROPPED = "was removed (an experiment switch that was off by default and measured no better)"
REMOVED: dict[str, str] = {
    "deadline": _DROPPED,
    "whole": _DROPPED[:-1] + "; whole_launches, off by default, does it where the caller has the copy path)",
    "fault_late": _DROPPED[:-1] + "; fault_late_soft, on by default, covers the case that paid)",
    "guard_soft": _DROPPED,
    "guess_unpredicted": _DROPPED,
    "soft_moves": _DROPPED,
    "invalidate_always": "was renamed invalidate_without_discard",
}


@dataclass(frozen=True)
class UvmPrefetchParams(Params):
    """Tunables of ``uvmprefetch``. The switches exist for ablations; the defaults are the measured best."""

    REMOVED: ClassVar[dict[str, str]] = REMOVED

    prefetch: bool = True  # prefetch predicted blocks
    pre_evict: bool = True  # choose victims ourselves (else the driver's eviction makes room)
    invalidate: bool = True  # freed blocks are dead: dropped, never written back (where the caller can discard)
    # ... and also where the caller cannot discard (its discards then become write-backs): for A/B runs against
    # the default, which takes frees as live data there
    invalidate_without_discard: bool = False
    adaptive_window: bool = True  # the window monitor moves the window (else it stays at `window`)
    advice: bool = True  # READ_MOSTLY / PREFER_HOST where it pays
    # with the H2D queue busy, the next launch's blocks of older data at a data-dependent (soft) slot that would
    # arrive after it starts are left to fault (a fault goes ahead of the queue)
    fault_late_soft: bool = True
    # with the H2D queue busy, the running launch's first writes into dead memory (handed out again) or into memory
    # no launch has used are populated on the GPU without data beside the queue instead of left to fault
    # (Decision.populate)
    populate: bool = True
    # the predicted end of the H2D queue (the pacing budget's clock) counts no link time for the running launch's
    # first writes into dead memory, prefetched with its misses (they move no data); off, it counts a block's each
    first_writes_free: bool = True
    # at a soft match the pacing budget counts from the later of the H2D queue's end and the predicted end of the
    # victims' write-backs (a prefetch into an evicted block's room waits for its data to leave); only where the
    # caller discards and frees are deaths (docs/policies.md "How it decides")
    writeback_clock: bool = True
    # where the caller has the copy path, a decision at an exact match that evicts for later launches at all places
    # at least the batch whose copy-in call cost is at most this share of its link time (0: off). Off by default:
    # 0.1 took T5 small's steady state at 2 / 3x from 1.084 / 1.060x the oracle to 1.025 / 1.033x but at 1.5x made
    # it swing between 1.02 and 1.21x from one iteration to the next (plan.py's docstring, "Batches")
    batch_share: float = 0.0
    # where the caller has the copy path (a fixed cost per copy-in call), at an exact match on a plain pass the launch
    # the pacing budget reaches into is placed whole, as the oracle places launches, where that launch matched exactly
    # when it was recorded and the blocks it adds bring data. T5 small's steady state at 2 / 3x 1.084 / 1.060x ->
    # 1.030 / 1.030x the oracle, ResNet-152's at 2 / 3x -2 %, no standard trace worse (plan.py's docstring, "Whole")
    whole_launches: bool = True
    # ... and where evictions leave by UVM's own eviction (no copy path: the live runtime without discards). Off by
    # default: with --no-discard --evict uvm the steady state goes from 1.132x to 1.045x the oracle on the geomean
    # (GPT-2 large 3x -20 %, ViT large 3x -22 %) but T5 base at 1.5 / 2x +6.0 / +1.9 % and ResNet-152 at 1.5x +1.8 %
    # (docs/policies.md "Whole launches without the copy path")
    whole_launches_uvm: bool = False
    # where the caller evicts through UVM without discards (a write-back holds the mover thread until the D2H queue
    # drains), a decision at an exact match leaves the choice of victims to the driver; not where the planning thread
    # issues the calls itself (``PolicyContext.sync_moves``: live-sync's steady state +30 % at 1.5x with it)
    # (plan.py's docstring, "Driver victims")
    driver_victims: bool = True
    # ... once this many launches in a row matched the record's next launch exactly (0: at any exact match). While
    # the pointer re-learns (iterations 1-3) its runs of exact matches are short (median 1-4 launches; GPT-2 large at
    # 1.5x none reaches 64, 23 launches reach 16), in the steady state one run spans the iteration. With --no-discard
    # --evict uvm: 64 takes the standard set's steady state 1.132x -> 0.995x the oracle, whole run 1.161x -> 1.101x,
    # no trace worse than +0.52 %; 0 (any exact match): GPT-2 large 1.5x whole +4.9 %; 16: +3.4 %
    driver_victims_run: int = 64
    track_moves: bool = True  # translate predicted blocks of tensors the allocator placed elsewhere
    # ... and where predictions are translated, the record's first writes of new tensors are not prefetched at their
    # recorded blocks (this step's allocator places them elsewhere: docs/policies.md "Moved tensors"); only where
    # the caller discards and frees are deaths (without discards it measured mixed: -3 % to +5 % a trace)
    moved_births: bool = True
    stable_sync: bool = True  # re-synchronise on the blocks of older data a launch reads
    # following the cold iteration's record, a launch whose kernel is the record's next one goes on there instead
    # of jumping to another position with its exact signature (docs/policies.md "Encoder-decoder training"); only
    # where the caller discards and frees are deaths (without discards the jumps measured better: +2 % geomean)
    follow_cold: bool = True
    # ... once the pointer's visits to this step's earlier launches, while it follows the cold record, last this many
    # launches on average (from the second on; 0: from the start): T5 base's last 4.5, BERT, GPT-2, ViT large's 1.2-1.6
    follow_cold_visit: float = 2.5
    # following a later record than the cold one, a launch whose kernel is the record's next one goes on there
    # instead of jumping back to an exact signature at an earlier position of that record (an older record, another
    # pattern, still takes it): T5 base at 3x, iteration 3 jumped 46 times and each jump rebuilt the next uses without
    # the learned moves; only where the caller discards and frees are deaths, as follow_cold (docs/policies.md
    # "What is left")
    follow_later: bool = True
    # where moves are learned, a moved block that is dead where the followed record reads its recorded block is next
    # used at the record's next birth there (dead memory is written before it is read), not at that read's next entry;
    # the window pass does not bring such a block nearer or list it (history.advance, plan.window_candidates)
    dead_births: bool = True
    # a dead recorded address of a moved tensor is next used at the record's next birth there (moves.learn_moves,
    # history.advance) until this many births predicted in a row came and went elsewhere (0: always): after those the
    # address predicts none this iteration. 1 cost T5 base 1.2 % of its whole run at 1.5x (three quarters of the
    # addresses missed once are handed out again later in the iteration); 3-5 measured alike
    dead_misses: int = 4
    # the last launch of an iteration, committed after ``on_iteration``, counts in that iteration: its blocks' first
    # position in the next one is their first use there, not the position before its start (behind the pointer
    # once the step after follows that record: ranked as passed). T5 base's steady state 1.8 / 1.6 % faster at 2 / 3x
    # (uvmprefetch bench); only where the caller discards and frees are deaths: with --no-discard --evict uvm it
    # moved traces both ways by up to 5 % (docs/policies.md "What is left")
    first_pos_boundary: bool = True
    layer_stride: bool = True  # following an earlier layer of this iteration, shift its blocks by the stride
    window: int = 1024  # initial lookahead, in launches
    window_min: int = 64  # below this the plan cannot cover a layer's launches
    window_max: int = 8192
    patience: int = 4  # monitor events before the window moves
    pace: bool = True  # evict for later launches only while the link would idle before the next decision
    stall_aware: bool = True  # the pacing budget counts the running launch's wait for in-flight blocks
    lead_s: float = 0.0  # extra link time allowed beyond the next decision point
    margin: float = 0.01  # fraction of capacity kept free by pre-evicting dead / unpredicted blocks
    dead_reuse: bool = True  # a dead block whose address is predicted to be used again ranks by that use
    # live victims' predicted next uses are compared at this grain of launches (a power of two; 1: exactly): a far
    # tensor's blocks then leave together, in one run of the copy path's calls (docs/policies.md "Victims in runs");
    # only where the caller has the copy path (with UVM's eviction it measured mixed: BERT large 3x steady +18 %).
    # T5 small's steady state at 1.5x 1.057x -> 1.036x the oracle; standard set's steady geomean 1.0105 -> 1.0033
    victim_grain: int = 32
    ngram: int = 3  # predecessors in the exec-id / name correlation context
    history_launches: int = 1 << 17  # launches of history kept (bounded state)
    table_entries: int = 1 << 17  # entries per correlation table (a multiple of its 8 ways, at least 8)
    scan_max: int = 1 << 15  # most history entries scanned per decision (bounds the cost per launch)
    victim_pool: int = 256  # victims come from a pool refilled by a full scan of this many (0: always scan all)
    pool_launches: int = 64  # ... refilled at least this often (a bound on what its bookkeeping could miss)

    def __post_init__(self) -> None:
        self.check_ints("uvmprefetch", ("window", "window_min", "window_max", "patience", "ngram", "history_launches",
                                        "table_entries", "scan_max", "pool_launches", "victim_grain"))
        if self.window_min > self.window_max:
            raise ConfigError(f"uvmprefetch: window_min {self.window_min} > window_max {self.window_max}")
        if not self.window <= self.window_max:
            raise ConfigError(f"uvmprefetch: window {self.window} > window_max {self.window_max}")
        if self.window < self.window_min:  # an explicit small window lowers the floor with it
            object.__setattr__(self, "window_min", self.window)
        if not (isinstance(self.lead_s, (int, float)) and self.lead_s >= 0):
            raise ConfigError(f"uvmprefetch: lead_s must be >= 0, got {self.lead_s!r}")
        if not (isinstance(self.follow_cold_visit, (int, float)) and self.follow_cold_visit >= 0):
            raise ConfigError(f"uvmprefetch: follow_cold_visit must be >= 0, got {self.follow_cold_visit!r}")
        if not (isinstance(self.batch_share, (int, float)) and 0 <= self.batch_share <= 1):
            raise ConfigError(f"uvmprefetch: batch_share must be in [0, 1], got {self.batch_share!r}")
        if not (isinstance(self.margin, (int, float)) and 0 <= self.margin < 0.5):
            raise ConfigError(f"uvmprefetch: margin must be in [0, 0.5), got {self.margin!r}")
        self.check_ints("uvmprefetch", ("victim_pool", "dead_misses"), least=0)
        if self.victim_grain & (self.victim_grain - 1):
            raise ConfigError(f"uvmprefetch: victim_grain must be a power of two, got {self.victim_grain}")
        if self.history_launches < 16:
            raise ConfigError(f"uvmprefetch: history_launches must be >= 16, got {self.history_launches}")
