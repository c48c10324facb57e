"""The ``UVMPREFETCH_*`` environment variables (docs/design.md §4), parsed and validated in one place.

The start-up hook, ``uvmprefetch run`` and ``uvmprefetch.enable()`` all go through ``from_env`` /
``RuntimeConfig``, so an invalid value is reported the same way everywhere: one ``ConfigError`` that names the
variable and its accepted forms. Parsing imports nothing heavy (no torch, no numpy) because the start-up hook
runs it in every Python process that has ``UVMPREFETCH`` set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ConfigError
from .units import SIZE_FORMS, parse_size

BACKENDS = ("cuda", "dryrun")
LOG_LEVELS = ("quiet", "warning", "info", "debug")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

# Every variable we read, with its accepted forms: the error messages and `doctor` quote this table.
VARIABLES: dict[str, str] = {
    "UVMPREFETCH": "1/true/yes/on to enable, 0/false/no/off or unset to disable",
    "UVMPREFETCH_BACKEND": "cuda (real GPU, the default) or dryrun (CPU run driving the simulated GPU)",
    "UVMPREFETCH_BUDGET": f"{SIZE_FORMS}; or a fraction of device memory: 0.5, 50%",
    "UVMPREFETCH_MANAGED_LIMIT": f"host (default: what host memory can back), gpu-free (the GPU's free memory - 5 %, "
                                 f"no oversubscription), or {SIZE_FORMS}",
    "UVMPREFETCH_POLICY": "a policy name, optionally with parameters: uvmprefetch, deepum:window=16",
    "UVMPREFETCH_WINDOW": "auto or a positive integer (launches the prefetcher looks ahead)",
    "UVMPREFETCH_REPORT": "path of the JSON run report written at exit (its folder must exist)",
    "UVMPREFETCH_TRACE": "path of a trace file (.uvmt) recording the live run (its folder must exist)",
    "UVMPREFETCH_LOG": "quiet, warning (default), info or debug",
    "UVMPREFETCH_GPU": "dryrun only: the simulated GPU profile, e.g. h100-pcie (default)",
    "UVMPREFETCH_MOVER": "cuda only: sync (default: moves issued from the training thread) or thread "
                         "(prefetches and evictions from a mover thread; experimental)",
    "UVMPREFETCH_OBSERVER": "auto (default: the C++ observer, built on first use, where it can be; else the Python "
                            "dispatch mode), native (stop when the C++ observer cannot be used) or python",
    "UVMPREFETCH_DISCARD": "0/false/off (default: a policy's discards of dead blocks are issued as evictions, "
                           "which keep the data; dryrun models the same) or 1/true/on (cuda: "
                           "cudaMemDiscardBatchAsync of blocks the caching allocator itself reports free, with the "
                           "C++ observer; experimental: not yet shown safe on a GPU; dryrun: dead blocks are "
                           "dropped for free)",
    "UVMPREFETCH_DISCARD_BATCH": "a positive integer (cuda, with UVMPREFETCH_DISCARD=1: the discarding launches whose "
                                 "discards go behind one closure of the compute stream's gate; default 16, 1 = one "
                                 "gate per discarding launch)",
    "UVMPREFETCH_DISCARD_AUDIT": "0/false/off (default) or 1/true/on (with UVMPREFETCH_DISCARD=1: every discard "
                                 "is also checked against a torch.cuda.memory_snapshot(), ~3 ms each on GPT-2 "
                                 "large; a disagreement is refused, counted and printed: a debugging check)",
    "UVMPREFETCH_EVICT": "uvm (default: every eviction is UVM's, cudaMemPrefetchAsync to the host) or auto (cuda: "
                         "the policy may evict fully observed blocks by copy-out into pinned host mirrors + discard; "
                         "experimental, not yet run on a GPU; dryrun: the simulated GPU's copy path)",
    "UVMPREFETCH_HOST_LIMIT": f"pinned host memory for the copy path's mirrors: {SIZE_FORMS}; or a percentage of the "
                              f"host memory available at start: 25% (default); 0 = no mirrors",
}
MOVERS = ("thread", "sync")
OBSERVERS = ("auto", "native", "python")
LIMIT_MODES = ("host", "gpu-free")
EVICT_MODES = ("uvm", "auto")  # the live runtime's; the simulator's --evict also has copy (sim/copypath.py)


@dataclass(frozen=True)
class ManagedLimit:
    """Most managed memory the shim hands out (``kernels/uvmshim.c`` computes and enforces it at the first
    allocation): ``host``, what host memory can back; ``gpu-free``, the GPU's free memory - 5 %; or ``nbytes``."""

    mode: str = "host"
    nbytes: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in LIMIT_MODES + ("bytes",) or (self.mode == "bytes") != (self.nbytes is not None):
            raise ConfigError(f"managed limit: mode {self.mode!r} with {self.nbytes!r} bytes is inconsistent")
        if self.nbytes is not None and not 0 < self.nbytes < 2**64:
            raise ConfigError(f"managed limit: {self.nbytes} bytes must be in [1, 2^64)")

    def env_value(self) -> str:
        """The ``UVMPREFETCH_MANAGED_LIMIT`` value that gives this limit."""
        return str(self.nbytes) if self.mode == "bytes" else self.mode

    def __str__(self) -> str:
        if self.mode == "bytes":
            from .units import format_size
            return format_size(self.nbytes)
        return self.mode


