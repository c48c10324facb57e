"""``uvmprefetch.enabled(...)``: the live runtime for the length of a ``with`` block.

    with uvmprefetch.enabled(budget="20GiB") as run:
        train()
    print(run.report["bytes_htod"])

The shape of ``torch.cuda.use_mem_pool``: the block switches the runtime on in this process (``uvmprefetch.enable``)
and off again on the way out (``uvmprefetch.disable``), in ``finally``, so an exception inside the block still stops
the runtime and writes its report before it propagates. The runtime is one per process: a block cannot start while
it is already on (``UVMPREFETCH=1``, ``enable()``, an outer block), since its settings would not take effect.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field


@dataclass
class EnabledRun:
    """What ``with uvmprefetch.enabled(...) as run`` gives: the running session inside the block, the report after."""

    session: object = None
    report: dict | None = field(default=None)


@contextlib.contextmanager
def enabled(config=None, **overrides):
    """Run the block with the live runtime on; ``run.report`` holds the run report after it.

    Parameters
    ----------
    config, **overrides
        As ``uvmprefetch.enable``: a ``RuntimeConfig`` (default: the ``UVMPREFETCH_*`` environment) and fields to
        replace, e.g. ``budget="20GiB"``, ``backend="dryrun"``, ``policy="uvmprefetch"``, ``report="run.json"``.

    Raises
    ------
    ConfigError
        An invalid setting (named), or the runtime already on in this process.
    DeviceError
        As ``uvmprefetch.enable`` (no usable GPU for the cuda backend, a budget above the free memory, ...).
    """
    from .errors import ConfigError
    from .runtime import current, disable, enable
    before = current()
    run = EnabledRun()
    run.session = enable(config, **overrides)
    if run.session is before:  # enable() hands back the session already running; it does not take new settings
        raise ConfigError("uvmprefetch.enabled(): the runtime is already on in this process (UVMPREFETCH=1, "
                          "uvmprefetch.enable() or an outer with block); stop it first or drop this block")
    try:
        yield run
    finally:
        run.report = disable()
