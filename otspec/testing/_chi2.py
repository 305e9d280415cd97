r"""Pearson's :math:`\chi^2` goodness of fit, its pooling, and its power (sample-size rule).

A sampler that is claimed to draw from a law :math:`\pi` is checked by
Pearson's :math:`\chi^2` test on the counts of ``n_samples`` draws. With a
false-failure rate ``alpha_fail`` per test, a suite of ``m`` such tests fails
spuriously with probability at most ``m * alpha_fail`` (union bound); choose
``alpha_fail`` below ``1 / m`` (numpyro's ``gof`` convention).

The sample-size rule (:func:`sample_size`, :func:`detectable_tv`): a law
:math:`r` at total-variation distance :math:`\varepsilon` from :math:`\pi` on
the tested cells has :math:`\chi^2(r \,\|\, \pi) \ge 4\varepsilon^2`
(Cauchy--Schwarz), so Pearson's statistic on :math:`N` draws is (for large
:math:`N`) non-central :math:`\chi^2_{d}` with non-centrality at least
:math:`4 N \varepsilon^2`; :math:`N` is the smallest count whose power at
the level-``alpha_fail`` critical value reaches ``power``.

Tiny cells: when every cell but the largest is pooled (their mass
:math:`\delta` too small for an expected count of 5), Pearson's test has
nothing left to compare, and waiting for :math:`N\delta \ge 5` would take
:math:`5/\delta` draws (4.5 million for :math:`\delta = 1.1\cdot 10^{-6}`).
Those cells are tested together instead by the exact binomial test of the
number of draws that land on them: a law at total variation
:math:`\varepsilon > 2\delta` puts mass at least :math:`\varepsilon` there,
so the one-sided test detects it (:func:`sample_size` uses it whenever
:math:`\delta < \min(\varepsilon/2, 1/4)`).
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._validation import (
    as_array,
    first_bad_entry,
    validate_distribution,
    validate_positive_int,
    validate_probability,
    validate_size,
)

__all__ = ["GofResult", "chi2_gof", "sample_size", "detectable_tv", "MAX_SAMPLES", "MAX_UNIFORM_CELLS"]

#: Largest sample size the rule hands out (and :func:`~otspec.testing.check_sampler` runs):
#: about ten minutes of a vectorised step at 2e6 trials per second.
MAX_SAMPLES = 10**9
#: Largest ``law`` given as a number of cells (the uniform law on them: an array of that many floats, 80 MB here);
#: a law of more cells is passed as an array.
MAX_UNIFORM_CELLS = 10**7
#: Pooling threshold on expected counts used by every test of the module.
MIN_EXPECTED = 5.0
#: Largest mass of the pooled tail for which the binomial tail test runs (it detects TV above twice it).
TAIL_MAX = 0.25


@dataclass(frozen=True, eq=False)
class GofResult:
    """Result of :func:`chi2_gof`.

    Attributes
    ----------
    statistic : float
        Pearson's :math:`\\chi^2` statistic over the pooled cells.
    dof : int
        Degrees of freedom (pooled cells minus one).
    pvalue : float
        Upper-tail probability of the statistic; with two groups (one cell and a rare rest), the exact two-sided
        binomial test's p-value of the rest's count.
    passed : bool
        ``pvalue > alpha_fail`` and no draw fell outside the law's support.
    n_cells : int
        Number of cells after pooling rare ones.
    outside_support : int
        Draws that landed on cells of probability zero (each is a certain failure).
    """

    statistic: float
    dof: int
    pvalue: float
    passed: bool
    n_cells: int
    outside_support: int


def _min_expected(v) -> float:
    """``min_expected``: a finite real number > 0 (NaN or None would silently change which cells are pooled)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"`min_expected` must be a real number > 0, got {type(v).__name__}")
    if not (math.isfinite(float(v)) and v > 0):
        raise ValueError(f"`min_expected` must be a finite real number > 0, got {float(v)!r}")
    return float(v)


def _pool_mask(law: np.ndarray, N: int, min_expected: float) -> np.ndarray:
    """Cells of positive probability tested on their own (expected count >= ``min_expected``)."""
    return (law > 0) & (N * law >= min_expected)


