"""The shared policy tables: bounds, LRU order, set-associativity, saturation, growable arrays."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmprefetch.errors import ConfigError
from uvmprefetch.policy.tables import GrowArray, LruMap, SaturatingCounter, SetAssocTable


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


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_sizes_raise_config_error(bad):
    with pytest.raises(ConfigError):
        LruMap(bad)
    with pytest.raises(ConfigError):
        SetAssocTable(bad, 2)
