"""A law's check on reading in one compiled pass (:func:`otspec._validation.validate_distribution`).

:func:`law_copy` copies a float64 row into a fresh array, flushing the entries below the smallest normal double
(:data:`otspec._validation.NEGLIGIBLE`) to 0, and counts the entries that are NaN, infinite or negative, in one
read of the row; the caller then sums the copy by numpy (``out.sum()``, the total that decides acceptance and
that ``normalize=True`` divides by, numpy's pairwise sum as before, over a copy still in the cache). Without
numba (:data:`JIT` false) the caller keeps its numpy passes.

:func:`law_copy_sum` is the same copy with the row's total summed in the same read, in any order (compiled with
reassociation, so in vector lanes): not numpy's sum to the bit, but within ``gamma_{n-1}`` of the exact total, which is
all that :func:`otspec._validation.law_into` needs to decide acceptance where numpy's sum would decide the same
(every other row is decided by numpy's sum, as before).

:func:`law_check_sum` is the check without the copy, for a row that nothing writes again (a model that declares
``fresh_laws``): the row's total, summed in the same read in any order, where every entry is ``+0.0`` or a
positive normal finite double, so that :func:`law_copy`'s flushed copy would be the row itself to the bit; NaN
otherwise (an entry to flush: subnormal, ``-0.0``; or a bad one: negative, NaN, infinite), and the caller copies.
"""

from __future__ import annotations

import numpy as np

from ._jit import compile_in

#: The smallest normal double (:data:`otspec._validation.NEGLIGIBLE`): entries below it become 0.
TINY = float(np.finfo(np.float64).tiny)
_INF = float("inf")
_NAN = float("nan")
#: The bit patterns (as int64) of :data:`TINY` and of ``+inf``: an entry whose pattern ``b`` is 0 (``+0.0``) or in
#: ``[TINY_BITS, INF_BITS)`` is a positive normal finite double or ``+0.0``, which :func:`law_copy` keeps as it is;
#: every other pattern (the sign bit set: negative, ``-0.0``, a negative NaN; a positive subnormal; ``+inf``; a
#: NaN) is not.
TINY_BITS = int(np.array(TINY).view(np.int64))
INF_BITS = int(np.array(_INF).view(np.int64))


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


def law_copy_sum(x, out):
    """:func:`law_copy`'s flushed copy into ``out`` and its total, summed in the same read in an unspecified order
    (each of the ``n - 1`` additions of non-negative terms rounded: within ``gamma_{n-1}`` of the exact total of
    the copy); NaN where an entry of ``x`` is NaN or negative. An infinite entry gives an infinite total (the
    flushed copy has no ``-inf`` to cancel it), so a finite total means a finite, non-negative row."""
    s = 0.0
    bad = 0.0                       # a float count: summed in vector lanes with the total (an int count is not)
    for i in range(x.shape[0]):
        v = x[i]
        w = v if v >= TINY else 0.0
        out[i] = w
        s += w
        bad += 0.0 if v >= 0.0 else 1.0
    return s if bad == 0.0 else _NAN


def law_check_sum(x, bits):
    """The total of ``x`` (summed in an unspecified order, as :func:`law_copy_sum`) where every entry is ``+0.0``
    or a positive normal finite double (``bits``, ``x`` viewed as int64, gives each entry's pattern): then
    :func:`law_copy_sum`'s flushed copy is ``x`` itself, to the bit, and its total is within ``gamma_{n-1}`` of the
    exact total of ``x``. NaN where an entry is anything else (the caller then copies, flushes and checks). One
    read of ``x``, nothing written."""
    s = 0.0
    bad = 0
    for i in range(x.shape[0]):
        b = bits[i]
        s += x[i]
        bad += (b != 0) & ((b < TINY_BITS) | (b >= INF_BITS))
    return s if bad == 0 else _NAN


#: Whether the kernels are compiled (numba installed); :func:`otspec._validation.validate_distribution` reads it at
#: each call (tests turn it off).
JIT = compile_in(globals(), ("law_copy",))
# the totals' additions reassociated (vector lanes), nothing else relaxed
compile_in(globals(), ("law_copy_sum", "law_check_sum"), fastmath={"reassoc"})