@dataclass(frozen=True)
class Budget:
    """GPU-resident managed memory allowed: an absolute byte count or a fraction of device memory."""

    nbytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.nbytes is None) == (self.fraction is None):
            raise ConfigError("budget: give exactly one of a byte count or a fraction")
        if self.nbytes is not None and self.nbytes <= 0:
            raise ConfigError(f"budget: {self.nbytes} bytes must be positive")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ConfigError(f"budget: fraction {self.fraction} must be in (0, 1]")

    def resolve(self, device_bytes: int) -> int:
        """Bytes allowed on a device with ``device_bytes`` of memory."""
        if self.nbytes is not None:
            return int(self.nbytes)
        return int(self.fraction * device_bytes)

    def __str__(self) -> str:
        if self.nbytes is not None:
            from .units import format_size
            return format_size(self.nbytes)
        return f"{self.fraction:.0%} of device memory"


@dataclass(frozen=True)
class HostLimit:
    """Pinned host memory the copy path may hold for mirrors (``UVMPREFETCH_HOST_LIMIT``): ``nbytes``, or a
    ``fraction`` of the host memory available when the runtime starts (``MemAvailable``)."""

    nbytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.nbytes is None) == (self.fraction is None):
            raise ConfigError("host limit: give exactly one of a byte count or a fraction")
        if self.nbytes is not None and self.nbytes < 0:
            raise ConfigError(f"host limit: {self.nbytes} bytes must be >= 0")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ConfigError(f"host limit: fraction {self.fraction} must be in (0, 1]")

    def resolve(self, available_bytes: int) -> int:
        """Bytes allowed on a host with ``available_bytes`` available."""
        return int(self.nbytes) if self.nbytes is not None else int(self.fraction * available_bytes)

    def env_value(self) -> str:
        return str(self.nbytes) if self.nbytes is not None else f"{self.fraction * 100:g}%"

    def __str__(self) -> str:
        if self.nbytes is not None:
            from .units import format_size
            return format_size(self.nbytes)
        return f"{self.fraction:.0%} of available host memory"


# A quarter of MemAvailable: pinned pages cannot be swapped or reclaimed, and the rest of host memory still backs
# what UVM evicts (every block the copy path does not take) and the program itself; beyond it evictions take UVM.
DEFAULT_HOST_LIMIT = HostLimit(fraction=0.25)


