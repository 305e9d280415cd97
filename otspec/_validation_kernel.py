"""A law's check on reading in one compiled pass (:func:`otspec._validation.validate_distribution`).

:func:`law_copy` copies a float64 row into a fresh array, flushing the entries below the smallest normal double
(:data:`otspec._validation.NEGLIGIBLE`) to 0, and counts the entries that are NaN, infinite or negative, in one
read of the row; the caller then sums the copy by numpy (``out.sum()``, the total that decides acceptance and
that ``normalize=True`` divides by, numpy's pairwise sum as before, over a copy still in the cache). Without
numba (:data:`JIT` false) the caller keeps its numpy passes.
"""

from __future__ import annotations

import numpy as np

from ._jit import compile_in

#: The smallest normal double (:data:`otspec._validation.NEGLIGIBLE`): entries below it become 0.
TINY = float(np.finfo(np.float64).tiny)
_INF = float("inf")


def law_copy(x, out):
    """``out[i]`` = ``x[i]`` where ``x[i] >= TINY``, else 0 (NaN and negative entries too); return the number of
    entries of ``x`` that are NaN, infinite or negative (0: ``out`` is the flushed copy of a finite, non-negative
    row)."""
    bad = 0
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = v if v >= TINY else 0.0
        bad += not ((v >= 0.0) & (v < _INF))
    return bad


#: Whether the kernel is compiled (numba installed); :func:`otspec._validation.validate_distribution` reads it at
#: each call (tests turn it off).
JIT = compile_in(globals(), ("law_copy",))
