"""How a part of the policy keeps its state: its scalars in a one-row record array (named fields), its arrays by
name, and one Numba StructRef that hands them all to compiled code as a single argument.

A part's Python class owns the NumPy objects (``record``, the arrays) and builds its StructRef from them with a
cached constructor; compiled code reads and writes the same memory through it. Whenever a part replaces one of
its arrays (the history grows), it builds the StructRef anew. Python reads a field as ``part.r["name"]`` (``r`` is
the record's row: a view); that costs about a microsecond, so the hot path leaves it to compiled code.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numba as nb
import numpy as np
from numba.core import types
from numba.experimental import structref


class PartType(types.StructRef):
    """Base of the parts' StructRef types: fields typed as given (literal values are not kept as literals)."""

    def preprocess_fields(self, fields):
        return tuple((n, types.unliteral(t)) for n, t in fields)


def define_part(module: str, name: str, fields) -> tuple[type, type, object]:
    """The StructRef type, proxy and cached constructor (from a tuple of the fields' values) of a part with these
    ``fields``. The type and proxy are ``<name>Type`` and ``<name>Ref``, which the part's ``module`` must bind to
    those names (Numba's cache finds a type by its module and name)."""
    typ = structref.register(type(f"{name}Type", (PartType,), {"__module__": module}))
    ref = type(f"{name}Ref", (structref.StructRefProxy,),
               {"__module__": module, "__doc__": f"The {name} part's state as one argument of compiled code."})
    structref.define_proxy(ref, typ, list(fields))

    def make(values):
        return ref(*values)

    return typ, ref, nb.njit(cache=True, nogil=True)(make)


class Part:
    """Base of a part's Python class, declared as ``class History(Part, fields=(...))``: ``fields`` names its record
    (``s``, made by ``record_of``, with ``r`` its row) and arrays, in the order its StructRef takes them; the class
    gets ``FIELDS``, ``make`` (the StructRef's cached constructor) and, in its module, ``<Name>Type`` and
    ``<Name>Ref``. ``build`` makes ``ref`` from the current arrays (again after one is replaced)."""

    FIELDS: tuple = ()

    def __init_subclass__(cls, fields=(), **kw) -> None:
        super().__init_subclass__(**kw)
        cls.FIELDS = tuple(fields)
        typ, ref, make = define_part(cls.__module__, cls.__name__, cls.FIELDS)
        module = sys.modules[cls.__module__]
        setattr(module, typ.__name__, typ)
        setattr(module, ref.__name__, ref)
        cls.make = staticmethod(make)

    def record_of(self, dtype: np.dtype, **values) -> None:
        """The part's scalars: a one-row record of ``dtype`` (``s``), ``r`` its row."""
        self.s = record(dtype, **values)
        self.r = self.s[0]

    def build(self):
        self.ref = self.make(tuple(getattr(self, f) for f in self.FIELDS))
        return self.ref

    def nbytes(self) -> int:
        return int(sum(getattr(self, f).nbytes for f in self.FIELDS))


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


def check_caches(modules) -> bool:
    """Drop the cached compiled code of ``modules`` when any of their sources changed since it was cached; returns
    whether it did. Numba keys a cached function by its own source file only, and a kernel compiled with a
    function of another module keeps that function's old code when only the other module changed (after a
    checkout of another version, say). So the digest of every module's source is kept beside the cache, and when it
    differs every cached function of these modules is flushed (compiled anew on first use)."""
    kernels = list({id(v): v for m in modules for v in vars(m).values()
                    if getattr(getattr(v, "_cache", None), "cache_path", None) is not None}.values())  # (cached)
    if not kernels:
        return False
    digest = hashlib.sha256()
    for m in sorted(modules, key=lambda m: m.__name__):
        digest.update(Path(m.__file__).read_bytes())
    stamp = Path(kernels[0]._cache.cache_path) / f"{modules[0].__name__}.sources.sha256"
    want = digest.hexdigest()
    try:
        if stamp.read_text() == want:
            return False
    except OSError:
        pass
    for k in kernels:
        k._cache.flush()
    try:
        stamp.write_text(want)
    except OSError:  # (a cache we cannot write is not ours to keep)
        pass
    return True
