"""How a part of the policy keeps its state: its scalars in a one-row record array (named fields), its arrays by
name, and one Numba StructRef that hands them all to compiled code as a single argument.

A part's Python class owns the NumPy objects (``record``, the arrays) and builds its StructRef from them with a
cached constructor; compiled code reads and writes the same memory through it. Whenever a part replaces one of
its arrays (the history grows), it builds the StructRef anew. Python reads a field as ``part.r["name"]`` (``r`` is
the record's row: a view); that costs about a microsecond, so the hot path leaves it to compiled code.
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.experimental import structref


class PartType(types.StructRef):
    """Base of the parts' StructRef types: fields typed as given (literal values are not kept as literals)."""

    def preprocess_fields(self, fields):
        return tuple((n, types.unliteral(t)) for n, t in fields)


def record(dtype: np.dtype, **values) -> np.ndarray:
    """A one-row record array of ``dtype``, every field 0 but those given."""
    r = np.zeros(1, dtype=dtype)
    for k, v in values.items():
        r[0][k] = v
    return r


def fields(rec: np.ndarray) -> dict:
    """A record's row as a dict of Python scalars (reports, tests)."""
    row = rec[0]
    return {k: row[k].item() for k in rec.dtype.names}
