"""The compiled one-pass law check (otspec._validation_kernel) against the numpy passes of validate_distribution.

Every float64 row goes through both routes (the kernel on, then off): the same returned array to the bit (sign
bits included), the same exception and message, the input untouched, the output read-only and fresh.
"""

import numpy as np
import pytest

import otspec._validation as VAL
from otspec import _validation_kernel as LK
from otspec._validation import NEGLIGIBLE, validate_distribution

needs_jit = pytest.mark.skipif(not LK.JIT, reason="numba not installed: the numpy passes are the only route")


def _rows():
    """Rows that the two routes must treat alike: laws, near-laws, zeros, -0.0, subnormals, bad entries."""
    rng = np.random.default_rng(7)
    rows = []
    for n in (1, 2, 3, 7, 8, 9, 127, 128, 129, 1000, 4097, 49152):
        x = rng.random(n) ** rng.integers(1, 20)
        x[rng.random(n) < 0.3] = 0.0
        if not x.sum():
            x[0] = 1.0
        rows.append(x / x.sum())
    z = 3.0 * rng.standard_normal(32000)
    e = np.exp(z - z.max())
    rows.append(e / e.sum())                                   # a softmax law
    sub = np.array([0.5, 0.5, 5e-324, 1e-310, -0.0, 0.0, 2.3e-308])
    rows.append(sub)                                           # subnormals and -0.0 flushed to +0
    rows.append(np.array([-0.0, 1.0]))
    rows.append(np.array([0.5, 0.4]))                          # off the simplex: refused
    rows.append(np.array([0.5, 0.5 + 2e-9]))
    rows.append(np.array([0.5, 0.5 + 5e-10]))                  # within the tolerance
    rows.append(np.array([1e308, 1e308]))                      # finite entries, an overflowing total
    rows.append(np.array([0.0, 0.0, -0.0]))                    # zero total
    rows.append(np.array([0.5, np.nan, 0.5]))
    rows.append(np.array([0.5, np.inf]))
    rows.append(np.array([-np.inf, 1.0]))
    rows.append(np.array([1.5, -0.5]))
    rows.append(np.array([0.7, -1e-320, 0.3]))                 # a negative subnormal is negative
    bad = rows[11].copy()
    bad[30000] = np.nan
    rows.append(bad)
    rows.append(rows[11][::2])                                 # a strided view (not contiguous)
    return rows


def _call(x, **kw):
    try:
        return validate_distribution(x, "p", **kw), None
    except (ValueError, TypeError) as exc:
        return None, (type(exc), str(exc))


@needs_jit
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("normalize", [False, True])
def test_kernel_route_is_the_numpy_route(monkeypatch, normalize):
    for x in _rows():
        before = x.copy()
        got, err = _call(x, normalize=normalize)
        np.testing.assert_array_equal(x.view(np.int64), before.view(np.int64))   # input untouched
        monkeypatch.setattr(LK, "JIT", False)
        want, werr = _call(x, normalize=normalize)
        monkeypatch.setattr(LK, "JIT", True)
        assert err == werr, (x[:8], err, werr)
        if want is None:
            continue
        assert got.dtype == np.float64 and got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))    # to the bit, signs included
        assert not got.flags.writeable and not np.shares_memory(got, x)


@needs_jit
def test_good_rows_take_the_kernel(monkeypatch):
    """The comparison above compares two routes: a good float64 row never reaches the numpy passes."""
    def refuse(*a, **k):
        raise AssertionError("the numpy passes ran")

    monkeypatch.setattr(VAL, "_float_input", refuse)
    for x in _rows()[:14]:
        validate_distribution(x, "p")
    with pytest.raises(AssertionError, match="numpy passes"):
        validate_distribution(np.array([0.5, np.nan, 0.5]), "p")   # a bad row does, for its message


