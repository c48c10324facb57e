"""observe: the trace format and the recorders that produce it.

- ``format``: ``Trace`` (structure of NumPy arrays), ``TraceBuilder``, ``save``/``load``/``validate``.
- ``recorder``: ``Recorder`` (dispatch-mode recording over meta or real tensors), ``accesses_of``.
- ``models``: the transformers model zoo and ``record_model``; ``script``: ``record_script``.
- ``roofline``: ``estimate`` / ``durations_for``; ``stats``: ``summarize``; ``standard``: ``standard_traces``.

Only ``format`` is imported here: the others import torch, which the simulator does not need.
"""

from .format import (KIND, KINDS, PHASE, PHASES, READ, WRITE, Trace, TraceBuilder, exec_id_of, load, save,
                     validate)

__all__ = ["KIND", "KINDS", "PHASE", "PHASES", "READ", "WRITE", "Trace", "TraceBuilder", "exec_id_of", "load",
           "save", "validate"]
