"""JSON for results that carry NumPy scalars and arrays (replay results, run reports, ``--json`` output)."""

from __future__ import annotations


def json_default(o):
    """``json.dumps(..., default=json_default)``: NumPy integers, floats and arrays as plain JSON values.

    Raises
    ------
    TypeError
        For anything else, as ``json`` expects from a ``default`` hook.
    """
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