def _tested_mask(law: np.ndarray, N: int, min_expected: float) -> np.ndarray:
    """Like :func:`_pool_mask`, then the pooled cell is grown until its expected count is >= ``min_expected``.

    (The smallest tested cells join it; a pooled cell of expected count below the threshold gives
    Pearson's statistic a heavier tail than chi-square: the false-failure rate would exceed ``alpha_fail``,
    e.g. 3.4e-3 instead of 1e-4 for the law (0.5, 0.499, 0.001) at N = 200, its pooled cell of expected count
    0.2.)
    """
    big = _pool_mask(law, N, min_expected)
    rest = float(law[(law > 0) & ~big].sum())
    if rest > 0 and N * rest < min_expected:
        order = np.flatnonzero(big)[np.argsort(law[big], kind="stable")]
        for i in order:
            if N * rest >= min_expected:
                break
            big[i] = False
            rest += float(law[i])
    return big


def _pearson(counts: np.ndarray, law: np.ndarray, min_expected: float):
    """Pearson's statistic after the pooling of :func:`_tested_mask`: ``(statistic, dof, n_cells, outside, N)``;
    ``dof`` may be 0."""
    N = int(counts.sum())
    outside = int(counts[law <= 0].sum())
    pos = law > 0
    big = _tested_mask(law, N, min_expected)
    obs = counts[big].astype(np.float64)
    exp = N * law[big]
    rest = pos & ~big
    if np.any(rest):
        obs = np.append(obs, counts[rest].sum())
        exp = np.append(exp, N * law[rest].sum())
    if obs.shape[0] < 2:
        return 0.0, 0, int(obs.shape[0]), outside, N
    return float(np.sum((obs - exp) ** 2 / exp)), obs.shape[0] - 1, int(obs.shape[0]), outside, N


def _tail_mass(law: np.ndarray, N: int, min_expected: float) -> float | None:
    """The mass of the cells outside the largest one when the pooling at ``N`` leaves one cell and it is below ``TAIL_MAX``.

    None when Pearson's test has cells to compare, when the law has a single
    cell of positive probability, or when the tail is too heavy for the tail test.
    """
    if np.count_nonzero(law > 0) < 2 or _dof_at(law, N, min_expected) > 0:
        return None
    rest = float(np.sort(law)[:-1].sum())  # not 1 - max: that rounds to 0 next to 1e-300 cells
    return rest if rest < TAIL_MAX else None


def _tail_critical(N: int, rest: float, alpha_fail: float) -> int:
    """Smallest count ``c`` with ``P(Binomial(N, rest) >= c) <= alpha_fail``."""
    from scipy import stats

    return int(stats.binom.isf(alpha_fail, N, rest)) + 1


def _tail_pvalue(hits: int, N: int, rest: float) -> float:
    """``P(Binomial(N, rest) >= hits)``: the exact one-sided p-value of the tail test."""
    from scipy import stats

    return float(stats.binom.sf(hits - 1, N, rest)) if hits > 0 else 1.0


def _tail_power_tv(N: int, rest: float, alpha_fail: float, power: float) -> float:
    """The smallest TV the tail test detects with probability ``power`` at ``N`` draws (at least ``2 rest``)."""
    from scipy import optimize, stats

    c = _tail_critical(N, rest, alpha_fail)
    if c > N or stats.binom.sf(c - 1, N, 1.0) < power:
        return 1.0
    eps = float(optimize.brentq(lambda e: stats.binom.sf(c - 1, N, e) - power, 0.0, 1.0, xtol=1e-12))
    return min(1.0, max(eps, 2.0 * rest))


