"""The address layout: caching-allocator placement, per-launch block sets, dead blocks, next use.

Differential tests compare the vectorised results with slow obvious references on random traces."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmprefetch.errors import ConfigError
from uvmprefetch.sim.layout import build_layout
from uvmprefetch.trace import READ, WRITE, TraceBuilder

MiB = 1 << 20


def test_small_tensors_pack_and_large_round_up():
    b = TraceBuilder()
    s1, s2 = b.alloc(1000), b.alloc(600 * 1024)  # small: 1024 B and 600 KiB, same 2 MiB segment
    big = b.alloc(3 * MiB)  # large: rounded to 4 MiB, after the small segment
    b.launch("k", [(s1, 0, 1000, READ), (s2, 0, 10, WRITE), (big, 0, 3 * MiB, READ)], duration=1e-6)
    lay = build_layout(b.build())
    assert lay.base[s1] // (2 * MiB) == lay.base[s2] // (2 * MiB)
    assert lay.base[s1] % 512 == 0 and lay.base[s2] % 512 == 0
    assert lay.base[big] % (2 * MiB) == 0
    assert lay.launch_blocks(0).tolist() == [0, 1, 2]
    assert lay.launch_writes(0).tolist() == [0]
    assert lay.reserved_bytes == 6 * MiB and lay.footprint_blocks == 3


def test_exactly_one_mib_is_small_like_pytorch():
    # PyTorch's get_pool sends size <= kSmallSize (1 MiB) to the small pool: two live 1 MiB tensors share one
    # 2 MiB segment. (Counting 1 MiB as large gave each its own 2 MiB and inflated a GPT-2 replay's footprint.)
    b = TraceBuilder()
    x, y = b.alloc(MiB), b.alloc(MiB)
    b.launch("k", [(x, 0, MiB, READ), (y, 0, MiB, WRITE)], duration=1e-6)
    lay = build_layout(b.build(), allocator="caching")
    assert lay.base[x] // (2 * MiB) == lay.base[y] // (2 * MiB)
    assert lay.reserved_bytes == 2 * MiB and lay.footprint_blocks == 1
    b2 = TraceBuilder()
    z = b2.alloc(MiB + 1)  # just above: large, rounded to 2 MiB
    b2.launch("k", [(z, 0, MiB + 1, READ)], duration=1e-6)
    assert build_layout(b2.build(), allocator="caching").reserved_bytes == 2 * MiB


def test_unknown_allocator():
    with pytest.raises(ConfigError, match="allocator"):
        build_layout(TraceBuilder().build(), allocator="buddy")


def test_freed_space_is_reused_and_dead_blocks_reported():
    b = TraceBuilder()
    a = b.alloc(4 * MiB)
    keep = b.alloc(2 * MiB)
    b.launch("w", [(a, 0, 4 * MiB, WRITE), (keep, 0, 1, WRITE)], duration=1e-6)
    b.free(a)
    c = b.alloc(2 * MiB)  # best fit reuses a's first 2 MiB
    b.launch("r", [(c, 0, 2 * MiB, READ)], duration=1e-6)
    lay = build_layout(b.build())
    assert lay.base[c] == lay.base[a]
    assert lay.dead_at(1).tolist() == [0, 1]  # both of a's blocks died before launch 1
    assert lay.dead_at(0).size == 0 and lay.dead_at(2).size == 0


def test_64k_blocks():
    b = TraceBuilder()
    x = b.alloc(2 * MiB)
    b.launch("k", [(x, 100 * 1024, 64 * 1024, READ)], duration=1e-6)  # straddles 64 KiB blocks 1 and 2
    lay = build_layout(b.build(), 64 * 1024)
    assert lay.launch_blocks(0).tolist() == [1, 2] and lay.max_blocks == 32


@pytest.mark.parametrize("bs", [3 * MiB, 1000, 4 * MiB])
def test_bad_block_size(bs):
    with pytest.raises(ConfigError, match="block size"):
        build_layout(TraceBuilder().build(), bs)


@st.composite
def traces(draw):
    b = TraceBuilder()
    live = []
    for i in range(draw(st.integers(1, 25))):
        for _ in range(draw(st.integers(0, 2))):
            live.append(b.alloc(draw(st.sampled_from([512, 70_000, 1 << 20, 3 << 20, 5_000_000]))))
        if not live:
            live.append(b.alloc(4096))
        picked = draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=True))
        acc = []
        for a in picked:
            n = b.alloc_size[a]
            off = draw(st.integers(0, n - 1))
            acc.append((a, off, draw(st.integers(1, n - off)), draw(st.sampled_from([READ, WRITE, 3]))))
        b.launch("k", acc, duration=1e-6)
        if len(live) > 1 and draw(st.booleans()):
            v = draw(st.sampled_from(live))
            live.remove(v)
            b.free(v)
    return b.build()


@settings(max_examples=60, deadline=None)
@given(t=traces(), bs=st.sampled_from([2 * MiB, 64 * 1024]))
def test_against_slow_reference(t, bs):
    lay = build_layout(t, bs)
    L, A = t.n_launches, t.n_allocs
    ends = t.free_at_or_end()
    # live allocations never overlap
    for x in range(A):
        for y in range(x + 1, A):
            if t.alloc_at[y] < ends[x] and t.alloc_at[x] < ends[y] and not (
                    t.free_at[x] == t.alloc_at[x] or t.free_at[y] == t.alloc_at[y]):
                assert (lay.base[x] + t.alloc_size[x] <= lay.base[y] or
                        lay.base[y] + t.alloc_size[y] <= lay.base[x]), (x, y)
    for i in range(L):
        want, wr = set(), set()
        for j in range(t.acc_ptr[i], t.acc_ptr[i + 1]):
            s = lay.base[t.acc_alloc[j]] + t.acc_off[j]
            blocks = range(s // bs, (s + t.acc_len[j] - 1) // bs + 1)
            want.update(blocks)
            if t.acc_mode[j] & WRITE:
                wr.update(blocks)
        assert lay.launch_blocks(i).tolist() == sorted(want)
        assert lay.launch_writes(i).tolist() == sorted(wr)
    # next use
    nxt = lay.next_use()
    for i in range(L):
        for k in range(lay.ptr[i], lay.ptr[i + 1]):
            blk = lay.blocks[k]
            later = [h for h in range(i + 1, L) if blk in set(lay.launch_blocks(h).tolist())]
            assert nxt[k] == (later[0] if later else L)
    # dead blocks: no allocation alive after free point i overlaps them (alive = alloc_at <= i < end,
    # or allocated at i and not freed at i), and some allocation overlapping them was freed at i
    for i in range(L + 1):
        for blk in lay.dead_at(i).tolist():
            lo, hi = blk * bs, (blk + 1) * bs
            for x in range(A):
                overlaps = lay.base[x] < hi and lo < lay.base[x] + t.alloc_size[x]
                alive = t.alloc_at[x] < i < ends[x]
                assert not (overlaps and alive), (i, blk, x)
    # fresh blocks: no allocation whose first launch reads it (or that no launch touches: data from before the trace)
    # was placed over the block by the time a launch first touches it (any time, for a block no launch touches)
    first = {}
    for i in range(L):
        for blk in lay.launch_blocks(i).tolist():
            first.setdefault(blk, i)
    holds = []
    for x in range(A):
        acc = [j for j in range(t.acc_ptr[-1]) if t.acc_alloc[j] == x]
        if not acc:
            holds.append(x)
            continue
        i0 = min(next(i for i in range(L) if t.acc_ptr[i] <= j < t.acc_ptr[i + 1]) for j in acc)
        if any(t.acc_mode[j] & READ for j in range(t.acc_ptr[i0], t.acc_ptr[i0 + 1]) if t.acc_alloc[j] == x):
            holds.append(x)
    for blk in range(lay.max_blocks):
        lo, hi = blk * bs, (blk + 1) * bs
        held = any(lay.base[x] < hi and lo < lay.base[x] + max(int(t.alloc_size[x]), 1)
                   and t.alloc_at[x] <= first.get(blk, L) for x in holds)
        assert bool(lay.fresh[blk]) == (not held), blk


def test_the_shipped_trace_holds_data_in_its_parameters_only():
    """The recorder registers a model's parameters before the first launch; every other tensor is an op's output."""
    from pathlib import Path

    import numpy as np

    from uvmprefetch.sim.layout import born_in_trace, fresh_for
    from uvmprefetch.trace import load
    from uvmprefetch.trace.format import KIND
    t = load(Path(__file__).resolve().parents[2] / "traces" / "gpt2-small-b2s128.uvmt")
    assert np.array_equal(~born_in_trace(t), t.alloc_kind == KIND["param"])
    lay = build_layout(t)
    touched = lay.first_use() < t.n_launches
    assert 0.5 * touched.sum() < lay.fresh[touched].sum() < touched.sum()
    assert fresh_for(t, lay) is lay.fresh