@dataclass(frozen=True)
class RuntimeConfig:
    """Everything the live runtime reads from the environment, validated.

    ``budget`` None means "no budget": the driver's own eviction under real oversubscription (cuda), or
    the profile's full memory (dryrun).
    """

    enabled: bool = False
    backend: str = "cuda"
    budget: Budget | None = None
    policy: str = ""  # "" = the best registered policy (see runtime.session.default_policy)
    window: int | None = None  # None = auto
    report: str | None = None
    trace: str | None = None
    log: str = "warning"
    gpu: str = "h100-pcie"
    mover: str = "sync"
    discard: bool = False  # issue discards (else dead blocks are evicted: slower, never loses data); dryrun alike
    discard_audit: bool = False  # cuda: each discard also checked against a torch.cuda.memory_snapshot() rebuild
    discard_batch: int = 16  # cuda: discarding launches batched behind one gate closure (cuda_discards.py)
    observer: str = "auto"  # which observer sees the ops: runtime/native_observer.py or runtime/observe.py
    managed_limit: ManagedLimit = ManagedLimit()  # read by the shim itself; here validated and reported
    evict: str = "uvm"  # auto: the copy path beside UVM's eviction (runtime/copyout.py)
    host_limit: HostLimit = DEFAULT_HOST_LIMIT  # pinned mirror memory of the copy path

    def __post_init__(self) -> None:
        if self.observer not in OBSERVERS:
            raise _bad("UVMPREFETCH_OBSERVER", self.observer)
        if self.mover not in MOVERS:
            raise _bad("UVMPREFETCH_MOVER", self.mover)
        if self.evict not in EVICT_MODES:
            raise _bad("UVMPREFETCH_EVICT", self.evict)
        if self.backend not in BACKENDS:
            raise _bad("UVMPREFETCH_BACKEND", self.backend)
        if self.log not in LOG_LEVELS:
            raise _bad("UVMPREFETCH_LOG", self.log)
        if self.window is not None and (not isinstance(self.window, int) or self.window <= 0):
            raise _bad("UVMPREFETCH_WINDOW", self.window)
        if not isinstance(self.discard_batch, int) or self.discard_batch <= 0:
            raise _bad("UVMPREFETCH_DISCARD_BATCH", self.discard_batch)

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces this config in a child process (``uvmprefetch run``)."""
        env = {"UVMPREFETCH": "1" if self.enabled else "0", "UVMPREFETCH_BACKEND": self.backend,
               "UVMPREFETCH_LOG": self.log, "UVMPREFETCH_GPU": self.gpu,
               "UVMPREFETCH_WINDOW": "auto" if self.window is None else str(self.window),
               "UVMPREFETCH_MOVER": self.mover, "UVMPREFETCH_DISCARD": "1" if self.discard else "0",
               "UVMPREFETCH_DISCARD_AUDIT": "1" if self.discard_audit else "0", "UVMPREFETCH_OBSERVER": self.observer,
               "UVMPREFETCH_DISCARD_BATCH": str(self.discard_batch),
               "UVMPREFETCH_MANAGED_LIMIT": self.managed_limit.env_value(), "UVMPREFETCH_EVICT": self.evict,
               "UVMPREFETCH_HOST_LIMIT": self.host_limit.env_value()}
        if self.budget is not None:
            env["UVMPREFETCH_BUDGET"] = (str(self.budget.nbytes) if self.budget.nbytes is not None
                                         else repr(self.budget.fraction))
        if self.policy:
            env["UVMPREFETCH_POLICY"] = self.policy
        if self.report:
            env["UVMPREFETCH_REPORT"] = self.report
        if self.trace:
            env["UVMPREFETCH_TRACE"] = self.trace
        return env


def _bad(var: str, value) -> ConfigError:
    return ConfigError(f"{var}={value!r} is invalid; accepted: {VARIABLES[var]}")


def parse_bool(var: str, text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise _bad(var, text)


def _percent(t: str) -> float:
    """``"30%"`` -> 0.3; ValueError unless in (0 %, 100 %]."""
    frac = float(t[:-1]) / 100.0
    if not 0 < frac <= 1:
        raise ValueError
    return frac


def parse_budget(text: str, var: str = "UVMPREFETCH_BUDGET") -> Budget:
    """``"20GiB"`` -> bytes; ``"0.5"`` or ``"50%"`` -> a fraction of device memory.

    A bare number up to 1 is a fraction (nobody means a 1-byte budget); a bare number above 1 is bytes.

    Raises
    ------
    ConfigError
        Naming ``var`` and the accepted forms.
    """
    try:
        return _bytes_or_share(str(text).strip(), var, Budget, bare_fraction=True)
    except (ValueError, ConfigError):
        raise _bad(var, text) from None


def _bytes_or_share(t: str, var: str, cls, bare_fraction: bool):
    """``cls(fraction=...)`` for ``"30%"`` (and, where ``bare_fraction``, for a bare number up to 1), else
    ``cls(nbytes=...)`` for a size with a unit or a bare whole number above 0; ValueError or ConfigError otherwise."""
    if t.endswith("%"):
        return cls(fraction=_percent(t))
    try:
        num = float(t)
    except ValueError:
        return cls(nbytes=parse_size(t, var))
    if bare_fraction and 0 < num <= 1:
        return cls(fraction=num)
    if num > 0 and num.is_integer():
        return cls(nbytes=int(num))
    raise ValueError


def parse_host_limit(text: str, var: str = "UVMPREFETCH_HOST_LIMIT") -> HostLimit:
    """``""`` -> the default (25 % of available host memory); ``"40GiB"`` or a bare byte count -> bytes (``0``: no
    mirrors, every eviction is UVM's); ``"30%"`` -> a percentage of the host memory available at start.

    Raises
    ------
    ConfigError
        Naming ``var`` and the accepted forms.
    """
    t = str(text).strip()
    if not t:
        return DEFAULT_HOST_LIMIT
    if t == "0":
        return HostLimit(nbytes=0)
    try:
        return _bytes_or_share(t, var, HostLimit, bare_fraction=False)
    except (ValueError, ConfigError):
        raise _bad(var, text) from None


def parse_managed_limit(text: str, var: str = "UVMPREFETCH_MANAGED_LIMIT") -> ManagedLimit:
    """``"host"`` or ``""`` -> the default; ``"gpu-free"``; ``"200GiB"`` -> that many bytes (the unit rules of
    ``UVMPREFETCH_BUDGET``; a bare number is bytes, never a fraction). The shim parses the same forms itself
    (``uvmshim_parse_limit``) for programs that are not Python.

    Raises
    ------
    ConfigError
        Naming ``var`` and the accepted forms.
    """
    t = str(text).strip().lower()
    if t in ("", "host"):
        return ManagedLimit()
    if t in LIMIT_MODES:
        return ManagedLimit(mode=t)
    try:
        n = parse_size(t, var)
        return ManagedLimit(mode="bytes", nbytes=n)
    except ConfigError:
        raise _bad(var, text) from None


def managed_limit_from_env(env) -> ManagedLimit:
    """``UVMPREFETCH_MANAGED_LIMIT`` from the mapping ``env``, checked as the shim checks it when it loads (it
    ends the process on a bad value, so check before loading it).

    Raises
    ------
    ConfigError
        A bad value, or the ``UVMPREFETCH_SHIM_LIMIT`` that this variable replaces.
    """
    if env.get("UVMPREFETCH_SHIM_LIMIT", "").strip():
        raise ConfigError("UVMPREFETCH_SHIM_LIMIT is not read; set UVMPREFETCH_MANAGED_LIMIT instead; accepted: "
                          + VARIABLES["UVMPREFETCH_MANAGED_LIMIT"])
    return parse_managed_limit(env.get("UVMPREFETCH_MANAGED_LIMIT", ""))


def parse_window(text: str, var: str = "UVMPREFETCH_WINDOW") -> int | None:
    t = str(text).strip().lower()
    if t in ("", "auto"):
        return None
    try:
        n = int(t)
    except ValueError:
        raise _bad(var, text) from None
    if n <= 0:
        raise _bad(var, text)
    return n


def _parse_path(var: str, text: str) -> str | None:
    t = text.strip()
    if not t:
        return None
    folder = os.path.dirname(os.path.abspath(t))
    if not os.path.isdir(folder):
        raise ConfigError(f"{var}={text!r} is invalid: folder {folder} does not exist; accepted: {VARIABLES[var]}")
    if os.path.isdir(t):
        raise ConfigError(f"{var}={text!r} is invalid: it is a folder; accepted: {VARIABLES[var]}")
    return os.path.abspath(t)


def parse_policy(text: str, var: str = "UVMPREFETCH_POLICY") -> str:
    """Check that ``text`` names a registered policy with valid parameters (builds it once, throws it away).

    Raises
    ------
    ConfigError
        Unknown policy or parameter; the message starts with ``var``.
    """
    t = text.strip()
    if not t:
        return ""
    from .policy import make_policy  # lazy: the policy package imports numpy
    try:
        make_policy(t)
    except ConfigError as e:
        raise ConfigError(f"{var}={text!r} is invalid: {e}") from None
    return t


def from_env(environ=None, *, check_policy: bool = True) -> RuntimeConfig:
    """Read and validate every ``UVMPREFETCH_*`` variable.

    Parameters
    ----------
    environ
        A mapping (default ``os.environ``).
    check_policy
        Build the policy once to validate its name and parameters (imports numpy; the start-up hook
        does this only when ``UVMPREFETCH`` is on).

    Raises
    ------
    ConfigError
        The first invalid variable, named, with its accepted forms.
    """
    env = os.environ if environ is None else environ
    get = lambda k, d="": env.get(k, d)  # noqa: E731
    enabled = parse_bool("UVMPREFETCH", get("UVMPREFETCH"))
    backend = get("UVMPREFETCH_BACKEND", "cuda").strip().lower() or "cuda"
    if backend not in BACKENDS:
        raise _bad("UVMPREFETCH_BACKEND", get("UVMPREFETCH_BACKEND"))
    managed_limit = managed_limit_from_env(env)
    budget_text = get("UVMPREFETCH_BUDGET").strip()
    budget = parse_budget(budget_text) if budget_text else None
    policy = parse_policy(get("UVMPREFETCH_POLICY")) if check_policy else get("UVMPREFETCH_POLICY").strip()
    window = parse_window(get("UVMPREFETCH_WINDOW"))
    log = get("UVMPREFETCH_LOG", "warning").strip().lower() or "warning"
    if log not in LOG_LEVELS:
        raise _bad("UVMPREFETCH_LOG", get("UVMPREFETCH_LOG"))
    gpu = get("UVMPREFETCH_GPU", "h100-pcie").strip() or "h100-pcie"
    from .gpus import ALIASES, PROFILES
    if gpu not in PROFILES and gpu not in ALIASES:
        raise ConfigError(f"UVMPREFETCH_GPU={gpu!r} is invalid; accepted: one of {', '.join(PROFILES)}")
    mover = get("UVMPREFETCH_MOVER", "sync").strip().lower() or "sync"
    if mover not in MOVERS:
        raise _bad("UVMPREFETCH_MOVER", get("UVMPREFETCH_MOVER"))
    discard = parse_bool("UVMPREFETCH_DISCARD", get("UVMPREFETCH_DISCARD"))
    discard_audit = parse_bool("UVMPREFETCH_DISCARD_AUDIT", get("UVMPREFETCH_DISCARD_AUDIT"))
    batch_text = get("UVMPREFETCH_DISCARD_BATCH").strip()
    discard_batch = parse_window(batch_text, "UVMPREFETCH_DISCARD_BATCH") if batch_text else 16
    if discard_batch is None:  # ("auto" is a window's word, not a batch's)
        raise _bad("UVMPREFETCH_DISCARD_BATCH", batch_text)
    observer = get("UVMPREFETCH_OBSERVER", "auto").strip().lower() or "auto"
    if observer not in OBSERVERS:
        raise _bad("UVMPREFETCH_OBSERVER", get("UVMPREFETCH_OBSERVER"))
    evict = get("UVMPREFETCH_EVICT", "uvm").strip().lower() or "uvm"
    if evict not in EVICT_MODES:
        raise _bad("UVMPREFETCH_EVICT", get("UVMPREFETCH_EVICT"))
    host_limit = parse_host_limit(get("UVMPREFETCH_HOST_LIMIT"))
    return RuntimeConfig(enabled=enabled, backend=backend, budget=budget, policy=policy, window=window, mover=mover,
                         discard=discard, discard_audit=discard_audit, discard_batch=discard_batch, observer=observer,
                         managed_limit=managed_limit,
                         evict=evict, host_limit=host_limit,
                         report=_parse_path("UVMPREFETCH_REPORT", get("UVMPREFETCH_REPORT")),
                         trace=_parse_path("UVMPREFETCH_TRACE", get("UVMPREFETCH_TRACE")), log=log, gpu=gpu)