def _tail_size(tv: float, rest: float, alpha_fail: float, power: float) -> int:
    """Smallest ``N`` at which the tail test detects mass ``tv`` on the tail with probability ``power``."""
    from scipy import stats

    def ok(n: int) -> bool:
        return stats.binom.sf(_tail_critical(n, rest, alpha_fail) - 1, n, tv) >= power

    lo = max(1, math.ceil(math.log1p(-power) / math.log1p(-tv)) if tv < 1 else 1)  # c = 1: no fewer
    hi = lo
    while not ok(hi):
        lo, hi = hi + 1, 2 * hi
        if hi > MAX_SAMPLES:
            return MAX_SAMPLES + 1
    while lo < hi:  # the first n passing in [lo, hi] (power is near-monotone in n; the scan is exact on its grid)
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def chi2_gof(counts, law, *, alpha_fail: float = 1e-4, min_expected: float = MIN_EXPECTED) -> GofResult:
    r"""Pearson :math:`\chi^2` goodness of fit of observed ``counts`` to an exact ``law``.

    .. math::

        X^2 = \sum_{c} \frac{(O_c - N \pi_c)^2}{N \pi_c},
        \qquad X^2 \sim \chi^2_{C - 1} \text{ under } H_0,

    after pooling cells whose expected count :math:`N\pi_c` is below
    ``min_expected`` into one cell, and, while that cell's own expected
    count is below ``min_expected``, the smallest tested cells into it too
    (a pooled cell of smaller expected count gives the statistic a heavier
    tail than :math:`\chi^2`: a false-failure rate above ``alpha_fail``).
    Where that growth would leave a single cell (one cell of expected count
    at least ``min_expected`` beside a rest of mass :math:`r` with
    :math:`N r <` ``min_expected``), the two groups are tested instead by the
    exact two-sided binomial test of the rest's count against
    :math:`\mathrm{Bin}(N, r)` (``dof`` 1, ``statistic`` Pearson's of the
    two groups): a false-failure rate at most ``alpha_fail`` without the
    :math:`\chi^2` approximation.
    Any draw on a cell of probability zero fails the test outright.

    Parameters
    ----------
    counts : (m,) array_like of int
        Observed counts per cell.
    law : (m,) array_like of float
        The exact law (summing to 1).
    alpha_fail : float, keyword-only
        The false-failure rate: the test fails when the p-value is at or below it.
    min_expected : float, keyword-only
        Pooling threshold on expected counts.

    Returns
    -------
    GofResult

    Raises
    ------
    ValueError
        Shapes differ, counts are negative, or there are too few samples
        (no cell with expected count >= ``min_expected`` while the law has at
        least two cells of positive probability).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.testing import chi2_gof
    >>> rng = np.random.default_rng(0)
    >>> law = np.array([0.2, 0.3, 0.5])
    >>> counts = np.bincount(rng.choice(3, size=10_000, p=law), minlength=3)
    >>> chi2_gof(counts, law).passed
    True
    """
    from scipy import stats

    law_ = validate_distribution(law, "law", tol=1e-8, normalizable=False)
    c = as_array(counts, "counts", "an array_like of non-negative integer counts")
    if c.shape != law_.shape:
        raise ValueError(f"`counts` must have the shape of `law` {law_.shape}, got {c.shape}")
    if c.dtype.kind not in "iu":
        if c.dtype.kind == "f" and np.all(np.isfinite(c)) and np.all(c == np.floor(c)):
            got = f"whole numbers of dtype {c.dtype} (cast them to int)"
        elif c.dtype.kind == "f":
            got = first_bad_entry(c, ~np.isfinite(c) | (c != np.floor(c)))
        else:
            got = f"dtype {c.dtype}"
        raise ValueError(f"`counts` must be non-negative integers, got {got}")
    if np.any(c < 0):
        raise ValueError(f"`counts` must be non-negative integers, got {first_bad_entry(c, c < 0)}")
    alpha_fail = validate_probability(alpha_fail, "alpha_fail", low_open=True, high_open=True)
    min_expected = _min_expected(min_expected)
    N = int(c.sum())
    validate_positive_int(N, "sum(counts)")
    stat, dof, n_cells, outside, _ = _pearson(c, law_, min_expected)
    big = _pool_mask(law_, N, min_expected)
    rest = (law_ > 0) & ~big
    if dof == 0 and np.count_nonzero(big) == 1 and np.any(rest):
        # one cell of expected count >= min_expected and a rest below it: the grown pooling left one cell; the two
        # groups by the exact binomial test of the rest's count (no chi-square approximation to lose the rate)
        r = float(law_[rest].sum())
        hits = int(c[rest].sum())
        n = N - outside
        if n == 0:
            return GofResult(0.0, 1, 1.0, False, 2, outside)
        e = np.array([n * (1.0 - r), n * r])
        o = np.array([n - hits, hits], dtype=np.float64)
        stat = float(np.sum((o - e) ** 2 / e))
        pvalue = float(stats.binomtest(hits, n, r).pvalue)
        return GofResult(stat, 1, pvalue, bool(pvalue > alpha_fail and outside == 0), 2, outside)
    if dof == 0:
        if np.count_nonzero(law_ > 0) >= 2:
            raise ValueError(
                f"too few samples for a chi-square test: N={N} leaves fewer than two cells "
                f"with expected count >= {min_expected}"
            )
        return GofResult(0.0, 0, 1.0, outside == 0, n_cells, outside)
    pvalue = float(stats.chi2.sf(stat, dof))
    return GofResult(stat, dof, pvalue, bool(pvalue > alpha_fail and outside == 0), n_cells, outside)


