"""The error hierarchy. The CLI prints ``str(err)`` as one line and exits with ``err.exit_code``."""

from __future__ import annotations


class UvmPrefetchError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = 1


class ConfigError(UvmPrefetchError, ValueError):
    """A parameter, CLI flag or environment variable has a bad value. The message names it."""

    exit_code = 2


class TraceError(UvmPrefetchError):
    """A trace file is damaged or inconsistent. The message says what and where (event index)."""

    exit_code = 3


class RecordError(UvmPrefetchError):
    """Recording a model or a user script failed."""

    exit_code = 4


class DeviceError(UvmPrefetchError):
    """No usable GPU / CUDA driver feature for what was asked."""

    exit_code = 5


class ShimError(UvmPrefetchError):
    """The LD_PRELOAD shim could not be built or loaded."""

    exit_code = 6


class SimError(UvmPrefetchError, RuntimeError):
    """The simulated GPU cannot go on (a launch needs more blocks than the capacity, a policy broke the hook
    contract). Raised by ``uvmprefetch.sim.engine`` (which re-exports it); still a ``RuntimeError`` for callers
    that caught it as one."""

    exit_code = 7
