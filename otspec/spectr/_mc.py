r"""Monte Carlo block efficiency of SpecTr, with a confidence interval, for models too large to enumerate."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validation import as_rng, validate_bool, validate_probability, validate_size
from ._common import resolve_verifier, validate_branching, validate_models, validate_prefix
from ._drafts import prefix_tree_drafts
from ._selection import _select, first_verifier

__all__ = ["MAX_MC_SAMPLES", "MCEstimate", "block_efficiency_mc"]


@dataclass(frozen=True, eq=False)
class MCEstimate:
    r"""Result of :func:`block_efficiency_mc`.

    Attributes
    ----------
    mean : float
        Sample mean of the decoded tokens per iteration (target call).
    std_error : float
        :math:`s / \sqrt{N}` with the sample standard deviation ``s``.
    ci_low, ci_high : float
        Normal-approximation confidence interval
        :math:`\bar\tau \mp z_{(1+c)/2}\, s/\sqrt N` (``tau`` is bounded in
        ``[1, L + 1]``, so the central limit theorem applies quickly).
    confidence : float
        The level ``c`` of the interval.
    n_samples : int
        Number of SpecTr iterations simulated.
    length_counts : (L + 1,) ndarray of int64
        ``length_counts[j - 1]`` = number of iterations that decoded ``j`` tokens.
    """

    mean: float
    std_error: float
    ci_low: float
    ci_high: float
    confidence: float
    n_samples: int
    length_counts: np.ndarray

    def __repr__(self) -> str:
        return (
            f"MCEstimate(mean={self.mean:.4f}, ci=[{self.ci_low:.4f}, {self.ci_high:.4f}], "
            f"confidence={self.confidence}, n_samples={self.n_samples})"
        )


#: Most SpecTr iterations simulated by one call of :func:`block_efficiency_mc`: each is a Python loop step (drafts,
#: selection and verification: 0.44 ms measured on the 2-token pair of the docstring, 0.94 ms at K = L = 4 with
#: k-Seq, more on larger models), so 10**5 runs for a minute or more and 10**9 ran for days; the documented uses
#: take at most 4,000. For more, call it in chunks with independent seeds and pool their
#: ``length_counts``.
MAX_MC_SAMPLES = 100_000


def block_efficiency_mc(
    draft,
    target,
    k,
    L,
    *,
    verifier="lp",
    branching=None,
    n_samples: int = 10_000,
    confidence: float = 0.95,
    prefix=(),
    rng=None,
    progress: bool = False,
) -> MCEstimate:
    r"""Monte Carlo estimate of SpecTr's block efficiency with a confidence interval.

    .. math::

        \hat{\mathbb E}[\tau] = \frac1N \sum_{i=1}^N \tau_i,
        \qquad \tau_i = |\mathrm{DraftSelection}(x^t, L, S_i)|,\quad
        S_i \text{ drawn from } \mathcal M_s,

    each :math:`\tau_i` from an independent draft set and verification
    (:func:`spectr_step`). Verifiers are built once per distinct
    ``(p, q, k)`` (memoised by :class:`VerifierFactory`).

    Parameters
    ----------
    draft, target : model
        Draft :math:`\mathcal M_s` and target :math:`\mathcal M_b` models.
    k, L : int
        Number and length of the draft sequences.
    verifier : str, callable or VerifierFactory, keyword-only
        Token-level verifier (see :func:`draft_selection`).
    branching : sequence of L int or None, keyword-only
        Prefix-tree branching; None: i.i.d. drafts.
    n_samples : int, keyword-only
        Number of iterations ``N >= 2``.
    confidence : float, keyword-only
        Level of the interval, in ``(0, 1)``.
    prefix : sequence of int, keyword-only
        The context of every iteration.
    rng : numpy.random.Generator, int or None, keyword-only
        Source of randomness.
    progress : bool, keyword-only
        Show a tqdm progress bar (tqdm is imported only then).

    Returns
    -------
    MCEstimate
        ``mean``, ``std_error``, ``ci_low``, ``ci_high``, ``length_counts``.

    Raises
    ------
    ValueError, TypeError
        Invalid ``K``, ``L``, ``branching``, ``n_samples`` outside ``[2, MAX_MC_SAMPLES]`` (10**5),
        ``confidence`` outside ``(0, 1)``, or invalid models; a first position's verifier
        (``k_1`` drafts) above its size limit, refused before any draft is drawn.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Algorithm 3, Section 5 (block efficiency).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import block_efficiency_mc
    >>> est = block_efficiency_mc(MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75]),
    ...                           1, 2, n_samples=1000, rng=0)
    >>> bool(est.ci_low < 2.3125 < est.ci_high)  # the exact value (block_efficiency)
    True
    """
    K = k  # SpecTr's letter for the number of draft sequences
    from scipy import stats

    n = validate_models(draft, target)
    ks = validate_branching(K, L, branching)
    ctx = validate_prefix(prefix, n)
    factory = resolve_verifier(verifier)
    n_samples = validate_size(n_samples, "n_samples", minimum=2, cap=MAX_MC_SAMPLES, cap_name="MAX_MC_SAMPLES",
                              hint="call in chunks with independent seeds and pool their `length_counts`")
    confidence = validate_probability(confidence, "confidence", low_open=True, high_open=True)
    show = validate_bool(progress, "progress")
    gen = as_rng(rng)
    first_verifier(draft, target, ks, ctx, n, factory)  # its size guard before any drafting
    it = range(n_samples)
    if show:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=f"SpecTr MC K={math.prod(ks)} L={len(ks)}", leave=False)
    counts = np.zeros(len(ks) + 1, dtype=np.int64)
    for _ in it:
        ds = prefix_tree_drafts(draft, ks, prefix=ctx, rng=gen)
        counts[len(_select(draft, target, ds, factory, ctx, n, gen)) - 1] += 1
    j = np.arange(1, len(ks) + 2)
    mean = float(np.dot(counts, j)) / n_samples
    var = float(np.dot(counts, (j - mean) ** 2)) / (n_samples - 1)
    se = math.sqrt(var / n_samples)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    counts.setflags(write=False)
    return MCEstimate(
        mean=mean,
        std_error=se,
        ci_low=mean - z * se,
        ci_high=mean + z * se,
        confidence=confidence,
        n_samples=n_samples,
        length_counts=counts,
    )
