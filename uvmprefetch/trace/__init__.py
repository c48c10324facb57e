"""observe: the trace format and the recorders that produce it."""

from .format import (KIND, KINDS, PHASE, PHASES, READ, WRITE, Trace, TraceBuilder, exec_id_of, load, save,
                     validate)

__all__ = ["KIND", "KINDS", "PHASE", "PHASES", "READ", "WRITE", "Trace", "TraceBuilder", "exec_id_of", "load",
           "save", "validate"]