# ---------------------------------------------------------------------------
# power and sample size
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _critical_lambda(dof: int, alpha_fail: float, power: float) -> float:
    r"""Smallest non-centrality :math:`\lambda` with :math:`P(\chi^2_{d}(\lambda) > c_\alpha) \ge` ``power``."""
    from scipy import optimize, stats

    crit = float(stats.chi2.isf(alpha_fail, dof))

    def gap(lam: float) -> float:
        return float(stats.ncx2.sf(crit, dof, lam)) - power

    hi = 1.0
    while gap(hi) < 0:
        hi *= 2.0
    return float(optimize.brentq(gap, hi / 2 if hi > 1 else 0.0, hi, xtol=1e-10, rtol=1e-12))


def _law_or_cells(law) -> np.ndarray:
    """``law`` as a distribution; an int ``C`` stands for the uniform law on ``C`` cells."""
    if isinstance(law, (int, np.integer)) and not isinstance(law, bool):
        C = validate_size(law, "law", cap=MAX_UNIFORM_CELLS, cap_name="MAX_UNIFORM_CELLS",
                          hint="pass the law as an array")  # law=10**18 was a MemoryError
        return np.full(C, 1.0 / C)
    return validate_distribution(law, "law", tol=1e-8, normalizable=False)


def _dof_at(law: np.ndarray, N: int, min_expected: float) -> int:
    tested = _tested_mask(law, N, min_expected)
    big = int(np.count_nonzero(tested))
    rest = bool(np.any((law > 0) & ~tested))
    return max(big + rest - 1, 0)


def _size_for(tv: float, dof: int, alpha_fail: float, power: float) -> int:
    if dof == 0:
        # one cell of positive probability: a law at TV tv puts mass tv outside it,
        # and one draw there fails the check: (1 - tv)**N <= 1 - power
        return max(1, math.ceil(math.log1p(-power) / math.log1p(-tv))) if tv < 1 else 1
    return max(1, math.ceil(_critical_lambda(dof, alpha_fail, power) / (4.0 * tv * tv)))


def _check_args(tv, power, alpha_fail, name="tv"):
    tv = validate_probability(tv, name, low_open=True)
    power = validate_probability(power, "power", low_open=True, high_open=True)
    alpha_fail = validate_probability(alpha_fail, "alpha_fail", low_open=True, high_open=True)
    return tv, power, alpha_fail


