r"""Goodness-of-fit helpers for testing samplers against their exact laws.

A sampler that is claimed to draw from a law :math:`\pi` is checked by
Pearson's :math:`\chi^2` test on the counts of ``n_samples`` draws. With a
false-failure rate ``alpha_fail`` per test, a suite of ``m`` such tests fails
spuriously with probability at most ``m * alpha_fail`` (union bound); choose
``alpha_fail`` below ``1 / m`` (numpyro's ``gof`` convention).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validation import validate_distribution, validate_positive_int, validate_probability

__all__ = ["GofResult", "chi2_gof"]


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
        Upper-tail probability of the statistic.
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


def chi2_gof(counts, law, *, alpha_fail: float = 1e-4, min_expected: float = 5.0) -> GofResult:
    r"""Pearson :math:`\chi^2` goodness of fit of observed ``counts`` to an exact ``law``.

    .. math::

        X^2 = \sum_{c} \frac{(O_c - N \pi_c)^2}{N \pi_c},
        \qquad X^2 \sim \chi^2_{C - 1} \text{ under } H_0,

    after pooling cells whose expected count :math:`N\pi_c` is below
    ``min_expected`` into one cell. Any draw on a cell of probability zero
    fails the test outright.

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
        (fewer than two pooled cells with expected count >= ``min_expected``
        while the law has at least two cells of positive probability).

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

    law_ = validate_distribution(law, "law", tol=1e-8)
    c = np.asarray(counts)
    if c.shape != law_.shape:
        raise ValueError(f"`counts` must have the shape of `law` {law_.shape}, got {c.shape}")
    if c.dtype.kind not in "iu" or np.any(c < 0):
        raise ValueError("`counts` must be non-negative integers")
    alpha_fail = validate_probability(alpha_fail, "alpha_fail", low_open=True, high_open=True)
    N = int(c.sum())
    validate_positive_int(N, "sum(counts)")
    outside = int(c[law_ <= 0].sum())
    pos = law_ > 0
    o, e = c[pos].astype(np.float64), N * law_[pos]
    big = e >= min_expected
    obs = list(o[big])
    exp = list(e[big])
    if np.any(~big):
        obs.append(o[~big].sum())
        exp.append(e[~big].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    if obs_a.shape[0] < 2:
        if np.count_nonzero(pos) >= 2:
            raise ValueError(
                f"too few samples for a chi-square test: N={N} leaves fewer than two cells "
                f"with expected count >= {min_expected}"
            )
        return GofResult(0.0, 0, 1.0, outside == 0, int(obs_a.shape[0]), outside)
    stat = float(np.sum((obs_a - exp_a) ** 2 / exp_a))
    dof = obs_a.shape[0] - 1
    pvalue = float(stats.chi2.sf(stat, dof))
    return GofResult(stat, dof, pvalue, bool(pvalue > alpha_fail and outside == 0), int(obs_a.shape[0]), outside)
