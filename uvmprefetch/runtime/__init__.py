"""act (live): CUDA managed memory, the prefetch stream, the budget, the monitor.

``enable()`` starts a ``Session`` in this process (the start-up hook calls it for ``UVMPREFETCH=1``). The C++
observer (``native_observer``, built by ``native``) sees launches, accesses and deaths on every thread and hands
them to the ``planner`` thread, which runs the policy and the backend; ``observe`` is the Python fallback;
``residency`` keeps books and the budget; ``cuda_backend`` plans the moves and ``mover`` issues them with
cuda-python from a thread of its own; ``dryrun`` drives the simulated GPU instead; ``shim`` reads the
LD_PRELOAD shim; ``report`` writes what happened. See ``docs/runtime.md``.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_session = None


def enable(config=None, **overrides):
    """Switch the runtime on in this process; returns the ``Session``.

    Parameters
    ----------
    config
        A ``uvmprefetch.config.RuntimeConfig``; default: read from the ``UVMPREFETCH_*`` environment.
    **overrides
        Fields of ``RuntimeConfig`` to replace: ``backend="dryrun"``, ``budget="20GiB"`` (strings are
        parsed like the environment variables), ``policy=...``, ``window=...``, ``report=...``,
        ``trace=...``, ``log=...``, ``gpu=...``.

    Raises
    ------
    ConfigError
        An invalid setting (named).
    DeviceError
        The cuda backend without a usable GPU, cuda-python, concurrent managed access, or a budget above
        the free device memory.

    In a rank of a distributed job (``runtime/ranks.py``) the report and trace paths are named for the rank, the
    cuda backend runs on the rank's device, and an error names the rank.
    """
    global _session
    import dataclasses

    from ..config import from_env, parse_budget, parse_policy, parse_window
    from ..errors import UvmPrefetchError
    with _lock:
        if _session is not None and not _session._stopped:
            return _session
        cfg = config if config is not None else from_env()
        conv = {"budget": lambda v: parse_budget(v) if isinstance(v, str) else v,
                "window": lambda v: parse_window(v) if isinstance(v, str) else v,
                "policy": lambda v: parse_policy(v)}
        kw = {k: conv.get(k, lambda v: v)(v) for k, v in overrides.items()}
        cfg = dataclasses.replace(cfg, enabled=True, **kw)
        from . import ranks
        rank = ranks.this_rank()
        cfg = ranks.for_rank(cfg, rank)
        from .session import Session
        try:
            if rank is not None and cfg.backend == "cuda":
                ranks.select_device(rank)
            _session = Session(cfg, rank=rank).start()
        except UvmPrefetchError as e:
            if rank is None or str(e).startswith(f"{rank}:"):
                raise
            raise type(e)(f"{rank}: {e}") from None  # one rank of several refused: say which
        return _session


def disable() -> dict | None:
    """Stop the running session (writes its report); returns the report, or None if none was running."""
    global _session
    with _lock:
        s, _session = _session, None
    return s.stop() if s is not None else None


def current():
    """The running ``Session`` or None."""
    return _session


__all__ = ["enable", "disable", "current"]
