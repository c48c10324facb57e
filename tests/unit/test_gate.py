"""The pre-op gate (``kernels/gate.cpp``) against a fake libcudart, on the CPU.

GIVEN the observer library and a fake ``libcudart`` compiled here (it logs ``cudaStreamWaitEvent`` and event
records, and says an event is complete only when the test says so),
WHEN the mover's side (``GateBook``, or the table directly) says which blocks are in flight where, and an op on
some stream touches ranges over them (``uvmgate_check``: what the observer's start callback runs),
THEN the op's stream waits on the event of each move to the GPU (or discard) in flight over its blocks, once per
event, never on an eviction; in-flight blocks count as late, evicted ones as faults; settled moves gate nothing;
and the GPU-progress marks recorded on the ops' streams report the newest op the GPU has passed, in order.
"""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from uvmprefetch.runtime import native, native_observer
from uvmprefetch.runtime.mover import GateBook

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

FAKE = r"""
#include <stdint.h>
#include <stdlib.h>
int n_waits; void *wait_stream[64], *wait_event[64];
int n_records; void *record_event[256], *record_stream[256];
int capturing;
uintptr_t done_below;  /* events (fake pointers) below this count as complete */
uintptr_t next_event = 0x1000;
int cudaStreamWaitEvent(void *s, void *e, unsigned f) { (void)f; wait_stream[n_waits] = s; wait_event[n_waits++] = e; return 0; }
int cudaEventCreateWithFlags(void **e, unsigned f) { (void)f; *e = (void *)next_event; next_event += 0x10; return 0; }
int cudaEventRecord(void *e, void *s) { record_event[n_records] = e; record_stream[n_records++] = s; return 0; }
int cudaEventQuery(void *e) { return (uintptr_t)e < done_below ? 0 : 600; }
int cudaStreamIsCapturing(void *s, int *st) { (void)s; *st = capturing; return 0; }
"""

TO_GPU, RESIDENT, TO_HOST, ON_HOST, DISCARD = 2, 1, 3, 4, 5
SH = 21
u64 = ctypes.POINTER(ctypes.c_uint64)


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    try:
        lib = native_observer.load()
    except native.NativeBuildError as e:
        pytest.skip(f"the C++ observer cannot be built here: {e}")
    d = tmp_path_factory.mktemp("fakecudart")
    (d / "fake.c").write_text(FAKE)
    so = d / "libfakecudart.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), str(d / "fake.c")], check=True)
    fake = ctypes.CDLL(str(so))
    assert lib.lib.uvmgate_init(str(so).encode()) == 0
    lib.lib.uvmgate_set_block_shift(SH)
    return lib, fake


def _arr(values):
    a = np.asarray(values, dtype=np.uint64)
    return a, a.ctypes.data_as(u64)


def check(lib, ranges, stream):
    starts, sp = _arr([p for p, _ in ranges])
    lens, lp = _arr([n for _, n in ranges])
    out = (ctypes.c_uint32 * 3)()
    lib.lib.uvmgate_check(sp, lp, len(ranges), ctypes.c_void_p(stream), out)
    return tuple(out)


def waits(fake, start=0):
    n = ctypes.c_int.in_dll(fake, "n_waits").value
    s = (ctypes.c_void_p * 64).in_dll(fake, "wait_stream")
    e = (ctypes.c_void_p * 64).in_dll(fake, "wait_event")
    return [(s[i], e[i]) for i in range(start, n)]


