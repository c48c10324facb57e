"""Unknown kernels: launches no op the C++ observer records accounts for, counted by the shim.

GIVEN the real compiled shim in front of a fake libcudart (the true boundary: no GPU here) and the real C++
observer recording the ops of this CPU process, wired together as the cuda backend wires them
(``Shim.count_unknown_kernels``),
WHEN kernels are launched through the shim's ``cudaLaunchKernel`` hook inside a recorded op (a custom op whose
kernel launches), outside every op, from a second thread while the first is inside an op, while the observer is
dormant, and a CUDA graph is replayed,
THEN exactly the launches outside a recorded op on their own thread, and the graph replays, are counted, and only
while the observer records.
"""

import json

import pytest

from fake_launch import run_with_shim
from uvmprefetch.runtime import native, native_observer

SCRIPT = r"""
import json, threading
import torch
from uvmprefetch.runtime import native_observer
obs = native_observer.load()

@torch.library.custom_op("uvmtest::launching", mutates_args=())
def launching(x: torch.Tensor, n: int, side: bool) -> torch.Tensor:
    # the op's kernels: n launches on this thread, or (side) on a thread of its own
    for _ in range(n):
        if side:
            t = threading.Thread(target=go)
            t.start()
            t.join()
        else:
            go()
    return x.clone()

counts = lambda: SHIM.unknown_kernels()
out = {}
x = torch.ones(4)
assert SHIM.count_unknown_kernels(obs.lib)
go()
out["before_start"] = counts()                     # the observer not started: it records nothing
obs.start("cpu", True)
torch.ops.uvmtest.launching(x, 3, False)
out["in_op"] = counts()                            # 3 launches inside a recorded op
go(); go()
out["outside"] = counts()                          # 2 launches outside every op
torch.ops.uvmtest.launching(x, 2, True)
out["other_thread"] = counts()                     # 2 launches on another thread while this one is in an op
shim.cudaGraphLaunch(None, None)
torch.ops.uvmtest.launching(x, 0, False)
out["graph"] = counts()                            # a graph replay (outside an op)
obs.set_active(False)
go()
shim.cudaGraphLaunch(None, None)
out["dormant"] = counts()                          # dormant: nothing is counted
obs.set_active(True)
go()
out["active_again"] = counts()
SHIM.count_unknown_kernels(None)
go()
out["unset"] = counts()
obs.stop()
out["ops"] = [obs.op_name(int(r["c"]) & 0xFFFFFFFF) for r in obs.drain_ops() if (int(r["c"]) >> 56) == 1]
out["launched"] = launched()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def observer():
    try:
        return native_observer.load()  # built here once: the child loads the cached library
    except native.NativeBuildError as e:
        pytest.skip(f"the C++ observer cannot be built here: {e}")


def test_unknown_kernels_are_the_launches_outside_every_recorded_op(tmp_path, observer):
    r = run_with_shim(tmp_path, SCRIPT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    k = lambda n, g=0: {"launches": n, "graph_launches": g}  # noqa: E731
    assert out["before_start"] == k(0)
    assert out["in_op"] == k(0)  # attributed: the recorded op accounts for them
    assert out["outside"] == k(2)
    assert out["other_thread"] == k(4)  # attribution is per thread: the side thread is in no op
    assert out["graph"] == k(4, 1)
    assert out["dormant"] == k(4, 1)
    assert out["active_again"] == k(5, 1)
    assert out["unset"] == k(5, 1)
    # AND the op whose kernels were attributed is one the observer recorded; every launch reached the fake runtime
    assert out["ops"].count("uvmtest::launching") == 3
    assert out["launched"] == 13
