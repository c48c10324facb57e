"""The C++ observer on a GPU (skipped without one): the same events as the dispatch mode on CUDA tensors, backward
on the autograd engine's device thread included; and the pre-op gate makes an op's stream wait on a real move.

GIVEN a CUDA GPT-2 small step observed at once by the C++ observer and the reference dispatch mode,
WHEN both record it,
THEN they agree event for event (the engine runs backward on its own device thread: the C++ callback sees it there,
the dispatch mode through the state the engine carries over).
GIVEN a block whose move to the GPU is in flight (the gate's table holds the event of a real
``cudaMemPrefetchAsync`` on another stream),
WHEN an op reads it,
THEN the op's stream waits on that event (the gate counts a late block and one wait) and the result is right.
"""

import ctypes
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from observer_reference import ReferenceMode, native_ops  # noqa: E402
from test_native_observer import lib  # noqa: E402,F401 - the fixture: the observer library, or a skip


def test_cuda_gpt2_step_event_for_event(lib):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    ids = torch.randint(0, 50257, (2, 64), device="cuda")
    ref, lock = [], threading.Lock()
    lib.drain_ops()
    lib.start("cuda", True)
    try:
        with ReferenceMode(ref, lock, lambda: False, device_type="cuda"):
            model(input_ids=ids, labels=ids).loss.backward()
        torch.cuda.synchronize()
    finally:
        lib.stop()
    got = native_ops(lib, lib.drain_ops())
    assert lib.error() == "" and len(ref) == len(got) > 100
    for i, (r, g) in enumerate(zip(ref, got)):
        assert tuple(r) == tuple(g), f"launch {i}: {r[:3]} vs {g[:3]}"


def test_an_op_waits_for_a_move_in_flight_over_its_block(lib):
    from cuda.bindings import runtime as rt
    assert lib.lib.uvmgate_init(None) == 0
    lib.lib.uvmgate_set_block_shift(21)
    n = 64 << 20
    ok, ptr = rt.cudaMallocManaged(n, rt.cudaMemAttachGlobal)
    assert ok == rt.cudaError_t.cudaSuccess
    try:
        x = _managed_tensor(ptr, n)
        x.fill_(2.0)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        loc = rt.cudaMemLocation()
        loc.type, loc.id = rt.cudaMemLocationType.cudaMemLocationTypeHost, 0
        rt.cudaMemPrefetchAsync(ptr, n, loc, 0, s.cuda_stream)  # away to the host ...
        loc.type, loc.id = rt.cudaMemLocationType.cudaMemLocationTypeDevice, 0
        rt.cudaMemPrefetchAsync(ptr, n, loc, 0, s.cuda_stream)  # ... and back: in flight
        ev = torch.cuda.Event()
        ev.record(s)
        blocks = np.arange(ptr >> 21, ((ptr + n - 1) >> 21) + 1, dtype=np.uint64)
        lib.lib.uvmgate_set(blocks.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), blocks.size, ev.cuda_event, 2)
        before = lib.counters()
        lib.start("cuda", True)
        try:
            y = x * 3  # the gate: the current stream waits on ev before this kernel
        finally:
            lib.stop()
        after = lib.counters()
        assert after["gate_waits"] - before["gate_waits"] == 1 and after["gate_late"] > before["gate_late"]
        assert torch.all(y == 6.0)
        lib.lib.uvmgate_settle(blocks.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), blocks.size, ev.cuda_event, 1)
    finally:
        torch.cuda.synchronize()
        rt.cudaFree(ptr)


def _managed_tensor(ptr: int, nbytes: int):
    """A float32 CUDA tensor over ``nbytes`` of managed memory at ``ptr`` (through __cuda_array_interface__)."""
    class Managed:
        __cuda_array_interface__ = {"shape": (nbytes // 4,), "typestr": "<f4", "data": (ptr, False), "version": 2}
    return torch.as_tensor(Managed(), device="cuda")