def test_ops_wait_on_moves_to_the_gpu_in_flight_only(gate):
    lib, fake = gate
    base = 0x1000 << SH  # blocks 0x1000.. (this test's own)
    b = lambda k: (base >> SH) + k  # noqa: E731
    ev_in, ev_disc, ev_out = 0x7000, 0x7100, 0x7200
    for blocks, ev, st in (([b(0), b(1)], ev_in, TO_GPU), ([b(2)], ev_out, TO_HOST), ([b(3)], 0, RESIDENT),
                           ([b(4)], ev_disc, DISCARD), ([b(5)], 0, ON_HOST)):
        arr, ptr = _arr(blocks)
        lib.lib.uvmgate_set(ptr, arr.size, ev, st)
    n0 = len(waits(fake))
    # an op reading block 0 and 1 (one range over both), 2, 3, 4 and 5; and a block the mover never saw
    late, fault, nw = check(lib, [(base + 100, 2 << SH), (base + (2 << SH), 4 << SH), (base + (9 << SH), 64)], 0x55)
    assert (late, fault, nw) == (2, 2, 2)  # blocks 0, 1 late; 2 (leaving) and 5 (gone) will fault
    assert waits(fake, n0) == [(0x55, ev_in), (0x55, ev_disc)]  # one wait per event, none on the eviction
    # the move to the GPU lands: its blocks gate nothing any more; a settle for another event changes nothing
    arr, ptr = _arr([b(0), b(1), b(4)])
    lib.lib.uvmgate_settle(ptr, arr.size, ev_in, RESIDENT)
    out = (ctypes.c_uint64 * 3)()
    lib.lib.uvmgate_get(ptr, 3, out)
    assert [v & 7 for v in out] == [RESIDENT, RESIDENT, DISCARD]
    n1 = len(waits(fake))
    assert check(lib, [(base, 2 << SH)], 0x66) == (0, 0, 0) and waits(fake, n1) == []


def test_gate_book_follows_the_movers_events(gate):
    lib, fake = gate

    class Event:
        def __init__(self, handle):
            self.cuda_event, self.done = handle, False

        def query(self):
            return self.done
    book = GateBook(lib, 2 << 20)
    base = 0x2000 << SH
    e1, e2 = Event(0x8000), Event(0x8100)
    book.moving([(base, 3 << SH)], e1, to_device=True)  # blocks 0..2 to the GPU
    book.moving([(base + (5 << SH), 100)], e2, to_device=False)  # block 5 to the host
    arr, ptr = _arr([(base >> SH) + k for k in (0, 1, 2, 5)])
    out = (ctypes.c_uint64 * 4)()
    lib.lib.uvmgate_get(ptr, 4, out)
    assert [v & 7 for v in out] == [TO_GPU] * 3 + [TO_HOST] and out[0] & ~7 == 0x8000
    book.settle()  # nothing completed yet
    e2.done = True
    book.settle()  # settles in order: the first move still flies, so the second waits behind it
    lib.lib.uvmgate_get(ptr, 4, out)
    assert [v & 7 for v in out] == [TO_GPU] * 3 + [TO_HOST]
    e1.done = True
    book.settle()
    lib.lib.uvmgate_get(ptr, 4, out)
    assert [v & 7 for v in out] == [RESIDENT] * 3 + [ON_HOST] and book.in_flight() == 0


def test_progress_marks_report_the_newest_op_the_gpu_passed(gate):
    lib, fake = gate
    lib.lib.uvmgate_set_progress_every(1)
    before = lib.lib.uvmgate_completed_seq()
    seqs = [before + 10, before + 11, before + 12]
    n0 = ctypes.c_int.in_dll(fake, "n_records").value
    for s in seqs:
        lib.lib.uvmgate_note(s, ctypes.c_void_p(0x99))
    rec = (ctypes.c_void_p * 256).in_dll(fake, "record_event")
    recs = [rec[i] for i in range(n0, n0 + 3)]
    assert all((ctypes.c_void_p * 256).in_dll(fake, "record_stream")[i] == 0x99 for i in range(n0, n0 + 3))
    done = ctypes.c_size_t.in_dll(fake, "done_below")
    assert lib.lib.uvmgate_completed_seq() == before  # nothing reached yet
    assert recs == sorted(recs)  # one new event per slot, in order
    done.value = recs[1] + 1  # the GPU passed the first two marks' events
    assert lib.lib.uvmgate_completed_seq() == seqs[1]
    done.value = recs[2] + 1
    assert lib.lib.uvmgate_completed_seq() == seqs[-1]
    lib.lib.uvmgate_set_progress_every(8)
