"""Which managed-memory limit and which budget are in force on the cuda backend, and why.

Two bounds meet here. The *managed limit* is how much managed memory the program may allocate at all; the
shim (``kernels/uvmshim.c``) computes it and enforces it at the first allocation (``UVMPREFETCH_MANAGED_LIMIT``:
by default what host memory can back, so a model bigger than the GPU allocates and one bigger than the host
gets PyTorch's own out-of-memory error). The *budget* is how much of that may sit on the GPU; the runtime
evicts to stay under it. Without ``UVMPREFETCH_BUDGET`` the budget is the device's free memory at start
minus the 5 % the shim's gpu-free limit keeps back, so under oversubscription the runtime evicts before the
driver has to, and without it (everything fits under that limit) the budget is never reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DeviceError
from ..units import format_size

# The fraction of the device's free memory kept back (kernels/uvmshim.c GPU_RESERVE_DIV): the context, cuBLAS,
# cuDNN and NCCL grow after start-up outside managed memory; tests/unit/test_memory_plan.py checks the two agree.
GPU_RESERVE_DIV = 20


def default_budget(free_bytes: int) -> int:
    """The budget without ``UVMPREFETCH_BUDGET``: ``free_bytes`` minus 1/20 (the gpu-free limit's value)."""
    return int(free_bytes) - int(free_bytes) // GPU_RESERVE_DIV


@dataclass(frozen=True)
class MemoryPlan:
    """The limit the shim reported (``Shim.limit()``) and the budget, each with the reason it has its value."""

    limit: dict
    budget_bytes: int
    budget_why: str

    @property
    def oversubscribed(self) -> bool:
        """May managed memory exceed what the GPU had free (the shim's own measurement) when the limit was fixed?"""
        return self.limit["limit_bytes"] > self.limit["gpu_cap"]

    def line(self) -> str:
        """The start-up line: the limit, the budget, and why each has its value."""
        return (f"uvmprefetch: managed memory up to {_size(self.limit['limit_bytes'])} ({limit_why(self.limit)}); "
                f"budget {format_size(self.budget_bytes)} on the GPU ({self.budget_why}): the runtime evicts to "
                "the host to stay under it")

    def book_blocks(self, total_bytes: int, block_size: int) -> int:
        """Block ids the residency books need: twice the managed memory there can be (the caching allocator
        keeps its segments, so address churn is small), at least the device's, at most 64 times it (~150 bytes
        of books and policy state per 2 MiB block; beyond, the books fill and the runtime switches off)."""
        span = max(int(total_bytes), min(int(self.limit["limit_bytes"]), 64 * int(total_bytes)))
        return int(2 * span // block_size + 1024)

    def as_dict(self) -> dict:
        return {"managed_limit": dict(self.limit), "managed_limit_why": limit_why(self.limit),
                "budget_bytes": self.budget_bytes, "budget_why": self.budget_why,
                "oversubscribed": self.oversubscribed}


def plan_memory(budget, limit: dict, free_bytes: int, total_bytes: int, managed_now: int = 0) -> MemoryPlan:
    """The budget for ``budget`` (a ``config.Budget`` or None) on a device with ``free_bytes`` of ``total_bytes``
    free while the shim already holds ``managed_now``, next to the shim's ``limit``.

    Raises
    ------
    DeviceError
        A budget above the free device memory.
    """
    room = int(free_bytes) + int(managed_now)
    if budget is None:
        return MemoryPlan(dict(limit), default_budget(room),
                          f"default: the GPU's free memory {format_size(room)} - 5 %")
    nbytes = budget.resolve(total_bytes)
    if nbytes > room:
        raise DeviceError(f"UVMPREFETCH_BUDGET={budget} is {format_size(nbytes)}, above the free device memory "
                          f"({format_size(free_bytes)} of {format_size(total_bytes)}): lower it")
    return MemoryPlan(dict(limit), int(nbytes), f"UVMPREFETCH_BUDGET={budget}")


def limit_why(lim: dict) -> str:
    """Why the shim's limit ``lim`` (``Shim.limit()``) has its value, in a few words."""
    host = _host_words(lim)
    if lim["mode"] == "gpu-free":
        return "UVMPREFETCH_MANAGED_LIMIT=gpu-free: the GPU's free memory - 5 %, no oversubscription"
    if lim["mode"] == "bytes":
        warn = ""
        if lim["host_known"] and lim["limit_bytes"] > max(lim["host_backed"], lim["gpu_cap"]):
            warn = "; above that: the kernel may end the run when host memory runs out"
        return f"UVMPREFETCH_MANAGED_LIMIT = {format_size(lim['requested'])}; {host}{warn}"
    if lim["limit_bytes"] == lim["gpu_cap"] and lim["gpu_cap"] > lim["host_backed"]:
        return f"default: the GPU's free memory - 5 %, more than {host}"
    return f"default: {host}"


def describe_limit(lim: dict, gpu_known: bool = True) -> str:
    """``uvmprefetch doctor``'s line: the limit a run would get and why. Without ``gpu_known`` the device
    figures are its total memory (its free memory is read at the first allocation)."""
    end = "; fixed at the first allocation, beyond it allocations fail with PyTorch's out-of-memory error"
    if gpu_known or lim["mode"] == "bytes":
        return f"up to {_size(lim['limit_bytes'])}: {limit_why(lim)}{end}"
    gpu = "the GPU's free memory - 5 % " + (f"(at most {format_size(lim['gpu_cap'])} here)" if lim["device_total"]
                                             else "(no GPU here)")
    if lim["mode"] == "gpu-free":
        return f"gpu-free: {gpu}, no oversubscription{end}"
    return f"host (default): up to {_size(lim['host_backed'])}, {_host_words(lim)}; or {gpu} where that is more{end}"


def _size(n: int) -> str:
    return "unlimited" if n >= 2**63 else format_size(n)


def _host_words(lim: dict) -> str:
    """What the host can back, in words: the available memory, its cgroup bound, the margin."""
    if not lim["host_known"]:
        return "host memory unknown (/proc/meminfo unreadable)"
    avail, room = lim["mem_available"], lim["cgroup_room"]
    parts = [f"{format_size(avail)} available"] if avail else []
    if room is not None and (not avail or room < avail):
        parts.append(f"cgroup v{lim['cgroup_version']} leaves {format_size(lim['cgroup_room'])}")
    return (f"what the host can back: {', '.join(parts)} - {format_size(lim['host_margin'])} margin = "
            f"{format_size(lim['host_backed'])}")
