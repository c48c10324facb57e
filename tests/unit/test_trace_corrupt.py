"""GIVEN a damaged or inconsistent trace WHEN it is read THEN it is rejected with one message naming the
problem and where it is; GIVEN any valid trace WHEN written and read THEN it round-trips exactly."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmprefetch.errors import TraceError
from uvmprefetch.trace import READ, WRITE, Trace, TraceBuilder, load, save
from uvmprefetch.trace.format import ARRAYS, KINDS, PHASES


def _trace():
    b = TraceBuilder({"model": "t"})
    x = b.alloc(1 << 20, "activation")
    y = b.alloc(4096, "param")
    b.launch("fill", [(x, 0, 1 << 20, WRITE)], duration=1e-5)
    b.launch("axpy", [(x, 0, 4096, READ), (y, 0, 4096, READ | WRITE)], duration=1e-5)
    b.free(x)
    b.launch("scale", [(y, 0, 4096, READ | WRITE)], duration=1e-5)
    return b.build()


def _mutate(t, **arrays) -> Trace:
    kw = {n: getattr(t, n).copy() for n in ARRAYS}
    kw.update(arrays)
    return Trace(names=list(t.names), meta=dict(t.meta), **kw)


def _saved_then_edited(tmp_path, edit):
    """The small trace saved to a file whose bytes ``edit(bytearray)`` then changes in place; the file's path."""
    p = tmp_path / "t.uvmt"
    save(_trace(), p)
    data = bytearray(p.read_bytes())
    edit(data)
    p.write_bytes(bytes(data))
    return p


def test_wrong_magic(tmp_path):
    def edit(data):
        data[:8] = b"NOTTRACE"
    with pytest.raises(TraceError, match="not a uvmprefetch trace"):
        load(_saved_then_edited(tmp_path, edit))


def test_wrong_version(tmp_path):
    with pytest.raises(TraceError, match="version 99 is not supported"):
        load(_saved_then_edited(tmp_path, lambda data: struct.pack_into("<I", data, 8, 99)))


@pytest.mark.parametrize("keep", [5, 30, -7])
def test_truncated(tmp_path, keep):
    def edit(data):
        del data[keep:]
    with pytest.raises(TraceError, match="truncated"):
        load(_saved_then_edited(tmp_path, edit))


def test_corrupted_blob_named(tmp_path):
    def edit(data):
        data[-3] ^= 0xFF  # inside the last array's compressed blob
    with pytest.raises(TraceError, match="array acc_mode"):
        load(_saved_then_edited(tmp_path, edit))


def test_access_to_freed_allocation_names_launch():
    t = _trace()
    # launch 2 ("scale") now touches allocation 0, freed at launch 2
    bad = _mutate(t, acc_alloc=np.array([0, 0, 1, 0]))
    with pytest.raises(TraceError, match=r"launch 2: access 3 touches allocation 0, freed at launch 2"):
        save(bad, "/dev/null")


def test_access_to_unknown_allocation_names_launch(tmp_path):
    t = _mutate(_trace(), acc_alloc=np.array([0, 0, 7, 1]))
    with pytest.raises(TraceError, match=r"launch 1: access 2 names unknown allocation 7"):
        save(t, tmp_path / "x.uvmt")


def test_out_of_bounds_range_names_launch(tmp_path):
    t = _mutate(_trace(), acc_off=np.array([0, 0, 2048, 0]))
    with pytest.raises(TraceError, match=r"launch 1: access 2 range \[2048, 6144\) out of bounds of allocation 1 "
                                         r"\(4096 bytes\)"):
        save(t, tmp_path / "x.uvmt")


def test_inconsistent_file_on_disk_is_rejected_on_load(tmp_path):
    """The check runs on load too, with the file's name in front (written without validation)."""
    import json
    import zlib

    from uvmprefetch.trace import format as fmt

    t = _mutate(_trace(), acc_off=np.array([0, 0, 2048, 0]))
    blobs, entries = [], []
    for name, dt in ARRAYS.items():
        raw = getattr(t, name).astype(dt).tobytes()
        blobs.append(zlib.compress(raw))
        entries.append({"name": name, "dtype": dt.str, "count": int(getattr(t, name).shape[0]),
                        "nbytes": len(blobs[-1]), "crc32": zlib.crc32(raw)})
    header = json.dumps({"meta": {}, "names": t.names, "arrays": entries}).encode()
    p = tmp_path / "bad.uvmt"
    p.write_bytes(fmt._HEADER.pack(fmt.MAGIC, fmt.VERSION, len(header)) + header + b"".join(blobs))
    with pytest.raises(TraceError, match=r"bad.uvmt: launch 1: access 2 range"):
        load(p)


# ------------------------------------------------------------------------------------------ property


@st.composite
def traces(draw):
    b = TraceBuilder({"seed": draw(st.integers(0, 10**6)), "gpu": draw(st.sampled_from(["h100-pcie", "a100-pcie"]))})
    live: list[int] = []
    n_events = draw(st.integers(0, 40))
    for _ in range(n_events):
        op = draw(st.sampled_from(["alloc", "free", "launch", "iter", "phase"]))
        if op == "alloc" or not live and op in ("free", "launch"):
            live.append(b.alloc(draw(st.integers(1, 1 << 24)), draw(st.sampled_from(KINDS))))
        elif op == "free":
            b.free(live.pop(draw(st.integers(0, len(live) - 1))))
        elif op == "iter":
            b.iteration += 1
        elif op == "phase":
            b.phase = draw(st.integers(0, len(PHASES) - 1))
        else:
            acc = []
            for a in draw(st.lists(st.sampled_from(live), max_size=4)):
                size = b.alloc_size[a]
                off = draw(st.integers(0, size - 1))
                acc.append((a, off, draw(st.integers(1, size - off)), draw(st.sampled_from([READ, WRITE, READ | WRITE]))))
            b.launch(draw(st.text(min_size=1, max_size=12)), acc,
                     duration=draw(st.floats(0, 1, allow_nan=False)), flops=draw(st.floats(0, 1e15, allow_nan=False)))
    return b.build()


@settings(max_examples=60, deadline=None)
@given(traces())
def test_write_then_read_round_trips_exactly(tmp_path_factory, t):
    p = tmp_path_factory.mktemp("rt") / "t.uvmt"
    save(t, p)
    u = load(p)
    assert u.equals(t)
    assert u.fingerprint() == t.fingerprint()
    assert u.meta == t.meta
    for name in ARRAYS:
        assert getattr(u, name).dtype == getattr(t, name).dtype
