"""One numba compilation per kernel where the arguments differ only in read-only flags or integer widths
(:mod:`otspec._jit`): which arguments a kernel writes, read from its source, and the dispatcher that compiles
the rest as read-only, checked against the uncompiled functions bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from otspec import _jit
from otspec._jit import HAVE_NUMBA, compile_in, written_arguments

needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="the dispatcher is numba's (the fast extra)")


# ------------------------------------------------------------------ kernels read by written_arguments (and compiled)
def fill_out(x, out):
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i]


def write_through_row(x, i):
    row = x[i]
    row[0] = 1.0


def add_through_helper(x, y):
    fill_out(y, x)                 # fill_out writes its second parameter: x here


def read_through_helper(x, y):
    fill_out(x, y)                 # x only read (fill_out's first parameter), y written


def method_of_array(x):
    x.fill(0.0)


def returns_a_view(x):
    return x[1:]


def returns_a_total(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
    return s


def numpy_out(x, y):
    np.multiply(x, 2.0, out=y)


def in_place_add(x, y):
    z = x
    z += y


def scaled_sum(x, k, out):
    """``out[0] = k * sum(x)`` with ``k`` an integer scalar (any width) and ``x`` only read."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i]
    out[0] = k * s
    return k + 1


def zero_first_row(x):
    row = x[0]
    for j in range(row.shape[0]):
        row[j] = 0.0


PLAIN = {name: globals()[name] for name in ("scaled_sum", "zero_first_row", "fill_out")}
JITTED = dict(PLAIN)
compile_in(JITTED, ("scaled_sum", "zero_first_row", "fill_out"))


@pytest.mark.parametrize("func, ndims, written", [
    (fill_out, (1, 1), {1}),
    (write_through_row, (2, 0), {0}),             # a wrong reading that ignores names made from x misses it
    (write_through_row, (), {0}),                 # axes unknown: x[i] may be a row, so x is written
    (add_through_helper, (1, 1), {0}),            # a helper's written parameter, mapped back by position
    (read_through_helper, (1, 1), {1}),           # ... and its read-only one left read-only
    (method_of_array, (1,), {0}),
    (returns_a_view, (1,), {0}),                  # a view handed back may be written by the caller
    (returns_a_total, (1,), set()),               # a total read from x is not x
    (numpy_out, (1, 1), {0, 1}),                 # a call given out=: each of its arrays counted written
    (in_place_add, (1, 1), {0}),                  # ``z += y`` on an array writes z, that is x
    (scaled_sum, (1, 0, 1), {2}),
])
def test_written_arguments_from_the_source(func, ndims, written):
    assert written_arguments(func, ndims=ndims) == frozenset(written)


@needs_numba
def test_one_compilation_for_read_only_and_writeable_arrays_and_integer_widths():
    x = np.linspace(0.1, 1.0, 7)
    ro = x.copy()
    ro.flags.writeable = False
    f, g = JITTED["scaled_sum"], PLAIN["scaled_sum"]
    for arr, k in ((x, 3), (ro, 3), (x, np.int32(3)), (ro, np.int16(3)), (x[:5].copy(), np.int64(3))):
        before = arr.copy()
        out, want = np.zeros(1), np.zeros(1)
        assert f(arr, k, out) == g(arr, int(k), want)
        # the compiled total sums in the same order as the Python loop: the same bits
        assert out.tobytes() == want.tobytes()
        assert arr.tobytes() == before.tobytes()           # the input not written
        assert arr.flags.writeable == (arr is not ro)         # nor its flag changed
    assert not ro.flags.writeable
    # one signature: x read-only, k int64 (without the normalisation: four, read-only x writeable x int32 int64)
    assert len(f.signatures) == 1
    (sig,) = f.signatures
    assert not sig[0].mutable and str(sig[1]) == "int64" and sig[2].mutable
    assert _jit.REFUSED == []


@needs_numba
def test_a_kernel_that_writes_an_argument_keeps_it_writeable_and_refuses_a_read_only_one():
    f = JITTED["zero_first_row"]
    x = np.ones((2, 3))
    f(x)
    assert x.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    ro = np.ones((2, 3))
    ro.flags.writeable = False
    with pytest.raises(Exception, match="readonly"):
        f(ro)                      # as numba without the normalisation: a read-only array is not written
    assert ro.tolist() == [[1.0] * 3] * 2
    assert all(sig[0].mutable for sig in f.signatures)


@needs_numba
def test_inner_calls_reach_the_same_compilation():
    # a compiled caller hands fill_out a writeable row and a read-only one: fill_out is typed once
    f = JITTED["fill_out"]
    x = np.arange(4.0)
    ro = x.copy()
    ro.flags.writeable = False
    for arr in (x, ro):
        out = np.empty(4)
        f(arr, out)
        assert out.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert len(f.signatures) == 1


@needs_numba
def test_law_copy_sum_is_compiled_once_for_read_only_and_writeable_rows():
    from otspec import _validation_kernel as LK

    rng = np.random.default_rng(5)
    row = rng.random(33)
    ro = row.copy()
    ro.flags.writeable = False
    got = []
    for arr in (row, ro):
        out = np.empty(33)
        got.append((LK.law_copy_sum(arr, out), out.tobytes()))
    assert got[0] == got[1]
    assert sum(1 for sig in LK.law_copy_sum.signatures if sig[0].ndim == 1 and sig[0].layout == "C") == 1
