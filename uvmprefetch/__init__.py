"""uvmprefetch: transparent GPU memory oversubscription for deep learning.

Tensors live in CUDA managed memory; a prefetcher that learns the training loop's launch sequence moves
each block to the GPU before the kernel that needs it and evicts what will not be needed soon.

Layout (data flows left to right): ``trace/`` observe -> ``policy/`` decide -> ``sim/`` and ``runtime/`` act.
"""

__version__ = "0.1.0"


def enable(config=None, **overrides):
    """Switch the live runtime on in this process (see ``uvmprefetch.runtime.enable``); returns the session.

    ``uvmprefetch.enable(backend="dryrun", budget="20GiB")``. For the cuda backend call it before importing
    torch (or start the program with ``UVMPREFETCH=1``), so that the shim sits in front of libcudart.
    """
    from .runtime import enable as _enable  # lazy: keep ``import uvmprefetch`` cheap
    return _enable(config, **overrides)


def disable():
    """Stop the live runtime (writes its report); returns the report dict or None."""
    from .runtime import disable as _disable
    return _disable()


def enabled(config=None, **overrides):
    """The live runtime for the length of a ``with`` block; the run report is ``run.report`` after it.

    ``with uvmprefetch.enabled(budget="20GiB") as run: train()``. Takes ``enable``'s arguments; see
    ``uvmprefetch/scope.py``.
    """
    from .scope import enabled as _enabled
    return _enabled(config, **overrides)
