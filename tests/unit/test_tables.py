"""The shared policy tables: bounds, LRU order, set-associativity, saturation, growable arrays."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmprefetch.errors import ConfigError
from uvmprefetch.policy.tables import (ASSOC_WAYS, GrowArray, LruMap, SaturatingCounter, SetAssocTable, assoc_count,
                                       assoc_get, assoc_put, assoc_set, assoc_table)


def test_lru_map_evicts_least_recently_used():
    # GIVEN a map of 2 entries WHEN a is used after b and c is inserted THEN b (the LRU) is gone
    m = LruMap(2)
    m.put("a", 1)
    m.put("b", 2)
    assert m.get("a") == 1
    m.put("c", 3)
    assert "b" not in m and m.get("a") == 1 and m.get("c") == 3
    assert len(m) == 2 and m.evictions == 1


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 8), st.lists(st.integers(0, 20), max_size=60))
def test_lru_map_matches_reference(cap, keys):
    m = LruMap(cap)
    ref: list = []  # most recent last
    for k in keys:
        m.put(k, k * 10)
        if k in ref:
            ref.remove(k)
        ref.append(k)
        del ref[:-cap]
        assert len(m) <= cap
    assert sorted(k for k, _ in m.items()) == sorted(ref)


def test_set_assoc_table_replaces_lru_way_within_a_set():
    t = SetAssocTable(rows=4, ways=2)
    t.put(1, "a")  # set 1
    t.put(5, "b")  # set 1
    assert t.get(1) == "a"  # 1 is now MRU
    t.put(9, "c")  # set 1 full: 5 (LRU) goes
    assert 5 not in t and t.get(1) == "a" and t.get(9) == "c"
    t.put(2, "d")  # another set is unaffected
    assert len(t) == 3 and t.evictions == 1
    t.put(9, "e")  # update in place
    assert t.get(9) == "e" and len(t) == 3


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.lists(st.integers(0, 50), max_size=80))
def test_set_assoc_table_is_bounded(rows, ways, keys):
    t = SetAssocTable(rows, ways)
    for k in keys:
        t.put(k, k)
        assert t.get(k) == k  # the key just written is always there
        assert len(t) <= rows * ways
    assert len(t) == len(t.keys())


def test_saturating_counter_clamps():
    c = SaturatingCounter(0, 3)
    for _ in range(10):
        c.add()
    assert c.value == 3 and c.saturated
    c.add(-10)
    assert c.value == 0 and not c.saturated
    with pytest.raises(ConfigError):
        SaturatingCounter(3, 1)
    with pytest.raises(ConfigError):
        SaturatingCounter(0, 2, init=5)


def test_grow_array_extend_and_drop_front():
    g = GrowArray(np.int64, fill=-1, initial=4)
    for i in range(40):
        g.append(i)
    g.extend(np.arange(40, 100))
    assert np.array_equal(g.view(), np.arange(100))
    g.drop_front(30)
    assert np.array_equal(g.view(), np.arange(30, 100)) and len(g) == 70


@pytest.mark.parametrize("fill", [0, -1, 7])
def test_grow_array_room_past_its_length_holds_the_fill_after_growing(fill):
    """``reserve`` hands kernels the whole buffer, whose entries past the length must hold the fill value
    (``extend_fill`` relies on it), through every growth and after a drop of the front."""
    g = GrowArray(np.int64, fill=fill, initial=16)
    g.extend(np.arange(1, 11))
    for k in (17, 40, 200, 1000):
        a = g.reserve(k)
        assert a.shape[0] >= k and np.array_equal(a[:10], np.arange(1, 11)) and (a[10:] == fill).all()
    g.drop_front(4)
    g.extend_fill(3)
    assert np.array_equal(g.view(), np.r_[np.arange(5, 11), [fill] * 3])
    assert (g.reserve(5000)[9:] == fill).all()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_sizes_raise_config_error(bad):
    with pytest.raises(ConfigError):
        LruMap(bad)
    with pytest.raises(ConfigError):
        SetAssocTable(bad, 2)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.lists(st.tuples(st.booleans(), st.integers(-40, 40)), max_size=120))
def test_compiled_table_is_an_lru_per_set(rows, ops):
    # GIVEN the compiled set-associative table (``assoc_put`` / ``assoc_get``: ASSOC_WAYS ways a set)
    # WHEN keys (negative ones too: they are hashes) are put and got THEN it holds what a reference does: per
    # set an LRU list of ASSOC_WAYS keys, where a get (a hit) counts as a use, and a put of a new key into a full
    # set drops the least recently used
    table = assoc_table(rows * ASSOC_WAYS)
    clock = 0
    ref: dict = {}  # set -> [(key, value)], most recent last
    for i, (is_put, key) in enumerate(ops):
        s = assoc_set(table, key)
        lst = ref.setdefault(s, [])
        hit = [e for e in lst if e[0] == key]
        if is_put:
            clock = assoc_put(table, key, i, clock)
            if hit:
                lst.remove(hit[0])
            lst.append((key, i))
            del lst[:-ASSOC_WAYS]
        else:
            got, clock = assoc_get(table, key, clock)
            assert got == (hit[0][1] if hit else -1)
            if hit:
                lst.remove(hit[0])
                lst.append(hit[0])
    held = {(int(a), int(b)) for a, b, c in table if c}
    assert held == {e for lst in ref.values() for e in lst}


def test_compiled_counts_start_over_each_generation():
    # GIVEN the table as a counter (``assoc_count``) WHEN a key is counted three times in one generation (an
    # iteration) and once in the next THEN it gets 0, 1, 2, then 0 again, and other keys count apart
    table = assoc_table(4 * ASSOC_WAYS)
    assert [assoc_count(table, 7, 1) for _ in range(3)] == [0, 1, 2]
    assert assoc_count(table, -7, 1) == 0
    assert assoc_count(table, 7, 2) == 0 and assoc_count(table, 7, 2) == 1


def test_ngram_keys_follow_the_committed_launches():
    # GIVEN uvmprefetch's correlation tables with n-grams of 2 WHEN launches (exec id, name) are committed THEN the
    # running launch's n-gram key depends on the last two committed and its own exec id, and on how often that
    # n-gram occurred in the iteration; the name n-gram committed at a position is the one a launch with that
    # name finds there; nothing before two launches are committed
    from uvmprefetch.policy.uvmprefetch.correlation import Correlation, commit, count, name_key

    c = Correlation(16 * ASSOC_WAYS, 2, False)
    none = np.zeros(0, dtype=np.int64)
    sig_args = (none, none, np.zeros(1, dtype=np.int64), 0)
    assert count(c.ref, 5, False, sig_args) == (0, 0)
    for r, (e, nm) in enumerate([(1, 10), (2, 20), (3, 30), (1, 10), (2, 20)]):
        commit(c.ref, e, nm, 1000 + r, r, (0, 0))
    a = count(c.ref, 3, False, sig_args)[1]  # context (1, 2) then 3: as at position 2
    b = count(c.ref, 3, False, sig_args)[1]  # its second occurrence: another key
    d = count(c.ref, 4, False, sig_args)[1]
    assert len({a, b, d}) == 3 and 0 not in (a, b, d)
    # the name n-gram (20, 30) + 10 was committed at position 3
    c2 = Correlation(16 * ASSOC_WAYS, 2, False)
    for r, nm in enumerate([10, 20, 30, 10]):
        commit(c2.ref, nm, nm, 1000 + r, r, (0, 0))
    c2.recent[1, :2] = (20, 30)  # (the last two committed names, as a launch after 20, 30 sees them)
    c2.r["n_recent"] = 2
    assert assoc_get(c2.name_pos, name_key(c2.ref, 10), 0)[0] == 3
    assert assoc_get(c2.name_pos, name_key(c2.ref, 40), 0)[0] == -1