def sample_size(tv, law, *, power: float = 0.99, alpha_fail: float = 1e-4,
                min_expected: float = MIN_EXPECTED) -> int:
    r"""Draws needed to detect a law at total variation ``tv`` from ``law`` with probability ``power``.

    .. math::

        N(\varepsilon) = \Big\lceil \frac{\lambda^\star(d)}{4\varepsilon^2} \Big\rceil,
        \qquad
        P\big(\chi^2_{d}(\lambda^\star) > \chi^2_{d,\,1-\alpha}\big) = \text{power},
        \qquad d = d(N) = \#\{\text{pooled cells at } N\} - 1,

    the smallest :math:`N` with :math:`N \ge N(\varepsilon, d(N))`, where
    :math:`d(N)` counts the cells after pooling those whose expected count
    :math:`N\pi_c` is below ``min_expected`` (and, while the pooled cell's own
    expected count is below it, the next smallest): the test run with :math:`N` draws
    has exactly :math:`d(N)` degrees of freedom.
    With a single cell of positive probability every deviation is mass outside
    the support, detected when one of :math:`N` draws lands there:
    :math:`N = \lceil \log(1 - \text{power}) / \log(1 - \varepsilon) \rceil`.
    When all cells but the largest have a total mass :math:`\delta < \min(\varepsilon/2, 1/4)`
    too small to be tested at that size, they are tested together by the exact
    binomial test of the draws landing on them (a law at total variation
    :math:`\varepsilon > 2\delta` puts mass at least :math:`\varepsilon` there):
    :math:`N` is the smallest size at which that test has the power.

    Parameters
    ----------
    tv : float
        Total-variation distance to detect, in (0, 1].
    law : (m,) array_like of float, or int
        The exact law the sampler should follow; an int ``m`` stands for the
        uniform law on ``m`` cells (at most :data:`MAX_UNIFORM_CELLS`).
    power : float, keyword-only
        Detection probability (0.99 by default).
    alpha_fail : float, keyword-only
        False-failure rate of the test.
    min_expected : float, keyword-only
        Pooling threshold on expected counts.

    Returns
    -------
    int
        The sample size :math:`N`.

    Raises
    ------
    ValueError
        Arguments out of range, or :math:`N` above :data:`MAX_SAMPLES`.

    Notes
    -----
    The guarantee is for the law on the cells actually tested (pooled cells
    are tested as one) and uses the non-central :math:`\chi^2` approximation
    of Pearson's statistic; the suite checks the power empirically.

    References
    ----------
    .. [1] Cohen, *Statistical Power Analysis for the Behavioral Sciences*, ch. 7
       (non-centrality :math:`N w^2` of Pearson's test, :math:`w^2 = \chi^2(r\|\pi)`).

    Examples
    --------
    >>> from otspec.testing import sample_size
    >>> sample_size(0.02, 2), sample_size(0.02, 5)
    (24157, 29897)
    """
    tv, power, alpha_fail = _check_args(tv, power, alpha_fail)
    min_expected = _min_expected(min_expected)
    law_ = _law_or_cells(law)
    several = np.count_nonzero(law_ > 0) >= 2
    # the smallest N with N >= N(tv, d(N)): d(N) and so N(tv, d(N)) never decrease with N, hence
    # the increasing iteration N <- N(tv, d(N)) from below stops exactly there
    N = 1
    while True:
        d = _dof_at(law_, N, min_expected)
        if d == 0 and several:  # everything pooled into one cell: no chi-square test yet
            top = float(law_.max())
            rest = float(np.sort(law_)[:-1].sum())  # not 1 - top: that rounds to 0 next to 1e-300 cells
            if rest < min(tv / 2, TAIL_MAX):
                # a tiny tail: the exact binomial test of the draws landing on it (module docstring)
                need = max(N, _tail_size(tv, rest, alpha_fail, power))
                if need <= MAX_SAMPLES and _dof_at(law_, need, min_expected) == 0:
                    N = need
                    break
                need = max(need, N + 1)
            else:
                need = max(N + 1, math.ceil(min_expected / top), math.ceil(min_expected / rest))
        else:
            need = _size_for(tv, d, alpha_fail, power)
        if need <= N or need > MAX_SAMPLES:
            N = max(N, need)
            break
        N = need
    if N > MAX_SAMPLES:
        raise ValueError(
            f"`tv`={tv:g} needs {N} samples, above the stated limit MAX_SAMPLES={MAX_SAMPLES}; "
            "raise `tv` or pass `n_samples`"
        )
    return N


def detectable_tv(n_samples, law, *, power: float = 0.99, alpha_fail: float = 1e-4,
                  min_expected: float = MIN_EXPECTED) -> float:
    r"""The total-variation distance that ``n_samples`` draws detect with probability ``power``.

    .. math::

        \varepsilon(N) = \sqrt{\lambda^\star(d) / (4N)},

    the inverse of :func:`sample_size` at the pooling of :math:`N` draws
    (:math:`1 - (1 - \text{power})^{1/N}` when a single cell has positive probability).

    Parameters
    ----------
    n_samples : int
    law : (m,) array_like of float, or int
        As in :func:`sample_size`.
    power, alpha_fail, min_expected : float, keyword-only
        As in :func:`sample_size`.

    Returns
    -------
    float
        In (0, 1]; ``1.0`` when the pooling leaves no test at all. When the
        pooling leaves one cell and a tail of mass :math:`\delta` below 1/4
        (see :func:`sample_size`), the binomial tail test's, at least :math:`2\delta`.

    Raises
    ------
    TypeError, ValueError
        ``n_samples`` not a positive integer, an invalid ``law``, or
        ``power`` / ``alpha_fail`` outside (0, 1).

    Examples
    --------
    >>> from otspec.testing import detectable_tv
    >>> round(detectable_tv(24157, 2), 4)
    0.02
    """
    N = validate_positive_int(n_samples, "n_samples")
    _, power, alpha_fail = _check_args(1.0, power, alpha_fail)
    min_expected = _min_expected(min_expected)
    law_ = _law_or_cells(law)
    dof = _dof_at(law_, N, min_expected)
    if dof == 0:
        rest = _tail_mass(law_, N, min_expected)
        if rest is not None:
            return _tail_power_tv(N, rest, alpha_fail, power)
        if np.count_nonzero(law_ > 0) >= 2:
            return 1.0
        return float(-math.expm1(math.log1p(-power) / N))
    return min(1.0, math.sqrt(_critical_lambda(dof, alpha_fail, power) / (4.0 * N)))
