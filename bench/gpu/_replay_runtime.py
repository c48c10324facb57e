"""The GPU replay's one coupling to the live runtime (``uvmprefetch.runtime``): everything the replay knows of
it is here, so that when the runtime's internals change only this module does.

The replay drives the runtime at its backend level, as the runtime's own observer does for a PyTorch op: one
``LaunchInfo`` per launch after its kernel was queued (``CudaBackend.launch``; before it with
``hook_after_launch=False``), the blocks that died before it (``free``), each iteration's end
(``end_iteration``). The backend's policy decides, its residency books and
budget pick the victims, and its ``Mover`` issues every prefetch, eviction and advice on its own streams: the
moves are the live runtime's, call for call. Memory is not PyTorch's: the replay's arena, one managed
allocation, stands where the shim's list of managed allocations stands (``ArenaShim``), and the replay's
compute stream is made PyTorch's current stream, which the backend orders its GPU-progress events after.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import _common as C
from _replay_core import MB2


def preload_shim() -> None:
    """Re-execute this process with the runtime's shim in ``LD_PRELOAD`` unless it is there already, as
    ``uvmprefetch run`` and ``UVMPREFETCH=1`` start a program: the cuda backend refuses to start in a process
    whose CUDA PyTorch initialised without the shim in front of libcudart (the replay's own memory is its arena
    either way).

    Raises
    ------
    uvmprefetch.errors.ShimError
        The shim cannot be built here.
    """
    from uvmprefetch.runtime.shim import preloaded, shim_path
    if preloaded() is not None:
        return
    ld = " ".join(filter(None, [str(shim_path()), os.environ.get("LD_PRELOAD", "")]))
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env=C.child_env({"LD_PRELOAD": ld}, base=os.environ))


class ArenaShim:
    """What ``CudaBackend`` reads from the LD_PRELOAD shim (``uvmprefetch.runtime.shim.Shim``), for one arena:
    the managed allocations (``segments``: ranges clip to them), counters, the managed limit (the arena itself:
    the replay never allocates more managed memory than it) and no launch records."""

    def __init__(self, base: int, nbytes: int, free_bytes: int, total_bytes: int) -> None:
        self.base, self.nbytes = int(base), int(nbytes)
        self.free_bytes, self.total_bytes = int(free_bytes), int(total_bytes)

    def stats(self) -> dict:
        return {"n_alloc": 1, "n_free": 0, "managed_bytes": self.nbytes, "peak_managed_bytes": self.nbytes,
                "limit_bytes": self.nbytes, "n_refused": 0, "n_errors": 0, "n_launches": 0,
                "n_launches_dropped": 0}

    def segments(self) -> list[tuple[int, int]]:
        return [(self.base, self.nbytes)]

    def limit(self) -> dict:
        return {"limit_bytes": self.nbytes, "mode": "bytes", "requested": self.nbytes,
                "device_free": self.free_bytes, "device_total": self.total_bytes,
                "gpu_cap": self.free_bytes - self.free_bytes // 20, "host_known": False, "mem_available": 0,
                "cgroup_room": None, "cgroup_version": 0, "host_margin": 0, "host_backed": 0}

    def read_launches(self) -> list:
        return []


class RuntimeAdapter:
    """The live runtime's cuda backend over an arena at ``base`` (2 MiB aligned) of ``arena_bytes``, with a
    budget of ``budget_bytes`` and the policy ``policy`` (a name with optional parameters), driven with the
    layout's block numbers. ``compute_stream``: the stream the replay's kernels run on.

    ``hook_after_launch`` (default True): the runtime sees a launch after its kernel was queued, as its
    dispatcher-mode observer reports an op after the op ran (``runtime/observe.py``); the backend's GPU-progress
    event is recorded then and follows the kernel. The policy's prefetches for that launch itself then go out
    after the kernel was queued (the simulator decides before a launch starts). False: before the kernel, as an
    observer called at the op's start would (a what-if for today's backend: its progress event then precedes the
    kernel, so a running launch's blocks are protected only during its own hook).

    Raises
    ------
    uvmprefetch.errors.ConfigError, DeviceError
        A bad or offline policy; no usable GPU, or a budget above the free device memory.
    """

    def __init__(self, base: int, arena_bytes: int, budget_bytes: int, policy: str, compute_stream: int,
                 free_bytes: int, total_bytes: int, hook_after_launch: bool = True) -> None:
        import torch

        from uvmprefetch.config import Budget, RuntimeConfig
        from uvmprefetch.runtime.cuda_backend import BLOCK_SIZE, CudaBackend
        from uvmprefetch.runtime.session import build_policy
        if BLOCK_SIZE != MB2:
            raise RuntimeError(f"the runtime's block is {BLOCK_SIZE} bytes; the replay's layout uses {MB2}")
        cfg = RuntimeConfig(enabled=True, backend="cuda", budget=Budget(nbytes=int(budget_bytes)), policy=policy,
                            log="quiet")
        self.policy = build_policy(cfg)
        self.backend = CudaBackend(cfg, self.policy, shim=ArenaShim(base, arena_bytes, free_bytes, total_bytes))
        torch.cuda.set_stream(torch.cuda.ExternalStream(int(compute_stream)))
        self.hook_after_launch = bool(hook_after_launch)
        self.base = int(base)
        self.first = self.base // MB2  # the runtime numbers blocks address // block size
        self._ids = np.full(int(arena_bytes) // MB2, -1, dtype=np.int64)  # layout block -> the backend's id
        from uvmprefetch.policy.base import LaunchInfo
        self._info = LaunchInfo

    def _dense(self, blocks: np.ndarray) -> np.ndarray:
        """The backend's ids of layout blocks (sorted, as the runtime's observer hands them over); ids are
        given in first-sight order, as the backend gives them to a live run."""
        ids = self._ids[blocks]
        if (ids < 0).any():
            for b in blocks[ids < 0].tolist():
                self._ids[b] = self.backend.block_ids(self.base + b * MB2, MB2)[0]
            ids = self._ids[blocks]
        return np.sort(ids)

    def launch(self, index: int, exec_id: int, name: int, phase: int, iteration: int, duration: float,
               blocks: np.ndarray, write_blocks: np.ndarray) -> None:
        """Launch ``index`` was queued on the compute stream; it touches layout ``blocks``."""
        self.backend.launch(self._info(index=index, exec_id=exec_id, name=name, phase=phase, iteration=iteration,
                                       duration=duration, blocks=self._dense(blocks),
                                       write_blocks=self._dense(write_blocks)))

    def free(self, blocks: np.ndarray) -> None:
        """Layout ``blocks`` no live allocation overlaps any more."""
        self.backend.free(self.first + np.asarray(blocks, dtype=np.int64))

    def end_iteration(self, k: int) -> None:
        self.backend.end_iteration(k)

    def result(self) -> dict:
        """The backend's report (its books, host time by stage, CUPTI's counts where it ran)."""
        return self.backend.result()

    def close(self) -> None:
        self.backend.close()


def make_runtime(dev, base: int, arena_bytes: int, budget_bytes: int, policy: str,
                 hook_after_launch: bool = True) -> RuntimeAdapter:
    """``replay_on_device``'s ``runtime_factory``: the adapter on ``dev``'s compute stream."""
    free, total = dev.cuda.mem_get_info()
    return RuntimeAdapter(base, arena_bytes, budget_bytes, policy, int(dev.cuda.stream), free, total,
                          hook_after_launch)
