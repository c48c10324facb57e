"""``uvmprefetch`` through its hooks, with a hand-driven residency view (no simulator), then on the simulator; its
compiled parts against NumPy, and the whole policy against the Python reference (``uvmprefetch_reference.py``)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.gpus import get_profile
from uvmprefetch.policy import make_policy
from uvmprefetch.policy.base import EMPTY, Advice, LaunchInfo, PolicyContext
from uvmprefetch.policy.uvmprefetch import INF, UvmPrefetchPolicy
from uvmprefetch.policy.uvmprefetch import correlation, moves, plan, victims
from uvmprefetch.policy.uvmprefetch.window import WindowMonitor
from _hooks import FakeView, drive
from uvmprefetch_reference import ReferencePolicy, learn_shift_ref, victims_ref

BS = 2 << 20
REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "traces" / "gpt2-small-b2s128.uvmt"
EMPTY_W = np.zeros(0, dtype=np.int64)


def ctx(n, cap):
    return PolicyContext(block_size=BS, capacity_blocks=cap, max_blocks=n, gpu=get_profile("h100-pcie-lit"))


# A repeating 4-launch "iteration": each launch touches its own blocks.
SEQ = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5]), np.array([6, 7])]


def set_p(pol, p):
    """Put the pointer of ``pol`` at ``p`` (None: no pointer)."""
    pol.history.r["has_p"] = p is not None
    pol.history.r["p"] = -1 if p is None else p


def rank(pol, view, cur, k):
    """``k`` victims by the compiled ranking and by the NumPy reference, with their keys."""
    p = pol.history.p if pol.history.p is not None else -1
    bs = pol.blocks
    state = (bs.dead, pol.history.nu, bs.dirty, bs.last_use, pol.params.dead_reuse, int(pol.victims.s[0]["gmask"]))
    got = victims.rank(view.resident, cur, state, p, k, pol.victims.mark)[:2]
    return got, victims_ref(view.resident, cur, state, p, k)


def test_learns_a_repeating_sequence_and_prefetches_the_next_launch():
    # GIVEN room for everything WHEN the 4-launch loop runs twice
    pol = UvmPrefetchPolicy(window=2, window_min=1, adaptive_window=False, advice=False)
    view = FakeView(16, 16)
    pol.on_start(ctx(16, 16))
    seen = {}

    def record(it, k, dec):
        seen[(it, k)] = set() if dec is None else set(dec.prefetch.tolist())

    drive(pol, view, SEQ, 1, on_decision=record)
    view.resident[:] = False  # forget residency: the second iteration must be predicted, not remembered
    drive(pol, view, SEQ, 1, start_index=4, on_decision=lambda it, k, d: record(1, k, d))
    # THEN in iteration 1, launch 0's decision already brings launches 1 and 2 (window 2), in order of need
    assert {2, 3, 4, 5} <= seen[(1, 0)]
    assert pol.report()["matched"] >= 3


@pytest.mark.parametrize("boundary", [True, False])
def test_the_last_launch_of_an_iteration_does_not_set_the_next_ones_first_positions(boundary):
    # GIVEN a 4-launch loop whose last launch also touches the blocks its first launch reads (an optimizer step
    # writing the parameters the forward reads next), committed only after ``on_iteration`` (its duration is known
    # at the next launch)
    seq = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5]), np.array([6, 7, 0, 1])]
    pol = UvmPrefetchPolicy(window=2, window_min=1, adaptive_window=False, advice=False,
                            first_pos_boundary=boundary)
    view = FakeView(16, 16)
    pol.on_start(ctx(16, 16))
    drive(pol, view, seq, 1)
    drive(pol, view, seq, 1, start_index=4)
    # WHEN the second iteration (positions 4-7) has run, its last launch still pending
    h = pol.history
    assert int(h.r["iter_start"]) == 8 and int(h.r["iters"]) == 2 and bool(h.r["pend"])
    # THEN with first_pos_boundary each block's first position in it is its first use there: blocks 0 and 1 at
    # the iteration's first launch, 6 and 7 at its last (not yet committed: still iteration 0's); without, the
    # blocks of iteration 0's last launch take the position before the iteration's start, behind the pointer once
    # the next iteration follows this one's record
    if boundary:
        assert h.first_pos[[0, 1, 2, 3, 4, 5]].tolist() == [4, 4, 5, 5, 6, 6]
        assert (h.first_it[[0, 1, 2, 3, 4, 5]] == 1).all() and (h.first_it[[6, 7]] == 0).all()
    else:
        assert h.first_pos[[0, 1, 6, 7]].tolist() == [3, 3, 3, 3] and (h.first_it[[0, 1, 6, 7]] == 1).all()


def test_never_evicts_a_block_needed_sooner_than_the_one_it_brings():
    # GIVEN capacity 4 blocks and the 4-launch loop (8 blocks) learned once
    pol = UvmPrefetchPolicy(window=3, adaptive_window=False, advice=False, pace=False)
    view = FakeView(16, 4)
    pol.on_start(ctx(16, 4))

    def fault_with_room(it, k, dec):
        pass

    i = 0
    for it in range(3):
        for k, blocks in enumerate(SEQ):
            info = LaunchInfo(index=i, exec_id=1000 + k, name=k, phase=1, iteration=it, duration=1e-3,
                              blocks=blocks, write_blocks=EMPTY_W)
            dec = pol.on_launch(info, view)
            if dec is not None and it >= 1:
                # THEN every evicted block is needed later than every block the decision brings in
                order = [b for kk in range(1, 4) for b in SEQ[(k + kk) % 4]] + list(SEQ[k])
                rank = {b: order.index(b) for b in order}
                ev = np.concatenate([dec.evict, dec.discard])
                assert not np.isin(ev, blocks).any()
                if ev.size and dec.prefetch.size:
                    assert min(rank[int(b)] for b in ev) > max(rank[int(b)] for b in dec.prefetch)
            view.apply(dec)
            missing = blocks[~view.resident[blocks]]
            room = view.capacity_blocks - view.used_blocks
            if missing.size > room:  # the "driver" evicts any non-running resident block
                victims = np.flatnonzero(view.resident & ~np.isin(np.arange(16), blocks))[:missing.size - room]
                view.resident[victims] = False
                pol.on_evict(victims)
            if missing.size:
                pol.on_fault(info, missing)
                view.resident[missing] = True
            i += 1
        pol.on_iteration(it)


EMPTY_W = np.zeros(0, dtype=np.int64)


@pytest.mark.parametrize("cls", [UvmPrefetchPolicy, ReferencePolicy])
@pytest.mark.parametrize("exact", [True, False])
def test_paced_plan_keeps_the_link_busy_up_to_the_next_decision(cls, exact):
    # GIVEN an 8-launch loop of one block each, learned once and followed into the next iteration, and then a
    # full GPU (4 blocks) holding the running launch's block and three needed later than any missing one
    seq = [np.array([k]) for k in range(8)]
    pol = cls(window=8, adaptive_window=False, advice=False)
    view = FakeView(16, 16)
    pol.on_start(ctx(16, 4))
    drive(pol, view, seq, 1)
    view.apply(pol.on_launch(LaunchInfo(index=8, exec_id=1000, name=0, phase=1, iteration=1, duration=1e-3,
                                        blocks=seq[0], write_blocks=EMPTY_W), view))
    run = seq[1] if exact else np.array([9])  # (else the same kernel on another block: a soft match)
    view.capacity_blocks = 4
    view.resident[:] = False
    view.resident[[int(run[0]), 0, 6, 7]] = True
    view.now = 1.0  # the H2D queue has drained
    pol.plan.r["horizon"] = 0  # (and the plan has yet to look past the next launch: what it had brought is gone)
    # WHEN launch 1 runs for 1.5 block transfers
    info = LaunchInfo(index=9, exec_id=1001, name=1, phase=1, iteration=1, duration=1.5 * pol.t_blk,
                      blocks=run, write_blocks=EMPTY_W)
    dec = pol.on_launch(info, view)
    # THEN it brings the next launch's block and, paced, enough for the link to stay busy until the next
    # decision point, in order of need, each in place of a block needed later: when the launch matched its
    # record exactly, two more transfers (rounded up: the link never idles for part of one); on a soft match
    # one (rounded down: an eviction for an uncertain prediction costs more than the idle)
    assert pol.report()["soft"] == (0 if exact else 1)
    assert dec is not None and dec.prefetch.tolist() == ([2, 3, 4] if exact else [2, 3])
    assert sorted(np.concatenate([dec.evict, dec.discard]).tolist()) == ([0, 6, 7] if exact else [0, 7])


def test_dead_blocks_are_discarded_first():
    # GIVEN a full GPU whose resident blocks include freed ones
    pol = UvmPrefetchPolicy(window=4, adaptive_window=False, advice=False, pace=False)
    view = FakeView(32, 8)
    pol.on_start(ctx(32, 8))
    drive(pol, view, SEQ, 1)
    view.resident[:] = False
    view.resident[[10, 11, 12, 13, 14, 15, 0, 1]] = True  # 8/8 used
    pol.on_free(np.array([10, 11]))
    info = LaunchInfo(index=4, exec_id=1000, name=0, phase=1, iteration=1, duration=1e-3, blocks=SEQ[0],
                      write_blocks=EMPTY_W)
    dec = pol.on_launch(info, view)
    # THEN the room for launch 1's blocks comes from the dead blocks, discarded (no write-back)
    assert dec is not None and set(dec.discard.tolist()) == {10, 11}
    assert set(dec.prefetch.tolist()) >= {2, 3}


def test_where_the_caller_cannot_discard_freed_blocks_are_not_dead():
    # GIVEN the state of test_dead_blocks_are_discarded_first, but a caller that cannot drop dead data (the live
    # cuda backend's default): its discards would be write-backs
    def decide(discards, **kw):
        pol = UvmPrefetchPolicy(window=4, adaptive_window=False, advice=False, pace=False, **kw)
        view = FakeView(32, 8)
        c = ctx(32, 8)
        pol.on_start(PolicyContext(block_size=c.block_size, capacity_blocks=8, max_blocks=32, gpu=c.gpu,
                                   discards=discards))
        drive(pol, view, SEQ, 1)
        view.resident[:] = False
        view.resident[[10, 11, 12, 13, 14, 15, 0, 1]] = True
        pol.on_free(np.array([10, 11]))
        info = LaunchInfo(index=4, exec_id=1000, name=0, phase=1, iteration=1, duration=1e-3, blocks=SEQ[0],
                          write_blocks=EMPTY_W)
        return pol, pol.on_launch(info, view)

    # THEN nothing is discarded and the freed blocks are not marked dead; the report says so
    pol, dec = decide(False)
    assert not pol.blocks.dead[[10, 11]].any() and pol.report()["invalidating"] is False
    assert dec is not None and dec.discard.size == 0 and set(dec.prefetch.tolist()) >= {2, 3}
    # WHEN told to take frees as deaths anyway, or where discards exist: dead, discarded
    for discards, kw in ((False, {"invalidate_without_discard": True}), (True, {})):
        pol, dec = decide(discards, **kw)
        assert pol.report()["invalidating"] is True and set(dec.discard.tolist()) == {10, 11}


def test_without_discards_the_measured_costs_favour_taking_frees_as_live():
    # GIVEN the shipped GPT-2 small trace without discards (the live default), the H100's measured costs
    # (write-backs at 7.5 GB/s) and the live runtime's host clock with a fixed decision cost (reproducible)
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace import load
    t = load(SMALL)
    host = "live-sync:measure_decision=false,decision_s=20e-6"

    def run(spec, discards=False):
        return replay(t, spec, oversub=1.5, discards=discards, gpu=get_profile("h100-pcie-cal"), host=host)
    now, before = run("uvmprefetch"), run("uvmprefetch:invalidate_without_discard=true")
    # THEN no decision's discard turns into a write-back, and the run is faster (1.20 -> 1.06 s when measured)
    assert now["refused_discards"] == 0 < before["refused_discards"]
    assert now["time_s"] < 0.95 * before["time_s"]
    # and with discards nothing changes
    a, b = run("uvmprefetch", True), run("uvmprefetch:invalidate_without_discard=true", True)
    assert a["time_s"] == b["time_s"] and a["bytes_dtoh"] == b["bytes_dtoh"]


@pytest.mark.parametrize("oversub", [1.5, 1.7])
def test_first_writes_into_dead_memory_are_populated_instead_of_faulted(oversub):
    # GIVEN the shipped GPT-2 small trace (its activations land where the record has other tensors), the H100's
    # measured costs (a fault batch of one block: 330 us; a populate call: 20 us + 2 us a block) and the live host
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace import load
    t = load(SMALL)

    def run(more="", gpu="h100-pcie"):
        # (first_writes_free off: with it the queue is idle at these decisions, and the first writes are prefetched
        # without a transfer: test_first_writes_into_dead_memory_take_no_link_time)
        return replay(t, "uvmprefetch:first_writes_free=false" + more, gpu, oversub=oversub, host="live", evict="auto")
    # WHEN it is replayed with and without populates
    on, off = run(), run(",populate=false")
    # THEN first writes are populated instead of faulted zero-filled (67 against 124 / 211 when measured), the
    # run is faster, and the steady state (the last iteration, where nothing new is written) is the same
    assert on["populated_blocks"] > 0 and on["policy_report"]["populated_blocks"] >= on["populated_blocks"]
    assert on["zero_fill_blocks"] < 0.6 * off["zero_fill_blocks"] and off["populated_blocks"] == 0
    assert on["time_s"] < 0.97 * off["time_s"]
    assert on["iteration_times_s"][-1] == pytest.approx(off["iteration_times_s"][-1], rel=1e-9)
    # AND where the caller cannot populate (a profile without a populate cost) the policy asks for none
    lit, lit_off = run("", "h100-pcie-lit"), run(",populate=false", "h100-pcie-lit")
    assert lit["refused_populates"] == lit["populated_blocks"] == 0 and lit["time_s"] == lit_off["time_s"]


@pytest.mark.parametrize("oversub", [1.5, 1.7])
def test_first_writes_into_dead_memory_take_no_link_time(oversub):
    # GIVEN the shipped GPT-2 small trace (its activations land where the record has other tensors: the running
    # launch's first writes into dead memory miss), the H100's costs and the live host
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace import load
    t = load(SMALL)
    ahead = {}

    class Watch(UvmPrefetchPolicy):
        def on_launch(self, info, state):
            dec = super().on_launch(info, state)
            # (the plan's predicted end of the H2D queue against the simulator's, at the next decision)
            self.seen.append(float(self.plan.r["q_end"]))
            self.real.append(float(state.t_h2d))
            return dec

    def run(spec):
        pol = Watch(make_policy(spec).params)
        pol.seen, pol.real = [], []
        r = replay(t, pol, "h100-pcie", oversub=oversub, host="live", evict="auto")
        q, real = np.array(pol.seen[:-1]), np.array(pol.real[1:])
        ahead[spec] = int((q > real + pol.t_blk).sum())
        return r
    # WHEN it is replayed with first_writes_free (the default) and without (victim_grain 1, the exact victim order
    # these figures were measured with, and follow_cold off in both: on this trace it changes which blocks fault in
    # iteration 1, at 1.7x 70 against 68 with the run still faster)
    spec_on = "uvmprefetch:victim_grain=1,follow_cold=false"
    spec_off = spec_on + ",first_writes_free=false"
    on, off = run(spec_on), run(spec_off)
    # THEN the plan's queue runs ahead of the link's at fewer decisions (1.5x: 6 against 249 when measured), the
    # first writes need no populate (the queue is idle when they are prefetched) and fault no more, and the run is
    # faster (0.2566 against 0.2581 s at 1.5x)
    assert ahead[spec_on] < 0.2 * ahead[spec_off]
    assert on["faults"] <= off["faults"] and on["time_s"] < off["time_s"]
    assert on["iteration_times_s"][0] == off["iteration_times_s"][0]  # (no dead memory yet: nothing changes)


def test_fresh_memory_moves_no_data_in_the_first_iteration():
    # GIVEN the shipped GPT-2 small trace, whose first iteration writes every activation, gradient and optimizer state
    # into memory nothing used before (fresh: a GPU maps it without data), the H100's measured costs and the live host
    from uvmprefetch.sim.layout import build_layout
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace import load
    t = load(SMALL)

    def run(fresh):
        lay = build_layout(t)
        if not fresh:
            lay.fresh = None  # (every block holds data, as on the -lit profiles; the policy is told so)
        # (moved_births off: it acts from iteration 1 on, where a first write into a block freed while on the host
        # is populated and refused, the block's host copy moved in: 15 blocks on this trace; follow_cold off: it
        # acts in iteration 1 too, where the pointer goes on by name over the cold record; with it on, iteration 1
        # differs between the two runs by 0.6 % of its time on this trace, a difference not traced further;
        # first_writes_free off: the link time it takes off the queue's estimate is that of blocks dead where the
        # first iteration freed them, which differ with and without fresh blocks, and with them the later
        # iterations' pacing by 0.2 %)
        return replay(t, "uvmprefetch:moved_births=false,follow_cold=false,first_writes_free=false,victim_grain=1",
                      "h100-pcie",
                      oversub=1.5, host="live", evict="auto", layout=lay)
    # WHEN it is replayed with the trace's fresh blocks and without
    on, off = run(True), run(False)
    # THEN the first iteration brings its new tensors in without moving data or faulting (1 fault, 2.8 GiB H2D,
    # 102 ms against 4.7 GiB and 135 ms when measured), and the later iterations are the same
    assert on["iteration_faults"][0] <= 2 and on["refused_populates"] == 0
    assert on["iteration_bytes_htod"][0] < 0.7 * off["iteration_bytes_htod"][0]
    assert on["iteration_times_s"][0] < 0.8 * off["iteration_times_s"][0]
    assert on["iteration_times_s"][1:] == pytest.approx(off["iteration_times_s"][1:], rel=1e-9)


@pytest.mark.parametrize("dead_reuse", [True, False])
def test_a_dead_address_about_to_be_reused_is_not_the_first_victim(dead_reuse):
    # GIVEN two resident blocks: a dead one whose address the next launch uses again (a freed tensor's memory
    # handed to the next tensor) and a live, clean one not used for 100 launches; and a dead one never used again
    pol = UvmPrefetchPolicy(advice=False, dead_reuse=dead_reuse)
    pol.on_start(ctx(8, 8))
    view = FakeView(8, 8)
    view.resident[[0, 1, 2]] = True
    set_p(pol, 10)
    pol.history.nu[[0, 1, 2]] = [11, 110, INF]
    pol.on_free(np.array([0, 2]))
    # WHEN two victims are chosen
    (vict, _), (ref, _) = rank(pol, view, EMPTY_W, 2)
    # THEN the dead block with no future goes first either way; with dead_reuse the live block with the far
    # reuse goes next (Belady), without it the other dead block does
    assert vict[0] == 2 and ref[0] == 2
    assert vict[1] == ref[1] == (1 if dead_reuse else 0)


@pytest.mark.parametrize("grain, copy", [(1, True), (32, True), (32, False)])
def test_far_victims_leave_as_one_run_of_blocks_at_the_victim_grain(grain, copy):
    # GIVEN eight resident live blocks of two far tensors interleaved two by two (an optimizer step's consecutive
    # launches: blocks 0-1 and 4-5 used at 1000, 2-3 and 6-7 at 1001), the pointer at 10, a caller with the copy
    # path (its per-call costs) or without
    pol = UvmPrefetchPolicy(advice=False, victim_grain=grain)
    pol.on_start(PolicyContext(block_size=BS, capacity_blocks=8, max_blocks=8, gpu=get_profile("h100-pcie"),
                               copy_path=copy))
    view = FakeView(8, 8)
    view.resident[:] = True
    set_p(pol, 10)
    pol.history.nu[:] = [1000, 1000, 1001, 1001, 1000, 1000, 1001, 1001]
    # WHEN four victims are chosen (compiled and reference)
    (vict, _), (ref, _) = rank(pol, view, EMPTY_W, 4)
    # THEN exactly (grain 1, or no copy path) the later use leaves first: two runs of two blocks; at a grain of 32
    # launches on the copy path the two uses are equal and the highest blocks leave first: one run
    assert vict.tolist() == ref.tolist()
    assert sorted(vict.tolist()) == ([4, 5, 6, 7] if grain == 32 and copy else [2, 3, 6, 7])


def test_victim_grain_must_be_a_power_of_two():
    with pytest.raises(ConfigError, match="victim_grain must be a power of two"):
        UvmPrefetchPolicy(victim_grain=24)


def test_of_dead_blocks_with_no_predicted_use_the_highest_address_leaves_first():
    # GIVEN dead resident blocks with no predicted use, and a live one used again soon. The caching allocator
    # hands out free space best fit by (size, address), so of equal holes the lowest is taken first; without
    # discards (the live default) a dead block that leaves and is taken again comes back over the link.
    pol = UvmPrefetchPolicy(advice=False)
    pol.on_start(ctx(8, 8))
    view = FakeView(8, 8)
    view.resident[[1, 3, 4, 6, 7]] = True
    set_p(pol, 10)
    pol.history.nu[[1, 3, 4, 6]] = [INF, 5, INF, INF]  # (5: a predicted use that the pointer has passed)
    pol.history.nu[7] = 12
    pol.on_free(np.array([1, 3, 4, 6]))
    for k in (3, 5):
        # WHEN k victims are chosen (by the kernel, from the highest block down, and by the NumPy reference)
        (vict, _), (ref, _) = rank(pol, view, EMPTY_W, k)
        # THEN the dead blocks leave from the highest address down, then the live block
        assert vict.tolist() == ref.tolist() == [6, 4, 3, 1, 7][:k]


def test_without_known_accesses_it_learns_from_faults():
    pol = UvmPrefetchPolicy(window=2, adaptive_window=False, advice=False)
    view = FakeView(16, 16)
    pol.on_start(ctx(16, 16))
    got = {}
    drive(pol, view, SEQ, 3, known_accesses=False, forget=True,
          on_decision=lambda it, k, dec: got.setdefault((it, k), [] if dec is None else dec.prefetch.tolist()))
    assert {2, 3, 4, 5} <= set(got[(2, 0)])


def test_window_monitor_widens_on_late_and_narrows_on_thrash():
    m = WindowMonitor(init=16, lo=2, hi=64, patience=2)
    for i in range(4):
        m.late(i)
    assert m.window == 64  # two widenings (2 late events each)
    for i in range(12):
        m.thrash(10 + i)
    assert m.window == 8  # three narrowings (4 thrash events each: narrowing is slower)
    assert m.log[0] == (0, 16) and m.log[-1] == (21, 8)
    fixed = WindowMonitor(init=16, lo=2, hi=64, patience=1, adaptive=False)
    fixed.late(0)
    assert fixed.window == 16 and fixed.late_events == 1


def test_advice_read_mostly_for_blocks_never_written():
    pol = UvmPrefetchPolicy(window=2, adaptive_window=False)
    view = FakeView(16, 16)
    pol.on_start(ctx(16, 16))
    advised = []
    drive(pol, view, SEQ, 3, on_decision=lambda it, k, d: advised.extend(d.advise if d is not None else ()))
    rm = set()
    for blocks, adv in advised:
        if adv == Advice.READ_MOSTLY:
            rm |= set(blocks.tolist())
    # drive() writes the first block of each launch: only the second ones are read-only
    assert rm == {1, 3, 5, 7}


def test_history_is_bounded():
    pol = UvmPrefetchPolicy(history_launches=16, window=4, window_min=1, advice=False)
    view = FakeView(16, 16)
    pol.on_start(ctx(16, 16))
    drive(pol, view, SEQ, 20)
    rep = pol.report()
    assert rep["history_launches"] <= 16 and rep["state_bytes"] > 0
    assert rep["matched"] > 40  # still predicting after trims


@pytest.mark.parametrize("history", [300, 1 << 17])
def test_history_holds_every_kept_launch_after_trims_and_growth(history):
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.format import load

    # GIVEN the shipped trace's 2 267 launches, the history trimmed (300) or grown from its first 1 024 positions
    tr = load(SMALL)
    pol = make_policy(f"uvmprefetch:history_launches={history}")
    seen, launch = [], pol.on_launch

    def on_launch(info, state):
        seen.append((int(info.name), info.blocks.copy()))
        return launch(info, state)

    pol.on_launch = on_launch
    # WHEN it is replayed
    replay(tr, pol, "h100-pcie-lit", oversub=1.5)
    # THEN each kept position holds its launch's kernel and blocks (position k is launch k; the last launch is
    # still pending), the per-position buffers have room for what is kept, and the flat buffers end with the
    # last position's blocks
    h = pol.history
    base = int(h.r["base"])
    assert h.end == len(seen) - 1 and (base > 0) == (history == 300)
    for pos in range(base, h.end):
        name, blocks = seen[pos]
        assert h.view("h_name")[pos - base] == name
        np.testing.assert_array_equal(h.blocks_at(pos), blocks)
    assert h.view("f_next").shape == h.view("f_blk").shape == (int(h.r["fn"]),)
    assert (h.f_next[int(h.r["fn"]):] == INF).all() and not h.f_w[int(h.r["fn"]):].any()  # (the fill)


def test_launch_signature_is_a_deterministic_hash_of_the_name_and_blocks():
    b = np.array([3, 7, 11], dtype=np.int64)
    s = correlation.launch_sig(5, b)
    # the same launch, the same key (in any process: no salted hash); another name, another block, one more
    # block, or blocks moved by one, another key; never 0 (the tables' "none")
    assert s == correlation.launch_sig(5, b.copy()) != 0
    sig = correlation.launch_sig
    others = {sig(6, b), sig(5, b[:2]), sig(5, np.array([3, 7, 12])), sig(5, np.append(b, 12)), sig(5, b + 1),
              sig(5, np.zeros(0, np.int64))}
    assert s not in others and len(others) == 6


@pytest.mark.parametrize("spec", ["uvmprefetch:window=0", "uvmprefetch:window_min=8,window_max=4",
                                  "uvmprefetch:window=9000",
                                  "uvmprefetch:margin=0.9", "uvmprefetch:bogus=1", "uvmprefetch:pace=maybe",
                                  "uvmprefetch:victim_pool=-1", "uvmprefetch:pool_launches=0",
                                  "uvmprefetch:batch_share=2", "uvmprefetch:batch_share=-0.1"])
def test_bad_params_raise_one_config_error(spec):
    with pytest.raises(ConfigError):
        make_policy(spec)


@pytest.mark.parametrize("name,says", [("deadline", "was removed"), ("whole", "whole_launches"),
                                       ("guard_soft", "was removed"), ("guess_unpredicted", "was removed"),
                                       ("soft_moves", "was removed"), ("fault_late", "fault_late_soft"),
                                       ("invalidate_always", "renamed invalidate_without_discard")])
def test_a_removed_parameter_is_named_with_what_became_of_it(name, says):
    # GIVEN a spec or a keyword naming a parameter that existed once WHEN the policy is made THEN one error names
    # the parameter and says what became of it
    for make in (lambda: make_policy(f"uvmprefetch:{name}=true"), lambda: UvmPrefetchPolicy(**{name: True})):
        with pytest.raises(ConfigError, match=f"parameter {name} .*{says}"):
            make()


def test_on_the_simulator_beats_demand_and_deepum():
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.patterns import batch_change

    t = batch_change(iterations=4, at=2, layers=6)
    res = {p: replay(t, p, "h100-pcie-lit", oversub=2.0) for p in ("demand", "deepum", "uvmprefetch", "oracle")}
    assert res["uvmprefetch"]["time_s"] < res["deepum"]["time_s"] < res["demand"]["time_s"] * 1.01
    assert res["uvmprefetch"]["time_s"] < 0.7 * res["demand"]["time_s"]
    rep = res["uvmprefetch"]["policy_report"]
    assert rep["window_log"] and rep["state_bytes"] > 0


@pytest.mark.parametrize("cls", [UvmPrefetchPolicy, ReferencePolicy])
def test_busy_link_leaves_only_older_data_of_a_soft_next_launch_to_fault(cls):
    # GIVEN the 4-launch loop where launch 2 reads what launch 0 wrote (block 0: an activation) and two blocks
    # that change every iteration (routing-like: a soft slot), after two iterations
    pol = cls(window=4, adaptive_window=False, advice=False)
    view = FakeView(64, 64)
    pol.on_start(ctx(64, 64))

    def launch(i, it, k):
        blocks = np.array([0, 8 + 2 * it, 9 + 2 * it]) if k == 2 else SEQ[k]
        info = LaunchInfo(index=i, exec_id=1000 + k, name=k, phase=1, iteration=it, duration=1e-3,
                          blocks=blocks, write_blocks=blocks[1:2] if k == 2 else blocks[:1])
        dec = pol.on_launch(info, view)
        view.apply(dec)
        view.resident[blocks] = True
        return dec

    i = 0
    for it in range(2):
        for k in range(4):
            launch(i, it, k)
            i += 1
        pol.on_iteration(it)
    launch(i, 2, 0)  # (rewrites block 0: this iteration's data)
    # WHEN launch 1 runs with the H2D queue busy for a second, and block 0 and the guesses (last iteration's
    # blocks 10, 11: older data) are off the GPU
    gone = np.array([0, 10, 11])
    view.resident[gone] = False
    pol.on_evict(gone)
    view.now = 10.0
    pol.plan.r["q_end"] = 11.0
    dec = pol.on_launch(LaunchInfo(index=i + 1, exec_id=1001, name=1, phase=1, iteration=2, duration=1e-3,
                                   blocks=SEQ[1], write_blocks=SEQ[1][:1]), view)
    # THEN the guesses, which the queue would deliver after launch 2 starts, are left to fault (a fault goes
    # ahead of the queue), but this iteration's activation is prefetched: its prediction is not a guess
    pf = set() if dec is None else set(dec.prefetch.tolist())
    assert 0 in pf and not pf & {10, 11}
    assert pol.report()["soft"] > 0


def test_predicted_compute_time_between_history_positions():
    # GIVEN launches of known durations recorded once
    pol = UvmPrefetchPolicy(window=4, advice=False)
    view = FakeView(16, 16)
    pol.on_start(ctx(16, 16))
    durs = [1e-3, 2e-3, 3e-3, 4e-3]
    for i, (blocks, d) in enumerate(zip(SEQ * 2, durs * 2)):
        info = LaunchInfo(index=i, exec_id=1000 + i % 4, name=i % 4, phase=1, iteration=i // 4, duration=d,
                          blocks=blocks, write_blocks=blocks[:1])
        view.apply(pol.on_launch(info, view))
        view.resident[blocks] = True
    # THEN from the start of position 1 to the start of position 3: launches 1 and 2 run (2 + 3 ms)
    assert pol.history.until(0, 3) == pytest.approx(5e-3)
    assert pol.history.until(0, np.array([1, 2, 4])) == pytest.approx([0.0, 2e-3, 9e-3])


def test_default_is_not_slower_than_demand_on_moe():
    # data-dependent expert weights: no guard on soft slots, so next-launch guesses the queue would deliver
    # late are left to faults (fault_late_soft) instead of clogging the link
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.patterns import moe

    t = moe(iterations=4)
    for ov in (2.0, 3.0):
        ours = replay(t, "uvmprefetch", "h100-pcie-lit", oversub=ov)["time_s"]
        dem = replay(t, "demand", "h100-pcie-lit", oversub=ov)["time_s"]
        assert ours <= 1.05 * dem, (ov, ours, dem)


# ------------------------------------------------------------------ the compiled parts against NumPy
def _random_state(rng, n=400, ties=True):
    """A started policy with a random residency state: few distinct next uses / last uses (many equal keys)."""
    pol = UvmPrefetchPolicy(advice=False, dead_reuse=bool(rng.random() < 0.5))  # both victim orders
    pol.on_start(ctx(n, n))
    view = FakeView(n, n)
    view.resident[:] = rng.random(n) < rng.uniform(0.2, 0.95)
    pol.blocks.dead[:] = rng.random(n) < rng.uniform(0.0, 0.3)
    pol.blocks.dirty[:] = rng.random(n) < 0.5
    span = 6 if ties else 10**6
    set_p(pol, int(rng.integers(-1, 5)) if rng.random() < 0.9 else None)
    nu = rng.integers(0, span + 8, n)
    nu[rng.random(n) < 0.3] = INF  # no predicted use
    pol.history.nu[:] = nu
    pol.blocks.last_use[:] = rng.integers(0, span, n)
    cur = np.sort(rng.choice(n, int(rng.integers(0, 8)), replace=False)).astype(np.int64)
    return pol, view, cur


def _rank_args(pol):
    bs = pol.blocks
    p = pol.history.p if pol.history.p is not None else -1
    return (bs.dead, pol.history.nu, bs.dirty, bs.last_use, pol.params.dead_reuse, int(pol.victims.s[0]["gmask"])), p


@pytest.mark.parametrize("ties", [True, False])
def test_victim_ranking_matches_the_reference(ties):
    # GIVEN random residency states, with and without many equal victim keys
    rng = np.random.default_rng(7)
    tied_cuts = 0
    for _ in range(300):
        pol, view, cur = _random_state(rng, ties=ties)
        k = int(rng.integers(1, 400))  # small and large k (the kernel's heaps are bounded by k)
        # WHEN the kernel and the NumPy reference choose up to k victims
        (vict, vkey), (rv, rk) = rank(pol, view, cur, k)
        # THEN they choose the same blocks in the same order, with the same keys (equal keys by block id)
        assert np.array_equal(vkey, rk) and np.array_equal(vict, rv)
        assert np.all(np.diff(vkey) <= 0) and not np.isin(vict, cur).any() and view.resident[vict].all()
        tied_cuts += bool(vkey.shape[0] > 1 and (vkey[1:] == vkey[:-1]).any())
        # AND the state is not disturbed (scratch left zeroed)
        assert not pol.victims.mark.any()
    assert not ties or tied_cuts  # equal keys were exercised


def test_victims_among_listed_ids_in_any_order_match_a_full_scan():
    # GIVEN random residency states (many equal keys) and a random subset of the block ids, listed shuffled
    rng = np.random.default_rng(11)
    for _ in range(300):
        pol, view, cur = _random_state(rng)
        n = view.resident.shape[0]
        ids = rng.permutation(np.flatnonzero(rng.random(n) < rng.uniform(0.05, 1.0))).astype(np.int64)
        k = int(rng.integers(1, 300))
        state, p = _rank_args(pol)
        # WHEN victims are chosen among the listed ids, and by a full scan of a residency holding only those
        only = np.zeros(n, dtype=bool)
        only[ids] = True
        vb, vk, _ = victims.rank(view.resident, cur, state, p, k, pol.victims.mark, ids)
        fb, fk, _ = victims.rank(view.resident & only, cur, state, p, k, pol.victims.mark)
        # THEN the same blocks in the same order (ties by block id, whatever the order of the list)
        assert np.array_equal(vb, fb) and np.array_equal(vk, fk)
        assert not pol.victims.mark.any()


def test_full_victim_scan_buffer_chooses_as_the_heap():
    # GIVEN random residency states over thousands of blocks (many equal keys, so that the buffer of a full scan
    # fills and is cut back several times), and k from the buffer's threshold up
    rng = np.random.default_rng(5)
    cuts = 0
    for _ in range(120):
        pol, view, cur = _random_state(rng, n=int(rng.integers(600, 4000)), ties=bool(rng.random() < 0.7))
        n = view.resident.shape[0]
        k = int(rng.integers(1, 300))
        state, p = _rank_args(pol)
        # WHEN a full scan chooses k victims (the buffer), and the heap chooses among every id, listed in order
        fb, fk, _ = victims.rank(view.resident, cur, state, p, k, pol.victims.mark)
        hb, hk, _ = victims.rank(view.resident, cur, state, p, k, pol.victims.mark, np.arange(n, dtype=np.int64))
        # THEN the same blocks in the same order with the same keys
        assert np.array_equal(fb, hb) and np.array_equal(fk, hk)
        assert not pol.victims.mark.any()
        live = view.resident & ~np.isin(np.arange(n), cur)
        cuts += int(live.sum() > 4 * k)
    assert cuts > 20  # the buffer was cut back during scans


def test_full_victim_scan_over_resident_runs_matches_the_reference():
    # GIVEN states as a training run leaves them: residency in runs with long gaps (whole chunks of the scan
    # without a resident block), least-recently-used keys that rise block after block (the older, the lower the
    # block), runs of dead blocks with no predicted use, and a number of blocks that is no multiple of a chunk
    rng = np.random.default_rng(13)
    kinds = set()
    for _ in range(150):
        n = int(rng.integers(3, 40)) * victims.CHUNK + int(rng.integers(0, victims.CHUNK))
        pol, view, cur = _random_state(rng, n=n, ties=bool(rng.random() < 0.5))
        edges = np.sort(rng.choice(n, 2 * int(rng.integers(1, 8)), replace=False))
        view.resident[:] = False
        for a, b in edges.reshape(-1, 2):
            view.resident[a:b] = True
        if rng.random() < 0.5:  # the LRU order of an iteration whose pointer passed every prediction
            pol.history.nu[:] = INF
            pol.blocks.last_use[:] = n - np.arange(n) + rng.integers(0, 3, n)
        if rng.random() < 0.5:  # a run of freed tensors
            a = int(rng.integers(0, n))
            pol.blocks.dead[a:a + int(rng.integers(1, 4 * victims.CHUNK))] = True
        k = int(rng.integers(1, 400))
        # WHEN the full scan and the NumPy reference choose up to k victims
        (vict, vkey), (rv, rk) = rank(pol, view, cur, k)
        # THEN the same blocks in the same order with the same keys, and the scratch is left zeroed
        assert np.array_equal(vict, rv) and np.array_equal(vkey, rk)
        assert not pol.victims.mark.any()
        kinds.add("all dead" if vkey.size and vkey[-1] == victims.K_DEAD else "mixed")
        kinds.add("k found" if vkey.size == k else "fewer than k")
    assert kinds == {"all dead", "mixed", "k found", "fewer than k"}


def _decisions(tr, spec, oversub):
    """Every on_launch decision of a replay under ``spec``, and the policy."""
    from uvmprefetch.sim.replay import replay

    pol = make_policy(spec)
    launch = pol.on_launch
    log = []

    def on_launch(info, state):
        d = launch(info, state)
        log.append(None if d is None else tuple(np.asarray(a).tolist() for a in (d.prefetch, d.evict, d.discard)))
        return d

    pol.on_launch = on_launch
    r = replay(tr, pol, "h100-pcie-lit", oversub=oversub)
    return log, r["time_s"], pol


def _trace(name):
    from uvmprefetch.sim.synthetic import training_trace
    from uvmprefetch.trace.format import load
    from uvmprefetch.trace.patterns import alternating_seq, moe

    return {"moe": moe, "alternating": alternating_seq, "synthetic": lambda: training_trace(layers=12, iterations=4),
            "gpt2-small": lambda: load(SMALL)}[name]()


@pytest.mark.parametrize("name", ["moe", "synthetic", "gpt2-small"])
def test_victim_pool_makes_the_full_scans_decisions(name):
    # GIVEN traces where moves are learned (MoE's soft slots, the shipped trace's allocator) and one without
    tr = _trace(name)
    levels = (1.5, 1.7) if name == "gpt2-small" else (2.0, 3.0)  # (1.7: the most the shipped trace allows)
    for oversub in levels:
        # WHEN it is replayed with victims from the pool and with a full scan every time
        pooled, t_pool, pol = _decisions(tr, "uvmprefetch", oversub)
        full, t_full, _ = _decisions(tr, "uvmprefetch:victim_pool=0", oversub)
        # THEN the pool served victim choices, and every decision is the same (it misses no block whose key rose)
        assert pol.stats["pooled_victim_scans"] > 0 and pol.stats["pool_refills"] > 0
        assert pooled == full and t_pool == t_full
        # (every one learns moves, which the pool stays in use through)
        assert pol.stats["moved_blocks"] > 0


def test_due_predictions_join_the_pool_when_the_pointer_reaches_them():
    from uvmprefetch.policy.uvmprefetch.history import History

    rng = np.random.default_rng(11)
    n, npos = 96, 40
    for _ in range(20):
        # GIVEN a record of positions with random blocks, and predictions due at random positions, some pushed twice
        h = History(n, 1 << 20, 1 << 20)
        for t in range(npos):
            h.append(t, t, t, np.unique(rng.integers(0, n, 3)))
        vs = victims.Victims(n, 8, 64, False)
        vs.r["on"] = True
        due = {}
        for _ in range(60):
            x = int(rng.integers(0, n))
            t = int(rng.integers(1, npos))
            h.nu[x] = t
            victims.due_settled(vs.ref, np.array([x]), h.nu, 0)
            due[x] = min(due.get(x, INF), t)
        # ... and some of them predicted further on by now (a later use was learned)
        later = {x: t + int(rng.integers(1, 5)) for x, t in due.items() if rng.random() < 0.3 and t + 5 < npos}
        for x, t in due.items():
            h.nu[x] = later.get(x, t)
        remap = np.arange(n, dtype=np.int64)
        for q in range(1, npos):
            # WHEN the pointer reaches each position in turn
            victims.pool_due(vs.ref, h.ref, remap, q)
            # THEN each block due by then is in the pool, and one predicted further on stays due there
            for x, t in due.items():
                if t <= q:
                    assert vs.in_pool[x]
                    want = later[x] if x in later and later[x] > q else INF
                    assert vs.due_at[x] == want
                else:
                    assert vs.due_at[x] == t
            assert vs.r["nd"] == sum(vs.due_at < INF)


def test_a_rekeyed_block_is_due_only_where_no_position_takes_it_into_the_pool():
    from uvmprefetch.policy.uvmprefetch.history import History

    # GIVEN a record whose position 5 holds blocks 3 and 7, and moves that send block 3 to block 10
    n = 32
    h = History(n, 1 << 10, 1 << 10)
    for t in range(10):
        h.append(t, t, t, np.array([3, 7]) if t == 5 else np.array([20 + t]))
    remap = np.arange(n, dtype=np.int64)
    remap[3] = 10
    vs = victims.Victims(n, 8, 64, False)
    vs.r["on"] = True
    # ... and a move's new next uses: at 5 through the remap (10), as recorded (7), at 5 where neither leads to
    # (12: a prediction carried from a block the moves had already sent elsewhere), behind the pointer, none
    touched = np.array([10, 7, 12, 13, 14])
    h.nu[touched] = [5, 5, 5, 0, INF]
    # WHEN the pool takes them in with the pointer at 1
    victims.pool_rekey(vs.ref, h.ref, remap, touched, 1)
    # THEN all join the pool, and only 12 is due (at 5); the pointer reaching 5 drains it
    assert vs.in_pool[touched].all()
    assert [int(vs.due_at[x]) for x in touched] == [INF, INF, 5, INF, INF] and vs.r["nd"] == 1
    victims.pool_due(vs.ref, h.ref, remap, 4)
    assert vs.r["nd"] == 1
    victims.pool_due(vs.ref, h.ref, remap, 5)
    assert vs.r["nd"] == 0 and vs.due_at[12] == INF


def test_without_discards_a_full_scan_refills_the_pool_after_learned_moves():
    """Where frees are not deaths (no discards) the pool is not kept up through learned moves: a live block whose
    predicted use the pointer passes can rise outside it there (T5 base at 2x: 267 such launches, and other victims
    than a full scan's), so the pool waits for a full scan after them; with discards it is kept up."""
    from uvmprefetch.sim.replay import replay

    for discards in (False, True):
        # GIVEN a replay of the shipped trace, whose allocator moves tensors, with and without discards
        pol = make_policy("uvmprefetch")
        replay(_trace("gpt2-small"), pol, "h100-pcie-lit", oversub=1.5, discards=discards,
               evict=None if discards else "uvm")
        # THEN the pool is kept up through moves only with discards, and moves were learned either way
        assert bool(pol.victims.r["through_moves"]) is discards
        assert pol.stats["moved_blocks"] > 0


@pytest.mark.parametrize("name", ["moe", "synthetic", "gpt2-small"])
def test_no_block_outside_the_victim_pool_outranks_its_floor_while_moves_are_learned(name):
    """The pool kept up incrementally (learned moves rekeyed, due predictions drained) against a full scan after
    every launch: no resident block outside the pool ranks above the refill's lowest (key, block)."""
    from uvmprefetch.sim.replay import replay

    tr = _trace(name)
    for oversub in ((1.5, 1.7) if name == "gpt2-small" else (2.0, 3.0)):
        # GIVEN a replay under the pool
        pol = make_policy("uvmprefetch")
        launch = pol.on_launch
        checked = {"all": 0, "moving": 0}

        def on_launch(info, state, _launch=launch, _pol=pol, _checked=checked):
            d = _launch(info, state)
            vr, mv = _pol.victims.r, _pol.moves.r
            p = _pol.history.p
            if vr["on"] and p is not None and p >= vr["stale"]:
                # WHEN a full scan ranks every resident block outside the pool
                bs = _pol.blocks
                keys = (bs.dead, _pol.history.nu, bs.dirty, bs.last_use, _pol.params.dead_reuse,
                        int(_pol.victims.s[0]["gmask"]))
                outside = state.resident & ~_pol.victims.in_pool[:state.resident.shape[0]]
                best, _, _ = victims.rank(outside, EMPTY_W, keys, p, 1, _pol.victims.mark)
                # THEN its best ranks at or below the floor (-1: the pool held every candidate)
                if best.size:
                    key = victims._full_key(best[0], keys, p)
                    assert vr["min"] >= 0 and (key, best[0]) <= (vr["min"], vr["min_b"]), (name, oversub, p)
                _checked["all"] += 1
                _checked["moving"] += _pol.stats["moved_blocks"] != mv["moved_at_start"]
            return d

        pol.on_launch = on_launch
        replay(tr, pol, "h100-pcie-lit", oversub=oversub)
        # (checked in iterations that learned moves, where the pool used to wait for a full scan)
        assert checked["moving"] > 0 and pol.stats["pooled_victim_scans"] > 0


def test_victim_scan_stops_at_the_ids_in_use():
    from uvmprefetch.policy.base import ids_in_use

    rng = np.random.default_rng(3)
    for _ in range(50):
        # GIVEN a state whose blocks above some id were never used (the live runtime's arrays span the device)
        pol, view, cur = _random_state(rng, ties=False)
        n = int(rng.integers(1, view.resident.shape[0]))
        view.resident[n:] = False
        cur = cur[cur < n]
        state, p = _rank_args(pol)
        full = victims.rank(view.resident, cur, state, p, 20, pol.victims.mark)
        # WHEN the view says ids stop at n
        view.n_ids = n
        assert ids_in_use(view) == n
        part = victims.rank(view.resident[:ids_in_use(view)], cur, state, p, 20, pol.victims.mark)
        # THEN the victims are the same
        assert np.array_equal(full[0], part[0]) and np.array_equal(full[1], part[1])
        del view.n_ids
        assert ids_in_use(view) == view.resident.shape[0]


def test_window_pass_matches_the_reference():
    rng = np.random.default_rng(11)
    n = 64
    skipped = 0
    for trial in range(240):
        # GIVEN a recorded history of random launches (some touching nothing; reads, writes and first writes of new
        # tensors) and a random residency; the pointer follows an earlier iteration's record with moves learned
        # against it (with and without moved_births, dead_births), or this iteration's with a layer stride, or neither
        pol = ReferencePolicy(advice=False, moved_births=bool(trial % 2), dead_births=bool(trial // 2 % 2))
        pol.on_start(ctx(n, n))
        view = FakeView(n, n)
        h, mv, bs = pol.history, pol.moves, pol.blocks
        for i in range(int(rng.integers(4, 40))):
            blocks = np.sort(rng.choice(n, int(rng.integers(0, 6)), replace=False)).astype(np.int64)
            wmask = rng.integers(0, 3, blocks.shape[0]).astype(np.int8)
            h.append(i % 7, i % 5, i, blocks, wmask, dur=float(rng.random()))
        view.resident[:] = rng.random(n) < 0.5
        view.in_flight[:] = ~view.resident & (rng.random(n) < 0.2)
        present = view.resident | view.in_flight
        end = h.end
        p = int(rng.integers(0, end - 1))
        set_p(pol, p)
        bs.w_iter[:] = rng.integers(-1, 2, n)
        h.r["iters"] = 1
        lim, shift_from, kind = 0, INF, trial % 3
        if kind == 1:  # (moves apply to the positions before the end of the followed record)
            lim = int(rng.integers(p + 1, end + 2))
            h.starts[0], h.r["n_starts"], h.r["iter_start"] = lim, 1, max(lim, end) + 1
            pol.stats["moved_blocks"] = 1
            mv.remap[:] = rng.permutation(n)
            mv.rend[:] = rng.integers(0, end + 2, n)  # (where each recorded block's next tensor is born)
            bs.dead[:] = rng.random(n) < 0.3
        elif kind == 2:  # (the positions of this iteration shift by the layer stride)
            shift_from = int(rng.integers(0, p + 1))
            h.r["iter_start"] = shift_from
            mv.r["s_old"], mv.r["s_new"] = int(rng.integers(-9, 10)), int(rng.integers(-9, 10))
        nu0 = np.where(rng.random(n) < 0.5, rng.integers(0, end + 3, n), INF)
        lo = int(rng.integers(p + 1, end))
        hi = int(rng.integers(lo, end))
        cap = int(rng.integers(0, 20))
        miss = np.sort(rng.choice(n, int(rng.integers(0, 4)), replace=False)).astype(np.int64)
        miss = miss[~present[miss]]
        pa, pb = h.span(p + 1, p + 2) if trial % 4 else (0, 0)
        # WHEN the reference scans and lists the candidates (in NumPy)
        h.nu[:] = nu0
        scan_hi, sa, sb = pol._scan(lo, hi, cap, present)
        if not (miss.size or pb > pa or sb > sa):
            continue
        rb, rp = pol._candidates(miss, (pa, pb), (sa, sb, lo), p, present)
        nu_ref = h.nu.copy()
        tr = (mv.remap, mv.rend, lim, shift_from, int(mv.r["s_old"]), int(mv.r["s_new"]), bs.w_iter, 1, bs.dead,
              bool(pol.plan.r["moved_births"]), bool(mv.r["dead_births"]))

        def window(extra=-1, verified=(0, -1), whole=False):  # (the compiled pass over this trial's history and state)
            return plan.window_candidates(h.ref, miss, (pa, pb, lo, hi), p, cap, tr,
                                          (view.resident, view.in_flight, pol.plan.mark), verified, extra, whole)

        # THEN the compiled pass lists the same candidates at the same positions, stops at the same position and
        # brings the same next uses (one pass: the scan and the list together)
        h.nu[:] = nu0
        wb, wp, w_hi, spanned = window()
        assert np.array_equal(wb, rb) and np.array_equal(wp, rp) and w_hi == scan_hi and spanned == sb - sa
        assert np.array_equal(h.nu, nu_ref) and not pol.plan.mark.any()
        # AND with a limit on the candidates beyond the next launch, the list is the prefix holding every
        # candidate up to position p + 1 and that many more, the scan and the updates unchanged
        h.nu[:] = nu0
        extra = int(rng.integers(0, 6))
        cb, cp, c_hi, c_spanned = window(extra)
        keep = min(rb.size, int(np.count_nonzero(rp <= p + 1)) + extra)
        assert np.array_equal(cb, rb[:keep]) and np.array_equal(cp, rp[:keep])
        assert (c_hi, c_spanned) == (w_hi, spanned) and np.array_equal(h.nu, nu_ref)
        # AND with ``whole`` the prefix ends where the position of its last candidate but one ends, plus the first
        # candidate left out
        h.nu[:] = nu0
        near = int(np.count_nonzero(rp <= p + 1))
        keep_w = keep
        if extra >= 2 and near + extra - 2 < rb.size:
            keep_w = min(rb.size, int(np.count_nonzero(rp <= rp[near + extra - 2])) + 1)
        wb2, wp2, w_hi2, w_spanned = window(extra, whole=True)
        assert np.array_equal(wb2, rb[:keep_w]) and np.array_equal(wp2, rp[:keep_w])
        assert (w_hi2, w_spanned) == (w_hi, spanned) and np.array_equal(h.nu, nu_ref)
        if kind or lo > scan_hi:
            continue
        # AND a pass without translation or shift leaves its positions verified: a second pass skipping their
        # updates past the cut lists and updates exactly what a full second pass does ...
        again = []
        for span in ((0, -1), (lo, scan_hi)):
            h.nu[:] = nu_ref
            again.append(window(extra, span) + (h.nu.copy(),))
        assert all(np.array_equal(u, v) for u, v in zip(*again)), "skipping a verified span changed the pass"
        # ... and it does skip: a next use put behind the pointer inside the span is left there past the cut
        ent = h.span(lo, scan_hi + 1)
        if ent[1] == ent[0]:
            continue
        x = int(h.f_blk[ent[1] - 1])  # (recorded last in the span)
        left = []
        for span in ((0, -1), (lo, scan_hi)):
            h.nu[:] = nu_ref
            h.nu[x] = p
            window(extra, span)
            left.append(int(h.nu[x]) == p)
        assert not left[0]  # (the full pass always brings it ahead)
        skipped += left[1]
    assert skipped > 0


# ------------------------------------------------------------------ the whole policy against the reference
def _comparable(pol) -> dict:
    """The policy's state as the reference also keeps it: every part's scalars and arrays (their filled parts)
    but the victim pool's, the verified span and the scratch (which must be zero between hooks)."""
    h, c, mv, bs, adv = pol.history, pol.correlation, pol.moves, pol.blocks, pol.advice
    st = pol.state()
    st.pop("victims")
    for f in ("v_lo", "v_hi"):
        st["plan"].pop(f)
    for f in ("pooled_victim_scans", "pool_refills", "pool_waits_lifted"):
        st["counts"].pop(f)
    r = st["history"]
    arrays = {f: h.view(f) for f in ("h_cum", "h_key", "h_name", "h_sig", "h_soft", "h_ptr", "f_blk", "f_w",
                                     "f_next")}
    arrays.update(nu=h.nu, last_flat=h.last_flat, first_it=h.first_it, first_pos=h.first_pos,
                  starts=h.starts[:r["n_starts"]], pbuf=h.pbuf[:r["pk"]], wbuf=h.wbuf[:r["pk"] if r["phas_w"] else 0])
    arrays.update({f: getattr(c, f) for f in ("sig_pos", "stab_pos", "exec_pos", "name_pos", "ngram_count",
                                             "stab_count", "recent")})
    arrays.update(remap=mv.remap, rend=mv.rend, moved_to=mv.moved_to, missed=mv.missed, advice=adv.advice,
                  prev_uses=adv.prev_uses)
    arrays.update({f: getattr(bs, f) for f in ("dirty", "dead", "pf_unused", "thrashed", "written", "w_iter",
                                              "last_use", "uses")})
    assert not pol.plan.mark.any() and not pol.victims.mark.any(), "scratch left dirty"
    return {"scalars": st, "arrays": arrays, "monitor": pol.monitor.report()}


def _same_state(a: dict, b: dict) -> list:
    bad = [k for k in a["arrays"] if not np.array_equal(a["arrays"][k], b["arrays"][k])]
    bad += [f"{part}.{f}" for part, fs in a["scalars"].items() for f in fs if fs[f] != b["scalars"][part][f]]
    return bad + (["monitor"] if a["monitor"] != b["monitor"] else [])


def _lockstep(tr, spec, oversub, unknown=False, gpu="h100-pcie-lit", evict=None, discards=True):
    """A replay driving the policy and the reference in lock step (the reference decides first, on the same view):
    at every launch their decisions, and after every fourth launch and every iteration their state, must be equal.
    ``unknown``: the launches come without their accesses (the policy learns from faults); ``evict``: the replay's
    eviction paths. Returns ``(policy, launches compared)``."""
    from uvmprefetch.sim.replay import replay

    one = make_policy(spec)
    ref = ReferencePolicy(one.params)
    hooks = {h: (getattr(one, h), getattr(ref, h)) for h in ("on_start", "on_launch", "on_fault", "on_evict",
                                                             "on_free", "on_iteration")}
    count = [0]

    def both(h):
        f1, f2 = hooks[h]

        def call(*a):
            if unknown and h in ("on_launch", "on_fault"):
                a = (dataclasses.replace(a[0], known_accesses=False, blocks=EMPTY, write_blocks=EMPTY),) + a[1:]
            r2 = f2(*a)
            r1 = f1(*a)
            if h == "on_launch":
                d1, d2 = (None if d is None else (d.prefetch.tolist(), d.evict.tolist(), d.discard.tolist(),
                                                  d.populate.tolist(), [(b.tolist(), int(v)) for b, v in d.advise])
                          for d in (r1, r2))
                assert d1 == d2, f"launch {a[0].index}: decisions differ"
                count[0] += 1
            if h == "on_iteration" or (h == "on_launch" and count[0] % 4 == 0):  # (a difference persists)
                bad = _same_state(_comparable(one), _comparable(ref))
                assert not bad, f"after {h} ({count[0]} launches): state differs in {bad}"
            return r1

        return call

    for h in hooks:
        setattr(one, h, both(h))
    replay(tr, one, gpu, oversub=oversub, evict=evict, discards=discards)
    return one, count[0]


@pytest.mark.parametrize("name,spec,unknown", [
    ("gpt2-small", "uvmprefetch", False), ("moe", "uvmprefetch", False), ("synthetic", "uvmprefetch", False),
    ("alternating", "uvmprefetch", False), ("gpt2-small", "uvmprefetch", True), ("moe", "uvmprefetch", True),
    ("gpt2-small", "uvmprefetch:stable_sync=false,track_moves=false", False),
    ("gpt2-small", "uvmprefetch:history_launches=300,scan_max=256", False),
    ("gpt2-small", "uvmprefetch:invalidate=false,dead_reuse=false,stall_aware=false,lead_s=1e-4", False),
    ("gpt2-small", "uvmprefetch:pre_evict=false", False), ("gpt2-small", "uvmprefetch:prefetch=false", True),
    ("gpt2-small", "uvmprefetch:pace=false", False), ("gpt2-small", "uvmprefetch:follow_cold=false", False),
    ("moe", "uvmprefetch:writeback_clock=false", False),
    ("gpt2-small", "uvmprefetch:follow_later=false,dead_births=false,dead_misses=0", False),
    ("gpt2-small", "uvmprefetch:dead_misses=1", False), ("gpt2-small", "uvmprefetch:first_pos_boundary=false", False)])
def test_the_policy_decides_as_the_reference(name, spec, unknown):
    # GIVEN traces whose launches repeat exactly, move their activations (the shipped trace: the allocator),
    # follow soft slots (MoE) or change pattern, short of memory; with and without known accesses; the default
    # and the settings that take other branches (ablation switches, a trimmed history)
    tr = _trace(name)
    levels = (1.5, 1.7) if name == "gpt2-small" else (2.0, 3.0)
    for oversub in levels[:1 if ":" in spec or unknown else 2]:
        # WHEN the compiled policy and the Python reference run in lock step
        one, n = _lockstep(tr, spec, oversub, unknown)
        # THEN the same decisions at every launch and the same state throughout; and the run
        # made decisions of every kind the setting allows
        assert n == len(tr.launch_iter)
        rep = one.report()
        assert rep["prefetched_blocks"] > 0 or "prefetch=false" in spec
        assert rep["evicted_blocks"] + rep["discarded_blocks"] > 0 or "pre_evict=false" in spec


def test_the_policy_populates_as_the_reference():
    # GIVEN the shipped trace on the H100's measured costs, where the caller populates
    # WHEN the compiled policy and the reference run in lock step
    # (with first_writes_free the queue is idle where first writes miss, and none is populated: both settings)
    one, n = _lockstep(_trace("gpt2-small"), "uvmprefetch:first_writes_free=false", 1.7, gpu="h100-pcie")
    # THEN the same decisions throughout, populates among them
    assert n == len(_trace("gpt2-small").launch_iter) and one.report()["populated_blocks"] > 0
    one, n = _lockstep(_trace("gpt2-small"), "uvmprefetch", 1.7, gpu="h100-pcie")
    assert n == len(_trace("gpt2-small").launch_iter)


def test_whole_places_the_launch_the_budget_reaches_into_as_the_reference():
    # GIVEN the shipped trace and one whose sequence length alternates, at 1.5x on the H100's measured costs, where
    # evictions take the copy path (a fixed cost per copy-in call)
    from uvmprefetch.sim.replay import replay

    for name in ("gpt2-small", "alternating"):
        tr = _trace(name)
        # WHEN the policy with ``whole_launches`` and the reference run in lock step, and it is replayed with and without
        one, n = _lockstep(tr, "uvmprefetch:whole_launches=true", 1.5, gpu="h100-pcie", evict="auto")
        runs = [replay(tr, make_policy(s), "h100-pcie", oversub=1.5, evict="auto")
                for s in ("uvmprefetch:whole_launches=true", "uvmprefetch:whole_launches=false")]
        # THEN the same decisions throughout, and whole launches changed the run (on the alternating trace: fewer,
        # longer copy-in calls)
        assert n == len(tr.launch_iter)
        assert runs[0]["time_s"] != runs[1]["time_s"]
        if name == "alternating":
            assert runs[0]["repopulate_calls"] < runs[1]["repopulate_calls"]
    # ... and where the caller has no copy path (no per-call cost) it decides as without it
    tr = _trace("alternating")
    lit = [replay(tr, make_policy(s), "h100-pcie-lit", oversub=1.5)
           for s in ("uvmprefetch:whole_launches=true", "uvmprefetch:whole_launches=false")]
    assert lit[0]["time_s"] == lit[1]["time_s"] and lit[0]["bytes_htod"] == lit[1]["bytes_htod"]


def test_without_discards_driver_victims_leave_the_victims_of_exact_matches_to_the_driver():
    # GIVEN the shipped trace on the H100's measured costs at 1.7x, where evictions go through UVM and dead data is
    # not dropped (the live runtime's default)
    from uvmprefetch.sim.replay import replay

    tr = _trace("gpt2-small")
    specs = ("uvmprefetch:driver_victims_run=0", "uvmprefetch", "uvmprefetch:driver_victims=false")
    # WHEN the policy with ``driver_victims`` at any exact match and by default (once a run of exact matches is long
    # enough) and the reference run in lock step, and it is replayed with them and without the option
    for spec in specs[:2]:
        one, n = _lockstep(tr, spec, 1.7, gpu="h100-pcie", discards=False)
        assert n == len(tr.launch_iter)
    anyx, guarded, off = (replay(tr, make_policy(s), "h100-pcie", oversub=1.7, discards=False) for s in specs)
    # THEN the same decisions throughout; the driver evicted where the plan did before (the plan's own victims only
    # at soft matches, before the pointer follows a record and, by default, early in a run of exact matches: fewer
    # of them, fewest at any exact match)
    assert make_policy("uvmprefetch").params.driver_victims and make_policy("uvmprefetch").params.driver_victims_run > 0
    assert anyx["policy_evictions"] < guarded["policy_evictions"] < off["policy_evictions"]
    assert anyx["evictions"] > anyx["policy_evictions"] and guarded["evictions"] > guarded["policy_evictions"]
    assert len({anyx["time_s"], guarded["time_s"], off["time_s"]}) == 3
    # ... and where the caller discards, or where the decisions' calls run on the planning thread (no mover thread:
    # the plan's victims leave in time, and the driver's choice measured worse), it decides as without the option
    with_d = [replay(tr, make_policy(s), "h100-pcie", oversub=1.7) for s in specs]
    assert len({w["time_s"] for w in with_d}) == 1 and len({w["bytes_htod"] for w in with_d}) == 1
    sync = [replay(tr, make_policy(s), "h100-pcie", oversub=1.7, discards=False,
                   host="live-sync:measure_decision=false,decision_s=20e-6") for s in specs]
    assert len({w["time_s"] for w in sync}) == 1 and len({w["policy_evictions"] for w in sync}) == 1


def test_whole_launches_uvm_places_whole_launches_without_the_copy_path_as_the_reference():
    # GIVEN a trace whose sequence length alternates at 1.5x, where evictions leave by UVM's own eviction and dead
    # data is never dropped (the live runtime's defaults: no copy path)
    from uvmprefetch.sim.replay import replay

    tr = _trace("alternating")
    # WHEN the policy with ``whole_launches_uvm`` and the reference run in lock step, and it is replayed with and
    # without
    one, n = _lockstep(tr, "uvmprefetch:whole_launches_uvm=true", 1.5, gpu="h100-pcie", evict="uvm")
    runs = [replay(tr, make_policy(s), "h100-pcie", oversub=1.5, evict="uvm", discards=False)
            for s in ("uvmprefetch:whole_launches_uvm=true", "uvmprefetch")]
    # THEN the same decisions throughout, and whole launches changed the run where the default leaves it as it was
    assert n == len(tr.launch_iter)
    assert runs[0]["time_s"] != runs[1]["time_s"]


def test_at_soft_matches_the_pacing_budget_waits_for_the_plans_write_backs():
    # GIVEN a trace whose sequence length alternates (soft matches where it changes) on the H100's measured costs at
    # 1.5x, where the plan evicts dirty blocks for later launches
    from uvmprefetch.sim.replay import replay

    tr = _trace("alternating")
    # WHEN the policy and the reference run in lock step with the write-back clock, and it is replayed without
    one, n = _lockstep(tr, "uvmprefetch", 1.5, gpu="h100-pcie")
    with_clock = replay(tr, make_policy("uvmprefetch"), "h100-pcie", oversub=1.5)["time_s"]
    off = make_policy("uvmprefetch:writeback_clock=false")
    without = replay(tr, off, "h100-pcie", oversub=1.5)["time_s"]
    # THEN the same decisions throughout; the plan kept a predicted end of its write-backs (none without the clock),
    # which held its budget back at some decision (another run) and did not make it slower
    assert n == len(tr.launch_iter)
    assert float(one.plan.s[0]["d_end"]) > 0 and float(off.plan.s[0]["d_end"]) == 0
    assert with_clock != without and with_clock <= without


def test_on_the_copy_path_the_plan_places_batches_that_amortise_the_call_cost():
    # GIVEN a trace whose sequence length alternates on the H100's measured costs at 2x, evictions by the copy path
    # (a copy-in run costs repopulate_call_s + copy_call_s beside its blocks' link time)
    from uvmprefetch.gpus import get_profile
    from uvmprefetch.sim.replay import replay

    tr = _trace("alternating")
    gpu = get_profile("h100-pcie")
    # WHEN the policy and the reference run in lock step, and it is replayed with and without batches, and without
    # the copy path
    one, n = _lockstep(tr, "uvmprefetch:batch_share=0.1", 2.0, gpu="h100-pcie", evict="auto")
    runs = {}
    for spec in ("uvmprefetch:batch_share=0.1", "uvmprefetch"):
        r = replay(tr, make_policy(spec), gpu, oversub=2.0, evict="auto")
        runs[spec] = (r["repopulate_calls"], r["time_s"])
    uvm = make_policy("uvmprefetch:batch_share=0.1")
    replay(tr, uvm, gpu, oversub=2.0)
    # THEN the same decisions throughout; the batch is the fewest blocks whose link time is 10x a call's fixed cost
    # (8 on these costs) and none without the copy path (nor by default); the batches made fewer copy-in runs and a
    # faster run
    t_blk = gpu.transfer_time(2 << 20)
    want = int(np.ceil((gpu.repopulate_call_s + gpu.copy_call_s) / (0.1 * t_blk)))
    assert n == len(tr.launch_iter)
    assert int(one.plan.s[0]["batch"]) == want == 8 and int(uvm.plan.s[0]["batch"]) == 0
    default = make_policy("uvmprefetch")
    replay(tr, default, gpu, oversub=2.0, evict="auto")
    assert int(default.plan.s[0]["batch"]) == 0
    (calls, t), (calls0, t0) = runs["uvmprefetch:batch_share=0.1"], runs["uvmprefetch"]
    assert calls < calls0 and t < t0


def test_the_steps_entry_point_takes_only_arrays_of_the_types_it_was_kept_for(monkeypatch):
    from uvmprefetch.policy.uvmprefetch import step as S
    from uvmprefetch.trace.format import load

    tr = load(SMALL)
    ref, _, _ = _decisions(tr, "uvmprefetch", 1.5)
    # GIVEN a replay in which every third launch hands its blocks as a strided view and every third (another)
    # its written blocks read-only: the same values, other types than the step's entry point was kept for
    real_entry, real_step = S.entry_point, S.step
    seen = {"entry": 0, "entry_other": 0, "dispatcher_other": 0}

    def plain(a):
        return a.dtype == np.int64 and a.ndim == 1 and a.flags.carray

    def entry_point(kernel, args):
        ep = real_entry(real_step if kernel is step else kernel, args)

        def checked(*a):  # (the entry point must only ever see the types it was compiled for)
            seen["entry"] += 1
            if not (plain(a[2]) and plain(a[3])):
                seen["entry_other"] += 1
            return ep(*a)

        return checked if ep is not None else None

    def step(*a):  # (the dispatcher: hands the kernel plain copies, so that no other type is compiled here)
        if not (plain(a[2]) and plain(a[3])):
            seen["dispatcher_other"] += 1
        a = list(a)
        a[2], a[3] = np.ascontiguousarray(a[2]).copy(), np.ascontiguousarray(a[3]).copy()
        return real_step(*a)

    monkeypatch.setattr(S, "entry_point", entry_point)
    monkeypatch.setattr(S, "step", step)
    from uvmprefetch.sim.replay import replay

    pol = make_policy("uvmprefetch")
    launch = pol.on_launch
    log = []

    def on_launch(info, state):
        if info.index % 3 == 1:
            info.blocks = np.repeat(info.blocks, 2)[::2]
        elif info.index % 3 == 2:
            info.write_blocks = info.write_blocks.copy()
            info.write_blocks.setflags(write=False)
        d = launch(info, state)
        log.append(None if d is None else tuple(np.asarray(a).tolist() for a in (d.prefetch, d.evict, d.discard)))
        return d

    pol.on_launch = on_launch
    replay(tr, pol, "h100-pcie-lit", oversub=1.5)
    # THEN those launches went through the dispatcher, the entry point served the others and saw only its types,
    # and every decision is the one the plain replay made
    assert seen["entry"] > len(log) // 4 and seen["entry_other"] == 0
    assert seen["dispatcher_other"] > len(log) // 2
    assert log == ref
    # ... and for types a kernel was never called with there is no entry point (the caller keeps the dispatcher)
    assert real_entry(plan.missing, (np.zeros(3, np.int32), np.zeros(3, np.int8), np.zeros(3, np.int8))) is None


def test_learn_moves_kernel_matches_numpy():
    rng = np.random.default_rng(5)
    n = 32
    misses_seen = 0
    for _ in range(300):
        # GIVEN a recorded history whose second launch (position 1) wrote some blocks (the later ones read, write in
        # place, or write a new tensor into a dead block: f_w 0 / 1 / 2), and the blocks the running launch writes,
        # where a new block may be another recorded one (so reads must come before writes); dead_misses 0, 1 or 3
        dm = int(rng.choice([0, 1, 3]))
        pol = UvmPrefetchPolicy(advice=False, dead_misses=dm)
        pol.on_start(ctx(n, n))
        h, mv = pol.history, pol.moves
        k = int(rng.integers(1, 8))
        rec_blocks = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
        f_w = np.where(rng.random(k) < 0.7, 1 + (rng.random(k) < 0.5), 0).astype(np.int8)
        h.append(0, 0, 0, np.zeros(0, dtype=np.int64))
        h.append(1, 1, 1, rec_blocks, f_w)
        for i in range(2, int(rng.integers(2, 13))):
            b = np.sort(rng.choice(n, int(rng.integers(0, 6)), replace=False)).astype(np.int64)
            h.append(i, i, i, b, rng.integers(0, 3, b.shape[0]).astype(np.int8))
        h.r["iters"] = 1
        lim = int(rng.integers(2, h.end + 2))
        m = int((f_w != 0).sum()) if rng.random() < 0.9 else int(rng.integers(0, 4))
        writes = np.sort(rng.choice(n, m, replace=False)).astype(np.int64)
        h.nu[:] = rng.integers(0, 100, n)
        dead = pol.blocks.dead
        dead[:] = rng.random(n) < 0.3
        # (earlier moves this iteration: some recorded blocks already sent elsewhere, half of them with a birth
        # predicted here; births that went elsewhere so far; first uses this iteration)
        moved_before = rng.random(n) < 0.3
        mv.remap[moved_before] = rng.integers(0, n, int(moved_before.sum()))
        mv.rend[moved_before] = np.where(rng.random(int(moved_before.sum())) < 0.5, 1,
                                         rng.integers(0, h.end + 2, int(moved_before.sum())))
        mv.missed[:] = rng.integers(0, 4, n)
        h.first_it[:] = rng.integers(0, 2, n)
        h.first_pos[:] = rng.integers(0, 100, n)
        nu, remap, rend, missed = h.nu.copy(), mv.remap.copy(), mv.rend.copy(), mv.missed.copy()
        # WHEN the kernel pairs them, and the NumPy code does
        moved, _ = moves.learn_moves(mv.ref, h.ref, 1, writes, lim, dead)
        rec = rec_blocks[f_w != 0]
        want = 0
        if rec.shape[0] == writes.shape[0] and rec.size:
            mvd = rec != writes
            vals = nu[rec[mvd]]
            for x, w in zip(rec, writes):
                y = remap[x]
                if y != x and y != w and h.first_it[y] == 1:  # an earlier move's block: next used next step
                    nu[y] = h.first_pos[y]
                if x != w:  # the move holds up to the recorded block's next birth before the limit
                    if not dead[x]:  # (a live address: its births are not missed)
                        missed[x] = 0
                    elif rend[x] == 1:  # (the birth predicted here went elsewhere while it was dead)
                        missed[x] += 1
                        misses_seen += 1
                    remap[x] = w
                    births = [t for t in range(2, min(lim, h.end)) if x in h.blocks_at(t)
                              and h.f_w[h.span(t, t + 1)[0] + int(np.searchsorted(h.blocks_at(t), x))] == 2]
                    rend[x] = births[0] if births else lim
                    if births and not 0 < dm <= missed[x]:  # (dead or not: the next tensor at the address)
                        nu[x] = births[0]
                elif y != x:  # written where recorded: the tensor stayed
                    remap[x], rend[x], missed[x] = x, 0, 0
            nu[writes[mvd]] = vals
            want = int(mvd.sum())
        # THEN the moved count, the remap, where each move ends, the missed births, the moved blocks and the next
        # uses agree
        assert moved == want and np.array_equal(mv.remap, remap) and np.array_equal(mv.rend, rend)
        assert np.array_equal(mv.missed, missed)
        want_to = np.zeros(n, dtype=bool)
        if want:
            want_to[writes[rec != writes]] = True
        assert np.array_equal(mv.moved_to, want_to)
        assert np.array_equal(h.nu, nu)
    assert misses_seen > 20  # (the missed births were exercised)


def test_learn_shift_kernel_matches_numpy():
    rng = np.random.default_rng(23)
    n = 40
    hits = 0
    for trial in range(400):
        # GIVEN a recorded launch and a running one, often the recorded blocks moved by one stride per class
        w_iter = rng.integers(-1, 2, n)
        k = int(rng.integers(0, 7))
        rec = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
        rec_w = (rng.random(k) < 0.3).astype(np.int8)
        if trial % 2:
            d_old, d_new = int(rng.integers(-3, 4)), int(rng.integers(-3, 4))
            y = rec + np.where(w_iter[rec] == 1, d_new, d_old)
            keep = (y >= 0) & (y < n)
            blocks = np.unique(y[keep])
            w_iter_run = w_iter.copy()
            w_iter_run[blocks] = np.where(np.isin(blocks, y[keep & (w_iter[rec] == 1)]), 1, -1)
            w_iter = w_iter_run
        else:
            blocks = np.sort(rng.choice(n, int(rng.integers(0, 7)), replace=False)).astype(np.int64)
        writes = blocks[rng.random(blocks.shape[0]) < 0.2]
        # WHEN the kernel learns the stride, THEN it finds what the NumPy reference finds
        ok_o, d_o, ok_n, d_n = moves.learn_shift(rec, rec_w, (blocks, writes), w_iter, 1)
        ref = learn_shift_ref(rec, rec_w, blocks, writes, w_iter, 1)
        assert (bool(ok_o), bool(ok_n)) == (ref[0], ref[2]), (rec, rec_w, blocks, writes, trial)
        if ok_o:
            assert d_o == ref[1]
        if ok_n:
            assert d_n == ref[3]
        hits += bool(ok_o) + bool(ok_n)
    assert hits > 100  # the shifted trials do find strides


def _repeated_layers(layers=16, iterations=3, wbytes=8 << 20, abytes=6 << 20, kernels=3):
    """A training loop whose layers are the same ``kernels`` kernels (one name, one shape each) on other tensors,
    as in a transformer: only the blocks tell the layers apart."""
    from uvmprefetch.trace.format import READ, WRITE, TraceBuilder

    b = TraceBuilder(meta={"model": f"repeated-{layers}x{kernels}", "durations": "estimated"})

    def launch(name, acc, phase):
        b.launch(name, acc, duration=5e-6 + sum(ln for _, _, ln, _ in acc) / 1.6e12, phase=phase)

    w = [[b.alloc(wbytes, "param") for _ in range(kernels)] for _ in range(layers)]
    x = b.alloc(abytes, "input")
    for it in range(iterations):
        b.iteration = it
        acts = [x]
        for i in range(layers):
            for k in range(kernels):
                y = b.alloc(abytes, "activation")
                launch(f"fwd{k}", [(w[i][k], 0, wbytes, READ), (acts[-1], 0, abytes, READ), (y, 0, abytes, WRITE)],
                       "forward")
                acts.append(y)
        g = b.alloc(abytes, "activation")
        launch("loss", [(acts[-1], 0, abytes, READ), (g, 0, abytes, WRITE)], "backward")
        for i in reversed(range(layers)):
            for k in reversed(range(kernels)):
                j = i * kernels + k
                gx = b.alloc(abytes, "activation")
                launch(f"bwd{k}", [(g, 0, abytes, READ), (w[i][k], 0, wbytes, READ), (acts[j], 0, abytes, READ),
                                   (gx, 0, abytes, WRITE)], "backward")
                b.free(g)
                if j > 0:
                    b.free(acts[j + 1])
                g = gx
        b.free(acts[1])
        b.free(g)
    return b.build()


def test_layer_stride_predicts_the_next_layers_of_the_first_iteration():
    from uvmprefetch.sim.replay import replay

    # GIVEN a loop of identical layers, short of memory: in the first iteration nothing is recorded yet, and the
    # pointer can only follow the previous layer (same kernels, other blocks)
    tr = _repeated_layers()
    for oversub in (1.5, 2.0):
        with_, without = (replay(tr, spec, "h100-pcie-lit", oversub=oversub) for spec in
                          ("uvmprefetch", "uvmprefetch:layer_stride=false"))
        # WHEN the policy shifts the previous layer's blocks by the learned stride, THEN its prefetches find the
        # next layer's weights: the first iteration is shorter (measured 4.5 %), and the last one (where the
        # record of the iteration before is followed instead) is the same
        it_w, it_wo = with_["iteration_times_s"], without["iteration_times_s"]
        assert it_w[0] < 0.97 * it_wo[0], (oversub, it_w, it_wo)
        assert it_w[-1] == pytest.approx(it_wo[-1], rel=1e-3)


def test_stable_signature_finds_the_layer_when_activations_moved():
    # GIVEN a launch reading a weight block (old data) and an activation written earlier in this iteration
    w_iter = np.full(16, -1, dtype=np.int64)
    w_iter[[5, 9]] = 2
    blocks = np.array([1, 5, 7], dtype=np.int64)
    writes = np.array([7], dtype=np.int64)
    sig = correlation.stable_sig
    h = sig(blocks, writes, w_iter, 2, 1234)
    # WHEN the activation is elsewhere (the allocator moved it), THEN the signature is the same; another weight,
    # another kernel, or no older data at all give another signature (0: none)
    assert h != 0
    assert sig(np.array([1, 9, 11], dtype=np.int64), np.array([11], dtype=np.int64), w_iter, 2, 1234) == h
    assert sig(np.array([2, 5, 7], dtype=np.int64), writes, w_iter, 2, 1234) != h
    assert sig(blocks, writes, w_iter, 2, 1235) != h
    assert sig(np.array([5, 7], dtype=np.int64), writes, w_iter, 2, 1234) == 0


def _step(pol, view, i, it, name, blocks, writes):
    """One launch with known accesses; faulted blocks become resident. Returns the decision."""
    blocks = np.array(blocks, dtype=np.int64)
    info = LaunchInfo(index=i, exec_id=100 + name, name=name, phase=1, iteration=it, duration=1e-3, blocks=blocks,
                      write_blocks=np.array(writes, dtype=np.int64))
    dec = pol.on_launch(info, view)
    view.apply(dec)
    view.resident[blocks] = True
    return dec


def _a_moved(steps, **params):
    """A policy that recorded one step of launches ``steps`` (each ``(blocks, writes, freed before it)``; the first
    writes activation A into block 10), then, with nothing on the GPU and the pointer before the recorded step (as
    after the last launch of a step that preceded it), sees the next step's first launch write A into block 20 (the
    allocator moved it). Returns ``(policy, that launch's decision)``."""
    pol = UvmPrefetchPolicy(window=8, window_min=1, adaptive_window=False, advice=False, stable_sync=False, **params)
    n = 32
    view = FakeView(n, n)
    pol.on_start(ctx(n, n))
    for i, (blocks, writes, freed) in enumerate(steps):
        if freed:
            pol.on_free(np.array(freed))
        _step(pol, view, i, 0, i, blocks, writes)
    pol.on_iteration(0)
    h = pol.history
    assert h.f_w[h.span(2, 3)[0]] == 2  # (the record marks launch 2's write as a new tensor's first)
    view.resident[:] = False
    set_p(pol, -1)
    dec = _step(pol, view, len(steps), 1, 0, [1, 20], [20])
    assert h.p == 0 and pol.stats["moved_blocks"] == 1 and pol.moves.remap[10] == 20
    return pol, dec


def test_a_moved_block_whose_address_the_record_gives_to_a_later_tensor_is_predicted_there_too():
    # GIVEN a first step where activation A is written into block 10, read, freed, and block 10 then holds new data
    # that outlives the step (optimizer state: written while dead, read at the end)
    # WHEN the next step writes A elsewhere (block 10 still holds the state) and nothing is on the GPU
    pol, dec = _a_moved([([1, 10], [10], []), ([10, 11], [11], []), ([10, 12], [10], [10]), ([10, 11], [], [])])
    # THEN A's reads are predicted at 20, the move ends where the record writes the new tensor into 10, and 10 is
    # predicted (and prefetched) for the launches that use the state, not only its translation 20
    assert pol.moves.rend[10] == 2
    assert pol.history.nu[10] == 2
    assert dec is not None and 10 in set(dec.prefetch.tolist()) and 11 in set(dec.prefetch.tolist())


@pytest.mark.parametrize("moved_births", [True, False])
def test_a_recorded_new_tensor_is_not_prefetched_where_the_record_had_it_while_tensors_move(moved_births):
    # GIVEN a first step writing activation A into block 10, then a new tensor B into block 12 (freed memory handed
    # out again: its first write), then reading A
    # WHEN the next step writes A elsewhere (the allocator moved this step's tensors) and nothing is on the GPU
    pol, dec = _a_moved([([1, 10], [10], []), ([10, 11], [11], []), ([12], [12], [12]), ([10], [], [])],
                        moved_births=moved_births)
    # THEN the read data at 11 is prefetched; B's recorded block 12 is brought in only without moved_births (this
    # step's B goes elsewhere too), and its next use is predicted there either way (a later entry would list it)
    pf = set(dec.prefetch.tolist())
    assert {11} <= pf and 20 not in pf  # (20: the running launch's own block)
    assert (12 in pf) != moved_births
    assert pol.history.nu[12] == 2


@pytest.mark.parametrize("cls", [UvmPrefetchPolicy, ReferencePolicy])
@pytest.mark.parametrize("follow_cold,visit", [(True, 0.0), (False, 0.0), (True, 2.5)])
def test_following_the_cold_record_goes_on_by_name_before_an_exact_signature_elsewhere(cls, follow_cold, visit):
    # GIVEN a first step of two layers, each a kernel writing an activation (0) and one reading it with a buffer
    # every layer reads (1, block 2), the second layer's activation in block 20 (follow_cold_visit 2.5: follow_cold
    # acts only once the pointer's visits to this step's earlier launches lasted 2.5 launches on average)
    pol = cls(window=8, window_min=1, adaptive_window=False, advice=False, stable_sync=False,
              follow_cold=follow_cold, follow_cold_visit=visit)
    n = 32
    view = FakeView(n, n)
    pol.on_start(ctx(n, n))
    for i, (name, blocks, writes) in enumerate([(0, [1, 10], [10]), (1, [2, 10], []), (0, [3, 20], [20]),
                                                 (1, [2, 20], [])]):
        _step(pol, view, i, 0, name, blocks, writes)
    pol.on_iteration(0)
    set_p(pol, -1)
    # WHEN the next step's first layer writes its activation into block 20 (the allocator placed it elsewhere), so
    # that its reading launch has the exact signature of the recorded second layer's
    _step(pol, view, 4, 1, 0, [1, 20], [20])
    assert pol.history.p == 0
    _step(pol, view, 5, 1, 1, [2, 20], [])
    # THEN with follow_cold acting the pointer goes on to the record's next launch (the same kernel: a soft match);
    # without, or before any visit was seen, it jumps to the recorded second layer, whose blocks are this launch's
    assert pol.history.p == (1 if follow_cold and visit == 0 else 3)


@pytest.mark.parametrize("cls", [UvmPrefetchPolicy, ReferencePolicy])
@pytest.mark.parametrize("follow_later", [True, False])
def test_following_a_later_record_goes_on_by_name_before_an_exact_signature_behind_the_pointer(cls, follow_later):
    # GIVEN two steps of two layers recorded alike, each layer a kernel writing an activation (0) and one reading it
    # with a buffer every layer reads (1, block 2): the first layer's activation in block 10, the second's in 20
    pol = cls(window=8, window_min=1, adaptive_window=False, advice=False, stable_sync=False,
              follow_later=follow_later)
    n = 32
    view = FakeView(n, n)
    pol.on_start(ctx(n, n))
    layers = [(0, [1, 10], [10]), (1, [2, 10], []), (0, [3, 20], [20]), (1, [2, 20], [])]
    for it in range(2):
        for k, (name, blocks, writes) in enumerate(layers):
            _step(pol, view, 4 * it + k, it, name, blocks, writes)
        pol.on_iteration(it)
    # WHEN the third step follows the second's record (positions 4-7), its layers' activations placed in blocks 14
    # and 24, and its second layer's reading launch reads block 10: the exact signature of the recorded first
    # layer's (position 5, behind the pointer), while the record's next launch (7) is the same kernel
    for i, (name, blocks, writes) in enumerate([(0, [1, 14], [14]), (1, [2, 14], []), (0, [3, 24], [24])]):
        _step(pol, view, 8 + i, 2, name, blocks, writes)
    assert pol.history.p == 6
    _step(pol, view, 11, 2, 1, [2, 10], [])
    # THEN with follow_later the pointer goes on to the record's next launch (a soft match); without, it jumps back
    assert pol.history.p == (7 if follow_later else 5)


@pytest.mark.parametrize("cls", [UvmPrefetchPolicy, ReferencePolicy])
@pytest.mark.parametrize("follow_later,moved", [(True, True), (True, False), (False, True)])
def test_a_jump_back_to_an_older_record_is_kept_only_while_no_move_was_learned(cls, follow_later, moved):
    # GIVEN three steps of two layers recorded (positions 0-3, 4-7, 8-11), the first one's activations in blocks
    # 10 and 20, the two later ones' in 11 and 21
    pol = cls(window=8, window_min=1, adaptive_window=False, advice=False, stable_sync=False,
              follow_later=follow_later)
    n = 32
    view = FakeView(n, n)
    pol.on_start(ctx(n, n))
    for it, (a, b) in enumerate([(10, 20), (11, 21), (11, 21)]):
        for k, (name, blocks, writes) in enumerate([(0, [1, a], [a]), (1, [2, a], []), (0, [3, b], [b]),
                                                    (1, [2, b], [])]):
            _step(pol, view, 4 * it + k, it, name, blocks, writes)
        pol.on_iteration(it)
    # WHEN the fourth step follows the third's record, its first activation where the record has it or in block 15
    # (a move learned), and its second layer's reading launch reads block 10: an exact signature of the first
    # step's record only (position 1), while the followed record's next launch (11) is the same kernel
    a = 15 if moved else 11
    for i, (name, blocks, writes) in enumerate([(0, [1, a], [a]), (1, [2, a], []), (0, [3, 21], [21])]):
        _step(pol, view, 12 + i, 3, name, blocks, writes)
    assert pol.history.p == 10 and (pol.stats["moved_blocks"] != pol.moves.r["moved_at_start"]) == moved
    _step(pol, view, 15, 3, 1, [2, 10], [])
    # THEN with follow_later and a move learned the pointer goes on to the record's next launch; without a move (a
    # pattern returning) or without follow_later it jumps back to the older record
    assert pol.history.p == (11 if follow_later and moved else 1)


@pytest.mark.parametrize("lengths,acts", [((3, 2), True), ((1, 2), False), ((5,), False), ((2, 2, 4), True)])
def test_follow_cold_acts_once_the_visits_to_this_step_last_long_enough_on_average(lengths, acts):
    # GIVEN a policy after a first step of 4 launches (this step's launches begin at position 4) and follow_cold
    # acting from visits of 2.5 launches on average
    from uvmprefetch.policy.uvmprefetch.correlation import visit
    pol = UvmPrefetchPolicy(advice=False, follow_cold_visit=2.5)
    n = 16
    view = FakeView(n, n)
    pol.on_start(ctx(n, n))
    for i in range(4):
        _step(pol, view, i, 0, i, [i], [i])
    pol.on_iteration(0)
    for i in range(4):
        _step(pol, view, 4 + i, 1, i, [8 + i], [8 + i])
    assert pol.history.r["iter_start"] == 4 and not pol.correlation.r["cold_on"]
    # WHEN the pointer visits this step's launches from the cold record and comes back, each visit that many launches
    t = 100
    for k in lengths:
        visit(pol.correlation.ref, pol.history.ref, 2, 5, t)  # (record -> this step)
        visit(pol.correlation.ref, pol.history.ref, 6, 3, t + k)  # (back)
        t += k + 10
    # THEN follow_cold acts from the second visit on when they lasted 2.5 launches on average
    assert pol.correlation.r["cold_on"] == acts
    assert pol.correlation.r["visits"] == len(lengths)


def test_iteration_end_settles_the_next_use_of_moved_blocks():
    # GIVEN a block that took a recorded block's next use through a move, its prediction left behind the pointer
    pol = UvmPrefetchPolicy(advice=False)
    n = 16
    view = FakeView(n, n)
    pol.on_start(ctx(n, n))
    for i in range(6):
        _step(pol, view, i, 0, i, [i], [i])
    h = pol.history
    set_p(pol, 4)
    pol.stats["moved_blocks"] = 1
    pol.moves.moved_to[[2, 3]] = True
    h.nu[2] = 1  # passed
    h.nu[3] = 5  # ahead, but it came from the old address
    h.nu[5] = 5  # not moved and ahead: kept
    pol.plan.r["horizon"] = 6  # the plan went past their new positions while they were on the GPU
    # WHEN the iteration ends
    pol.on_iteration(0)
    # THEN the moved / stale blocks are next used where this iteration's record first has them, and the plan
    # goes back over those positions (an evicted one would otherwise be found only a launch before its use)
    assert h.nu[2] == h.first_pos[2] == 2 and h.nu[3] == 3 and h.nu[5] == 5
    assert not pol.moves.moved_to.any()
    assert pol.plan.r["horizon"] <= 2


def test_a_changed_module_drops_the_cached_kernels_that_call_it(tmp_path):
    import subprocess
    import sys

    # GIVEN a package of two modules whose cached kernel ``a.f`` calls ``b.g``, guarded as the policy's are
    pkg = tmp_path / "pk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from uvmprefetch.policy.uvmprefetch.parts import check_caches\n"
                                     "from . import a, b\nflushed = check_caches((a, b))\n")
    (pkg / "a.py").write_text("import numba as nb\n\nfrom .b import g\n\n\n@nb.njit(cache=True)\ndef f(x):\n"
                              "    return g(x) * 10\n")

    def run(step):
        (pkg / "b.py").write_text(f"import numba as nb\n\n\n@nb.njit(cache=True)\ndef g(x):\n    return x + {step}\n")
        env = {**__import__("os").environ, "PYTHONPATH": f"{REPO}:{tmp_path}"}
        r = subprocess.run([sys.executable, "-c", "import pk; print(pk.flushed, pk.a.f(1))"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    # WHEN it runs twice, THEN the second run loads the cache; WHEN only ``b`` changes, THEN the guard drops the
    # cache and ``f`` sees the new ``g`` (Numba alone would keep f's compiled copy of the old one: 20)
    assert run(1) == ["True", "20"]
    assert run(1) == ["False", "20"]
    assert run(2) == ["True", "30"]


def test_every_compiled_function_of_the_policy_releases_the_gil():
    # GIVEN the policy's modules (and the shared compiled table) WHEN their compiled functions are listed THEN
    # each releases the GIL while it runs (the policy may run on a planner thread beside a Python training loop)
    from numba.core.registry import CPUDispatcher

    from uvmprefetch.policy import tables
    from uvmprefetch.policy.uvmprefetch import blocks, history, step

    mods = (tables, history, correlation, moves, blocks, victims, plan, step)
    kernels = [v for m in mods for v in vars(m).values()
               if isinstance(v, CPUDispatcher) and v.py_func.__module__ == m.__name__]
    assert len(kernels) > 40
    assert [k.py_func.__name__ for k in kernels if not k.targetoptions.get("nogil")] == []


def test_a_negative_follow_cold_visit_is_refused_by_name():
    # GIVEN / WHEN a spec with a negative average visit length THEN the error names the parameter
    from uvmprefetch.errors import ConfigError
    with pytest.raises(ConfigError, match="follow_cold_visit"):
        UvmPrefetchPolicy(follow_cold_visit=-1)