@needs_jit
def test_law_copy_counts_and_flushes():
    x = np.array([0.25, 0.0, -0.0, 5e-324, NEGLIGIBLE, np.nan, np.inf, -np.inf, -1e-320, -0.5, 0.75])
    out = np.full(x.shape, 9.0)
    assert LK.law_copy(x, out) == 5                            # NaN, +inf, -inf, -1e-320, -0.5
    want = np.array([0.25, 0.0, 0.0, 0.0, NEGLIGIBLE, 0.0, np.inf, 0.0, 0.0, 0.0, 0.75])
    np.testing.assert_array_equal(out.view(np.int64), want.view(np.int64))
    good = np.array([0.5, 1e-310, -0.0, 0.5])
    out = np.empty(4)
    assert LK.law_copy(good, out) == 0
    np.testing.assert_array_equal(out.view(np.int64), np.array([0.5, 0.0, 0.0, 0.5]).view(np.int64))


@needs_jit
def test_total_is_numpys_sum():
    """``normalize=True`` divides by numpy's pairwise sum of the flushed copy: the result is ``x / x.sum()`` to the
    bit, on rows whose sequential sum differs from it in the last bits (so another order of summation fails)."""
    rng = np.random.default_rng(3)
    differs = 0
    for n in (129, 1000, 49152):
        x = rng.random(n) * 1e-3
        got = validate_distribution(x, "p", normalize=True)
        np.testing.assert_array_equal(got, x / x.sum())
        differs += float(np.cumsum(x)[-1]) != float(x.sum())
    assert differs


@pytest.mark.parametrize("jit", [True, False])
def test_out_holds_the_copy(monkeypatch, jit):
    """``out=``: the same values as a fresh copy, a read-only view of ``out``, on either route; bad ``out`` refused."""
    monkeypatch.setattr(LK, "JIT", jit and LK.JIT)
    for x in _rows()[:14]:
        want = validate_distribution(x, "p")
        block = np.full((2, x.shape[0]), 7.0)
        got = validate_distribution(x, "p", out=block[1])
        np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))
        assert np.shares_memory(got, block[1]) and not got.flags.writeable and block.flags.writeable
        np.testing.assert_array_equal(block[0], 7.0)
    x = np.array([0.25, 0.75])
    with pytest.raises(TypeError, match="`out`"):
        validate_distribution(x, "p", out=np.empty(2, dtype=np.float32))
    with pytest.raises(TypeError, match="`out`"):
        validate_distribution(x, "p", out=np.empty(4)[::2])
    with pytest.raises(ValueError, match="`out` must be a row of 2 entries"):
        validate_distribution(x, "p", out=np.empty(3))
    with pytest.raises(ValueError, match="does not overlap `p`"):
        validate_distribution(x, "p", out=x)


def test_law_cache_rows_of_blocks():
    """LawCache's laws: the checked laws to the bit, read-only rows of a few blocks (grouped by the row kernels)."""
    from otspec.models import next_law
    from otspec.tree._process import LawCache

    V = 1000
    rng = np.random.default_rng(5)

    class M:
        vocab_size = V

        def __init__(self):
            self.laws = {}

        def next_dist(self, prefix):
            if prefix not in self.laws:
                x = rng.random(V)
                self.laws[prefix] = x / x.sum()
            return self.laws[prefix]

    class Bad:
        vocab_size = V

        def next_dist(self, prefix):
            return np.full(V, 2 / V)

    m = M()
    cache = LawCache(m, V, (3,), "draft")
    paths = [(i, j) for i in range(40) for j in range(20)]
    got = [cache(s) for s in paths]
    assert all(cache(s) is g for s, g in zip(paths, got))                  # memoised
    bases = {id(g.base) for g in got}
    assert 1 < len(bases) <= 8 and all(g.base is not None and g.base.ndim == 2 for g in got)
    for s, g in zip(paths, got):
        assert not g.flags.writeable
        np.testing.assert_array_equal(g.view(np.int64), next_law(m, (3,) + s, V, "draft").view(np.int64))
    with pytest.raises(ValueError, match=r"`draft.next_dist\(\(0,\)\)` must sum to 1 within 1e-09, got 2"):
        LawCache(Bad(), V, (), "draft")((0,))
