r"""Measured against predicted: block efficiency, per-position acceptance, wall-clock, losslessness."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from fractions import Fraction

import numpy as np

from .._validation import TORCH_SEEDS, validate_positive_int, validate_probability, validate_seed, validate_size
from .._verifier import LosslessCheck
from ..speculative import expected_tokens
from ..testing import chi2_gof
from ..testing._chi2 import MIN_EXPECTED
from ._deps import require
from ._loop import (
    MAX_NEW_TOKENS,
    BaselineResult,
    DecodeResult,
    _deprecated_verifier_name,
    _resolve,
    _validate_common,
    speculative_decode,
)
from ._models import next_token_logits, validate_language_model, validate_prompt
from ._sampling import Sampling

torch = require("torch", "otspec.decoding")

__all__ = ["DecodingSummary", "summarize", "exact_prefix_law", "LosslessCheck", "check_lossless"]

#: Largest ``n_runs`` of :func:`check_lossless` (each run a decoding): ``10**18`` ran until interrupted,
#: ``2**64`` was an OverflowError.
MAX_RUNS = 10**7

#: two-sided 95 % normal quantile
Z95 = 1.959963984540054


@dataclass(frozen=True, eq=False)
class DecodingSummary:
    r"""Measured and predicted metrics of one verifier over several runs (:func:`summarize`).

    Attributes
    ----------
    verifier_name : str
        The verifier's name (``.verifier`` is a deprecated alias).
    k, L : int
        ``K`` and ``L``.
    temperature : float
    top_k : int or None
    top_p : float or None
    lossless : bool
    runs, iterations, tokens : int
        Runs pooled, target scorings, generated tokens.
    block_efficiency : float
        Measured tokens per serial target call, :math:`\sum e_i / \sum c_i`.
    block_efficiency_ci : tuple of float
        95 % interval (normal approximation, ratio estimator with the
        delta method; iterations are treated as independent).
    predicted_block_efficiency : float
        :math:`\sum \hat e_i / \sum \hat c_i` from the exact analysis of the
        logged laws (see :class:`DecodeResult`).
    iid_block_efficiency : float
        Leviathan's i.i.d. approximation :math:`(1 - \bar\alpha^{L+1})/(1 - \bar\alpha)`
        with :math:`\bar\alpha` the mean first-depth acceptance (``alpha_first``).
    mean_accepted, predicted_mean_accepted : float
        Accepted draft tokens per iteration.
    z_accepted : float
        :math:`\sum_i (\tau_i - \hat\tau_i) / \sqrt{\sum_i (\tau_i - \hat\tau_i)^2}`:
        the differences are martingale differences under the model, so
        :math:`|z| < 1.96` is the 95 % agreement check.
    per_position : (L,) ndarray
        Measured :math:`P(\tau \ge j)`, ``j = 1..L``, over every iteration
        (one that drafted fewer than ``j`` tokens counts 0, measured and
        predicted alike: the two sum to ``mean_accepted`` and
        ``predicted_mean_accepted``).
    per_position_predicted : (L,) ndarray
        Predicted :math:`P(\tau \ge j)`.
    alpha_first, alpha_opt_first : float
        Mean exact acceptance of the first-depth verification, and mean
        :math:`\alpha_K(p_1, q_1)` (the optimum for ``K`` drafts), over the
        iterations that drafted (``DecodeResult.draft_lengths > 0``: the
        last iteration of a run may be plain decoding's step, which
        verifies nothing).
    wall_time : float
        Seconds of decoding.
    tokens_per_second : float
    baseline_tokens_per_second : float or None
        Autoregressive decoding of the target (:func:`autoregressive_decode`).
    speedup : float or None
        ``tokens_per_second / baseline_tokens_per_second``.
    """

    verifier_name: str
    k: int
    L: int
    temperature: float
    top_k: int | None
    top_p: float | None
    lossless: bool
    runs: int
    iterations: int
    tokens: int
    block_efficiency: float
    block_efficiency_ci: tuple[float, float]
    predicted_block_efficiency: float
    iid_block_efficiency: float
    mean_accepted: float
    predicted_mean_accepted: float
    z_accepted: float
    per_position: np.ndarray
    per_position_predicted: np.ndarray
    alpha_first: float
    alpha_opt_first: float
    wall_time: float
    tokens_per_second: float
    baseline_tokens_per_second: float | None
    speedup: float | None

    verifier = property(_deprecated_verifier_name, doc="Deprecated alias of ``verifier_name``.")

    @property
    def agrees(self) -> bool:
        """``|z_accepted| < 1.96``: measured acceptance agrees with the prediction at the 95 % level."""
        return bool(abs(self.z_accepted) < Z95) if math.isfinite(self.z_accepted) else True

    @property
    def seconds_per_token(self) -> float | None:
        """``1 / tokens_per_second`` (None when no token was timed)."""
        return 1.0 / self.tokens_per_second if self.tokens_per_second > 0 else None

    def as_record(self) -> dict:
        """A JSON-ready dict (one record of ``results/decoding.json``): every attribute under its own name.

        The fields above plus the properties ``agrees`` and ``seconds_per_token``;
        arrays and tuples become lists.
        """
        rec = {}
        for f in fields(self):
            v = getattr(self, f.name)
            rec[f.name] = v.tolist() if isinstance(v, np.ndarray) else list(v) if isinstance(v, tuple) else v
        rec["agrees"] = self.agrees
        rec["seconds_per_token"] = self.seconds_per_token
        return rec


def summarize(results: Sequence[DecodeResult], baseline: Sequence[BaselineResult] | None = None) -> DecodingSummary:
    r"""Pool runs of one configuration; put measured and predicted side by side.

    .. math::

        \widehat{BE} = \frac{\sum_i e_i}{\sum_i c_i}, \qquad
        \mathrm{se} = \frac{\sqrt{\sum_i (e_i - \widehat{BE}\, c_i)^2}}{\sum_i c_i},

    with :math:`e_i` the tokens and :math:`c_i` the serial target calls of
    iteration :math:`i`; the prediction replaces them by their exact
    conditional expectations given the logged laws.

    Parameters
    ----------
    results : sequence of DecodeResult
        Runs with the same verifier, ``K``, ``L`` and sampling.
    baseline : sequence of BaselineResult, optional
        Autoregressive runs of the target for the wall-clock comparison.

    Returns
    -------
    DecodingSummary

    Raises
    ------
    ValueError
        ``results`` empty or mixing configurations.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM, speculative_decode, summarize
    >>> lm = CallableLM(lambda ids: torch.zeros(ids.shape + (4,)), vocab_size=4)
    >>> runs = [speculative_decode([0], draft=lm, target=lm, L=3, max_new_tokens=8, rng=s) for s in range(3)]
    >>> S = summarize(runs)
    >>> S.block_efficiency, S.predicted_block_efficiency   # identical models: every draft accepted
    (4.0, 4.0)
    """
    results = list(results)
    if not results:
        raise ValueError("`results` must hold at least one DecodeResult, got none")
    for r in results:
        if not isinstance(r, DecodeResult):
            raise TypeError(f"`results` must hold DecodeResult objects, got {type(r).__name__}")
    r0 = results[0]
    key = (r0.verifier_name, r0.k, r0.L, r0.sampling)
    for r in results[1:]:
        if (r.verifier_name, r.k, r.L, r.sampling) != key:
            raise ValueError("`results` must share verifier, k, L and sampling")
    cat = lambda name: np.concatenate([getattr(r, name) for r in results])  # noqa: E731
    e, c = cat("emitted").astype(np.float64), cat("target_calls").astype(np.float64)
    pe, pc = cat("predicted_emitted"), cat("predicted_calls")
    acc, pacc = cat("accepted").astype(np.float64), cat("predicted_accepted")
    be = float(e.sum() / c.sum())
    se = float(math.sqrt(np.sum((e - be * c) ** 2)) / c.sum())
    d = acc - pacc
    ss = float(np.sum(d**2))
    z = float(d.sum() / math.sqrt(ss)) if ss > 0 else (0.0 if abs(d.sum()) < 1e-12 else float("inf"))
    L = r0.L
    reached = np.concatenate([r.reached for r in results]).reshape(-1, L)
    preached = np.concatenate([r.predicted_reached for r in results]).reshape(-1, L)
    drafted = np.concatenate([_drafted(r) for r in results])  # iterations that verified drafts
    a1, a_opt = cat("alpha_first")[drafted], cat("alpha_opt_first")[drafted]
    wall = float(sum(r.wall_time for r in results))
    ntok = int(sum(r.tokens.shape[0] for r in results))
    tps = ntok / wall if wall > 0 else float("inf")
    btps = None
    if baseline:
        bt = float(sum(b.wall_time for b in baseline))
        bn = int(sum(b.tokens.shape[0] for b in baseline))
        btps = bn / bt if bt > 0 else float("inf")
    return DecodingSummary(
        verifier_name=r0.verifier_name,
        k=r0.k,
        L=L,
        temperature=r0.sampling.temperature,
        top_k=r0.sampling.top_k,
        top_p=r0.sampling.top_p,
        lossless=all(r.lossless for r in results),
        runs=len(results),
        iterations=int(e.shape[0]),
        tokens=ntok,
        block_efficiency=be,
        block_efficiency_ci=(be - Z95 * se, be + Z95 * se),
        predicted_block_efficiency=float(pe.sum() / pc.sum()),
        iid_block_efficiency=float(expected_tokens(_mean(a1), L)) if a1.size else math.nan,
        mean_accepted=float(acc.mean()),
        predicted_mean_accepted=float(pacc.mean()),
        z_accepted=z,
        per_position=reached.mean(axis=0),
        per_position_predicted=preached.mean(axis=0),
        alpha_first=_mean(a1),
        alpha_opt_first=_mean(a_opt),
        wall_time=wall,
        tokens_per_second=tps,
        baseline_tokens_per_second=btps,
        speedup=(tps / btps) if btps else None,
    )


def _drafted(r: DecodeResult) -> np.ndarray:
    """Which iterations of ``r`` verified drafts (``L_i > 0``; every one of a result without ``draft_lengths``)."""
    if r.draft_lengths is None:
        return np.ones(r.iterations, dtype=bool)
    return np.asarray(r.draft_lengths) > 0


def _mean(a: np.ndarray) -> float:
    """The mean of ``a``; NaN when empty (no warning)."""
    return float(a.mean()) if a.size else math.nan


def exact_prefix_law(
    target,
    prompt,
    num_tokens: int = 1,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_cells: int = 200_000,
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    r"""Exact law of the first ``num_tokens`` generated tokens under the (processed) target.

    .. math::

        P(y_{1:m}) = \prod_{t=1}^{m} q(y_t \mid \text{prompt}, y_{1:t-1}),

    enumerated over the support, one batched target call per depth. At
    ``temperature=0`` it is the greedy continuation, with probability 1.

    Parameters
    ----------
    target : LanguageModel
    prompt : sequence of int
    num_tokens : int
        ``m >= 1``.
    temperature, top_k, top_p : keyword-only
        As in :class:`Sampling`.
    max_cells : int, keyword-only
        Refuse (ValueError) to enumerate more prefixes than this.

    Returns
    -------
    prefixes : list of tuple of int
        The ``m``-token continuations of positive probability.
    law : (len(prefixes),) ndarray of float64
        Their probabilities (summing to 1).

    Raises
    ------
    ValueError
        An empty prompt or out-of-range ids, ``num_tokens < 1``, bad sampling
        parameters, or more than ``max_cells`` prefixes.
    TypeError
        ``target`` not a :class:`LanguageModel`, non-integer ids.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM, exact_prefix_law
    >>> lm = CallableLM(lambda ids: torch.zeros(ids.shape + (3,)), vocab_size=3)
    >>> cells, law = exact_prefix_law(lm, [0], 2)
    >>> len(cells), float(law.sum())
    (9, 1.0)
    """
    V = validate_language_model(target, "target")
    prompt_ = validate_prompt(prompt, V)
    m = validate_size(num_tokens, "num_tokens", cap=MAX_NEW_TOKENS, cap_name="MAX_NEW_TOKENS",
                      hint="ask for fewer tokens")  # a one-hot law never passes max_cells: one call per token
    max_cells = validate_positive_int(max_cells, "max_cells")
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    prefixes: list[tuple[int, ...]] = [()]
    probs = np.ones(1)
    for _ in range(m):
        laws = sampling.probs(next_token_logits(target, [prompt_ + list(x) for x in prefixes]))
        laws = laws.detach().to("cpu").numpy()
        new_p, new_w = [], []
        for x, w, law in zip(prefixes, probs, laws):
            nz = np.flatnonzero(law > 0)
            new_p.extend(x + (int(t),) for t in nz)
            new_w.append(w * law[nz])
        if len(new_p) > max_cells:
            raise ValueError(
                f"the exact law of {m} tokens has more than `max_cells`={max_cells} prefixes; "
                "use top_k / top_p or fewer tokens"
            )
        prefixes, probs = new_p, np.concatenate(new_w)
    return prefixes, probs


@dataclass(frozen=True, eq=False)
class DecodingCheck(LosslessCheck):
    r"""χ² test that speculative decoding's first tokens follow the target exactly (:func:`check_lossless`).

    The core fields are those of :class:`otspec.LosslessCheck`, with
    ``method="sampling"``: ``law`` holds the empirical frequencies of the
    first ``num_tokens`` decoded tokens over the target's support (its last
    cell counts draws outside the support), ``target_law`` the exact law of
    those tokens from plain target scoring (:func:`exact_prefix_law`),
    ``max_error`` the largest cell difference, ``n_cases`` the decoding runs.

    Attributes
    ----------
    verifier_name : str
        The verifier's name (``.verifier`` is a deprecated alias).
    num_tokens : int
        Length of the tested continuation.
    statistic, pvalue : float
        Pearson's χ² and its p-value (:func:`otspec.testing.chi2_gof`).
    dof : int
    alpha_fail : float
        The false-failure rate of the test.
    n_cells : int
        Cells after pooling.
    tv_empirical : float
        Total variation between the empirical and the exact law (descriptive).
    cells : tuple of tuple of int
        The token sequences of ``law``'s cells (the last cell, outside the
        support, has none).
    """

    verifier_name: str
    num_tokens: int
    statistic: float
    pvalue: float
    dof: int
    alpha_fail: float
    n_cells: int
    tv_empirical: float
    cells: tuple

    verifier = property(_deprecated_verifier_name, doc="Deprecated alias of ``verifier_name``.")

    @property
    def n_runs(self) -> int:
        """Alias of ``n_cases`` (independent decoding runs)."""
        return self.n_cases


def min_runs(law) -> int:
    r"""Fewest decoding runs for which :func:`otspec.testing.chi2_gof` runs Pearson's test on ``law``.

    .. math::

        N_{\min} = \min\{N : N \max_c \pi_c \ge 5,\ N (1 - \max_c \pi_c) \ge 5\}

    (:func:`otspec.testing.chi2_gof` pools the cells of expected count below
    5 into one, that cell too until its expected count is 5; with the
    likeliest cell on its own and the rest each of expected count at least
    5 it runs Pearson's test, below that the exact binomial test of the
    rest's count, which has little power: :func:`check_lossless` asks for
    Pearson's); ``1`` for a law with a single cell (greedy decoding: every
    run must then give that one continuation).

    Parameters
    ----------
    law : (C,) ndarray of float64
        The exact law of the tested continuations (positive entries).

    Returns
    -------
    int

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.decoding._metrics import min_runs
    >>> min_runs(np.full(100, 0.01)), min_runs(np.array([1.0]))
    (500, 1)
    """
    law = np.asarray(law, dtype=np.float64)
    if np.count_nonzero(law > 0) < 2:
        return 1
    srt = np.sort(law)
    # the rest summed, not 1 - top (0 next to 1e-300 cells); the smaller of the two cells decides
    return max(_fewest(float(srt[-1])), _fewest(float(srt[:-1].sum())))


def _fewest(mass: float) -> int:
    """The smallest ``n >= 1`` with ``n * mass >= MIN_EXPECTED``, in rationals (``5 / mass`` may overflow)."""
    return max(1, math.ceil(Fraction(MIN_EXPECTED) / Fraction(mass)))


def _torch_generator(rng):
    """One ``torch.Generator`` for all runs: seeds of any integral type (``3``, ``np.int64(3)``) seed a new one.

    A numpy integer used to be handed on unchanged, so every run re-seeded from
    it and all runs were identical (a false failure).
    """
    if isinstance(rng, torch.Generator):
        return rng
    if rng is None:
        return torch.Generator().manual_seed(int(np.random.SeedSequence().generate_state(1)[0]))
    return torch.Generator().manual_seed(validate_seed(rng, "rng", below=TORCH_SEEDS))


def check_lossless(
    prompt,
    *,
    draft,
    target,
    verifier="token",
    num_tokens: int = 1,
    n_runs: int = 2000,
    rng=0,
    alpha_fail: float = 1e-3,
    k: int = 1,
    L: int = 2,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    verifier_options: dict | None = None,
    progress: bool = False,
) -> LosslessCheck:
    r"""Run speculative decoding ``n_runs`` times and test its first tokens against the target's law.

    .. math::

        H_0:\ Y_{1:m} \sim q(\cdot \mid \text{prompt}), \qquad
        X^2 = \sum_c \frac{(O_c - N \pi_c)^2}{N \pi_c} \sim \chi^2_{C-1},

    with :math:`\pi` from :func:`exact_prefix_law` (an independent route:
    plain target scoring, no verifier involved). A lossless verifier fails
    with probability ``alpha_fail``. The sample size is checked against
    :math:`\pi` before any decoding run (:func:`min_runs`). At
    ``temperature=0`` :math:`\pi` is one greedy continuation, one run
    suffices, and the check is exact: it passes only if every run emits it.

    Parameters
    ----------
    prompt : sequence of int
    draft, target : LanguageModel, keyword-only
        Draft (``p``) and target (``q``) models.
    verifier : str or callable, keyword-only
    num_tokens : int, keyword-only
        ``m``: tokens tested jointly (``m <= L + 1`` tests one iteration).
        Each run decodes :math:`\max(m, L + 1)` tokens, so that its first
        iteration drafts all ``L`` (asked for fewer, the decoder would draft
        fewer: see :func:`speculative_decode`, last iterations), and its
        first ``m`` are tested; ``m > L + 1`` tests the shortened last
        iterations too.
    n_runs : int, keyword-only
        In ``[1, MAX_RUNS]`` (10**7).
    rng : torch.Generator, int or None, keyword-only
        One generator drives all runs (each run advances it); an integer seed
        of any integral type (``3``, ``np.int64(3)``), ``>= 0``, seeds it.
    alpha_fail : float, keyword-only
    k, L, temperature, top_k, top_p, verifier_options : keyword-only
        As in :func:`speculative_decode`.
    progress : bool, keyword-only

    Returns
    -------
    DecodingCheck

    Raises
    ------
    ValueError
        The errors of :func:`speculative_decode` and :func:`exact_prefix_law`
        (bad prompt, ``k``, ``L``, sampling, verifier, vocabulary sizes, a law
        with more than its ``max_cells`` prefixes), ``n_runs < 1``,
        ``alpha_fail`` outside (0, 1), a negative ``rng`` seed -- all before
        any model call; ``n_runs`` below :func:`min_runs` of the exact law
        (too few for the test) -- after the ``num_tokens`` batched target
        calls that enumerate that law, before any decoding run (no draft call).
    TypeError
        Models that are not :class:`LanguageModel`, a bad ``rng``.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM, check_lossless
    >>> g = torch.Generator().manual_seed(0)
    >>> tq, tp = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    >>> target = CallableLM(lambda ids: tq[ids], 4)
    >>> draft = CallableLM(lambda ids: tp[ids], 4)
    >>> chk = check_lossless([0], draft=draft, target=target, verifier="kseq", k=2, n_runs=300, rng=1)
    >>> chk.passed, chk.method
    (True, 'sampling')
    """
    from tqdm.auto import tqdm


    n_runs = validate_size(n_runs, "n_runs", cap=MAX_RUNS, cap_name="MAX_RUNS", hint="check in several calls")
    alpha_fail = validate_probability(alpha_fail, "alpha_fail", low_open=True, high_open=True)
    m = validate_size(num_tokens, "num_tokens", cap=MAX_NEW_TOKENS, cap_name="MAX_NEW_TOKENS",
                      hint="test fewer tokens")  # 10**18: one batched target call per token, forever
    # every argument is checked before the first model call (the exact law below calls the target)
    V, _, _, sampling, _ = _validate_common(target, prompt, m, temperature, top_k, top_p, None)
    Vd = validate_language_model(draft, "draft")
    if Vd != V:
        raise ValueError(
            f"`draft` and `target` must share one vocabulary, got vocab_size {Vd} (draft) and {V} (target)"
        )
    K = validate_positive_int(k, "k")
    L = validate_size(L, "L", cap=MAX_NEW_TOKENS - 1, cap_name="MAX_NEW_TOKENS - 1",
                      hint="each run decodes L + 1 tokens")  # 10**18: the message named max_new_tokens
    _resolve(verifier, K, verifier_options, V, sampling)
    rng = _torch_generator(rng)
    cells, law = exact_prefix_law(target, prompt, m, temperature=temperature, top_k=top_k, top_p=top_p)
    need = min_runs(law)
    if n_runs < need:  # before any decoding: the exact law alone decides whether the test can run
        raise ValueError(
            f"`n_runs`={n_runs} is too few for a chi-square test of the first {m} token(s): their exact law has "
            f"{len(cells)} continuations, the most likely of probability {float(law.max()):.4g}, so at least "
            f"n_runs={need} are needed (an expected count >= 5 for it and for the rest together); raise `n_runs`, or lower "
            "`num_tokens` / pass `top_k` to concentrate the law"
        )
    index = {c: i for i, c in enumerate(cells)}
    counts = np.zeros(len(cells) + 1, dtype=np.int64)  # last cell: outside the support
    name = None
    for _ in tqdm(range(n_runs), disable=not progress, desc=f"lossless[{verifier}]", leave=False):
        res = speculative_decode(
            prompt, draft=draft, target=target, verifier=verifier, k=k, L=L,
            max_new_tokens=max(m, L + 1), temperature=temperature, top_k=top_k, top_p=top_p, rng=rng,
            verifier_options=verifier_options,
        )
        name = res.verifier_name
        counts[index.get(tuple(res.tokens[:m].tolist()), len(cells))] += 1
    full_law = np.append(law / law.sum(), 0.0)
    g = chi2_gof(counts, full_law, alpha_fail=alpha_fail)
    tv = 0.5 * float(np.abs(counts / n_runs - full_law).sum())
    freq = counts / n_runs
    return DecodingCheck(
        passed=g.passed, max_error=float(np.max(np.abs(freq - full_law))), law=freq, target_law=full_law,
        method="sampling", n_cases=n_runs,
        verifier_name=str(name), num_tokens=m, statistic=g.statistic, pvalue=g.pvalue,
        dof=g.dof, alpha_fail=alpha_fail, n_cells=g.n_cells, tv_empirical=tv, cells=tuple(cells),
    )
