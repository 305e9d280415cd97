r"""Summaries of a profile run: means per depth, tokens per target call, paired differences, speed-ups.

Every interval is a 95 % percentile bootstrap over prompts (the prompts are
the independent units; positions along one path are not), with the
estimates as ratios of sums over the resampled prompts. Paired differences
use the same resamples for both verifiers, so the variation the two share
(the contexts, the drawn drafts) cancels. On fewer than
:data:`MIN_PERCENTILE_PROMPTS` prompts the percentile interval covers far
less than 95 % (from 2 prompts it is the range of the two, which holds the
truth about half the time; Hesterberg, "What teachers should know about the
bootstrap", arXiv:1411.5279, on the percentile interval's narrowness at small
sizes; Efron and Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 12
(Student's interval) and ch. 13 (the percentile interval)): there each end is
widened to at least Student's interval on the bootstrap standard error,
:math:`\hat\theta \pm t_{0.975,\, n - 1} \sqrt{n / (n - 1)}\, \widehat{\mathrm{se}}^*`
(:func:`_interval`; on the logit scale for a quantity with a range of two ends, such as a probability, a share
of a bound or tokens per call, on the log scale for another positive estimate). Every interval is then clipped to
the range its quantity holds by proof (a share of a bound in [0, 1], a gap to it >= 0), which keeps its coverage
(Mandelkern, "Setting confidence intervals for bounded parameters", Statistical Science 17(2), 2002).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .._registry import get_verifier
from ..tree import Eagle2Params, TreeShape, sequoia
from ._collect import TIMING_KINDS, is_subsampled
from ._renewal import starts_recursion
from ._settings import costly
from ._store import iter_shards, read_manifest, shard_path
from ._tree_bound import BOUND_FIELDS, BOUND_KIND
from ._trees import (
    TREE_KINDS,
    TreePlan,
    along_text_route,
    draft_rows,
    eagle2_from_universe,
    resolve_trees,
    static_order,
)

__all__ = ["MIN_RANKED_POSITIONS", "MIN_PERCENTILE_PROMPTS",
           "Configuration", "calibration_predictions", "configurations", "cost_timings",
           "cost_inversions",
           "Costs", "Estimate", "PositionSet", "ProfileSummary", "Recommendation", "summarize",
           "prompt_sums", "TreeSummary", "TreeChoice", "StaticShape", "SequoiaShape", "MAX_STATIC_BUDGET",
           "TreeBoundSummary"]

#: Bootstrap resamples of every interval.
N_BOOT = 2000
#: Fewest prompts behind an estimate whose interval is the percentile bootstrap alone; on fewer (and at least 2),
#: each end is widened to at least Student's interval on the bootstrap standard error (:func:`_interval`).
MIN_PERCENTILE_PROMPTS = 30
#: Fewest positions on which :attr:`ProfileSummary.recommendation` ranks the costly schemes (computed on the
#: subsample only) beside the others; below it, the recommendation ranks the schemes computed at every position.
MIN_RANKED_POSITIONS = 30


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its 95 % bootstrap interval over prompts, and the number of profiled positions
    (and of prompts) behind it.

    An estimate from one prompt has no interval over prompts (every resample is that prompt or nothing):
    :attr:`has_interval` is False and it formats as ``value [n/a (1 prompt)]``.
    """

    value: float
    lo: float
    hi: float
    positions: int = 0
    prompts: int = 0

    @property
    def half_width(self) -> float:
        return 0.5 * (self.hi - self.lo)

    @property
    def has_interval(self) -> bool:
        """Whether the interval rests on more than one prompt (0 prompts: not recorded, taken as yes)."""
        return self.prompts != 1

    def __format__(self, spec: str) -> str:
        spec = spec or ".3f"
        if not self.has_interval:
            return f"{self.value:{spec}} [n/a (1 prompt)]"
        return f"{self.value:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"


@dataclass(frozen=True)
class Costs:
    r"""Seconds of one decoding iteration, from which the two speed-up predictions are made.

    .. math::

        t(k, L) = t_{\text{draft}}(1) + (L - 1)\, t_{\text{draft}}(k) + t_{\text{target}}(k, L),

    one draft step from the context, ``L - 1`` batched steps on ``k`` rows, and one target call scoring
    ``k`` rows of ``L + 1`` tokens: the forward passes of an iteration; plain decoding spends
    :math:`t_{\text{plain}}` per token in its forward pass. Two predictions follow (see :func:`summarize`):

    (a) *otspec's decoder on this device*: the forward passes plus the decoder's measured work outside
        them, :math:`t(k, L) + o(f, k, L)` per iteration against :math:`t_{\text{plain}} + o_{\text{plain}}`
        per token (:attr:`overhead`, measured on a few real iterations of every family by the run:
        :mod:`otspec.profile._overhead`);
    (b) *forward passes alone*: :math:`t(k, L)` against :math:`t_{\text{plain}}`, what an engine whose
        verification is fused into its forward pass could reach (an upper bound on (a)'s device).

    Attributes
    ----------
    source : {"measured", "timers", "given"}
        ``"measured"``: the run's cost calibration (every call shape timed on the run's device,
        :func:`otspec.profile._collect.cost_rows`: synchronised, warmed up, interleaved rounds, medians);
        ``"timers"``: a run without calibration, the mean seconds of its draft steps and target calls
        (every target call costing the same); ``"given"``: ``draft_cost=`` / ``score_cost=`` in units of
        one target call.
    plain : float
        One target call on one new token.
    target : dict
        ``(k, L) -> seconds`` of scoring ``k`` rows of ``L + 1`` tokens.
    draft : dict
        ``k -> seconds`` of one draft step on ``k`` rows.
    description : str
        Where the numbers come from, for the report.
    spread : dict
        ``(model, rows, new tokens) -> seconds``: half the range of the calibration's repetitions of each call.
    overhead : dict
        ``(family, k, L) -> seconds`` per iteration of the decoder's work beyond the calibrated forward passes
        (the measured seconds of a whole step less :meth:`iteration`, fitted between the timed
        configurations; see :mod:`otspec.profile._overhead`); a tree family's name ``-> seconds`` of its
        measured step; empty when the run did not measure them (then (a) is (b)).
    overhead_plain : float
        Plain decoding's work beyond its calibrated forward pass, per token.
    residual : dict
        ``family -> seconds`` of one residual target call (Sun et al.'s block verification), as timed in the
        decodes; a family not in it is charged :attr:`plain` per residual call.
    violations : tuple of str
        Calls measured cheaper than a call on fewer rows or tokens beyond the two repetitions' spreads; the
        predictions use the monotone envelope (every call at least as dear as any smaller one).
    samples : dict
        ``(model, rows, new tokens) -> tuple`` of the repetitions' seconds (the bootstrap resamples them).
    calls : dict
        ``(model, rows, new tokens) -> seconds`` of every calibrated call (``"target"``, ``"draft"``,
        ``"tree-target"``), the monotone envelope of the medians.
    overhead_fit : dict
        ``(family, k, L) -> seconds``: for every entry of :attr:`overhead` that was not timed but read off the
        family's least-squares line through its timed configurations, the line's residual standard error over
        them (NaN: two timed points, an error not measured); a timed entry is not in it.
    """

    source: str
    plain: float
    target: dict
    draft: dict
    description: str
    spread: dict = field(default_factory=dict)
    overhead: dict = field(default_factory=dict)
    overhead_plain: float = 0.0
    residual: dict = field(default_factory=dict)
    violations: tuple = ()
    samples: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)
    overhead_fit: dict = field(default_factory=dict)

    def iteration(self, k: int, L: int) -> float:
        """Seconds of one iteration's forward passes with ``k`` draft blocks of ``L`` tokens."""
        return self.draft[1] + (L - 1) * self.draft[k] + self.target[(k, L)]

    @property
    def decoder_measured(self) -> bool:
        """Whether prediction (a) adds the decoder's measured work outside the forward passes."""
        return bool(self.overhead)

    def residual_call(self, family: str) -> float:
        """Seconds of one residual target call of ``family``."""
        return self.residual.get(family, self.plain)

    def decoder_iteration(self, family: str, k: int, L: int) -> float:
        """Seconds of one iteration of otspec's decoder: forward passes plus its work beyond them (NaN when the run
        timed the decoder but could not time this family: the decoder refused it)."""
        default = float("nan") if self.overhead else 0.0
        return self.iteration(k, L) + self.overhead.get((family, k, L), default)

    @property
    def decoder_plain(self) -> float:
        """Seconds per token of otspec's plain decoding: its forward pass plus its work outside it."""
        return self.plain + self.overhead_plain


@dataclass(frozen=True)
class Recommendation:
    """The fastest lossless configuration on one set of positions, the runner-up, and their paired difference.

    Attributes
    ----------
    best, runner_up : tuple
        ``(family, k, L)``; ``runner_up`` is None with a single candidate.
    speedup, runner_up_speedup : Estimate
        Predicted speed-up over plain decoding (1: as fast; below 1: slower).
    tokens_per_call : Estimate
        The best configuration's tokens per target call.
    difference : Estimate or None
        ``speedup(best) - speedup(runner_up)`` on the same resamples (paired).
    ranking : tuple
        Every candidate ``((family, k, L), speedup)``, fastest first (equal speed-ups by ``(family, k, L)``).
    positions : int
    """

    best: tuple
    speedup: Estimate
    tokens_per_call: Estimate
    runner_up: tuple | None
    runner_up_speedup: Estimate | None
    difference: Estimate | None
    ranking: tuple
    positions: int


@dataclass(frozen=True)
class PositionSet:
    """Every estimate computed on one set of profiled positions -- the rows of one table of the report.

    Attributes
    ----------
    name : {"all", "subsample"}
        ``"all"``: every profiled position (the quantities computed everywhere); ``"subsample"``: every
        ``subsample``-th profiled position, where every quantity of the run was computed.
    positions : int
    acceptance, gaps, tokens_per_call, speedup : dict
        As in :class:`ProfileSummary`, on these positions only.
    recommendation : Recommendation or None
        Among the lossless schemes of this set.
    """

    name: str
    positions: int
    acceptance: dict
    gaps: dict
    tokens_per_call: dict
    speedup: dict
    recommendation: Recommendation | None
    speedup_forward: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileSummary:
    r"""What a profile says about a draft/target pair.

    Every estimate carries the number of profiled positions it is computed on
    (:attr:`Estimate.positions`): the quantities that are cheap at a real
    vocabulary on every profiled position, the costly ones on every
    ``subsample``-th. Set side by side only estimates of one position set:
    :attr:`sets` holds each set's own tables.

    Attributes
    ----------
    acceptance : dict
        ``(verifier, k, depth) -> Estimate``: mean exact acceptance per depth, on the positions where it was computed.
    gaps : dict
        ``("tv" | "kl", verifier, k, depth) -> Estimate`` for the lossy rules.
    tokens_per_call : dict
        ``(family, k, L) -> Estimate``: expected tokens per target call, the
        ratio of sums over profiled positions of the exact expected tokens
        emitted and target calls given the drawn drafts.
    differences : dict
        ``((family, k, L), (reference, k', L')) -> Estimate``: paired
        differences of tokens per call, on the positions where both were computed.
    speedup : dict
        ``(family, k, L) -> Estimate``: predicted wall-clock speed-up over plain decoding of otspec's own
        decoder on the run's device (prediction (a) of :class:`Costs`: the forward passes plus the decoder's
        measured work outside them); the recommendation ranks by it. Its interval carries the spread of the
        timings (their repetitions resampled with the prompts) as well as the spread over prompts.
    speedup_forward : dict
        ``(family, k, L) -> Estimate``: prediction (b), the forward passes alone (what an engine whose
        verification is fused into its forward pass could reach; the same as :attr:`speedup` when the run did
        not measure the decoder's own work).
    costs : Costs
        The seconds of each model call the speed-up model uses, and their source.
    sets : dict
        ``"all"`` and ``"subsample"`` -> :class:`PositionSet`.
    recommendation : Recommendation or None
        The fastest lossless configuration among every profiled scheme, on the positions where all were
        computed when they are at least :data:`MIN_RANKED_POSITIONS`; else among the schemes computed at every
        profiled position (``sets[...].recommendation`` for each set).
    draft_cost, score_cost : float
        The draft step and the scoring call relative to one target call of plain decoding (from :attr:`costs`).
    renewal : dict
        ``(family, k, L) -> Estimate``: the renewal tokens-per-call estimator
        from the emission tables along the text (empty when not recorded):
        ``T / E[calls]``, the tokens kept per call of decodes of the texts' ``T`` tokens.
    renewal_differences : dict
        Paired differences of the renewal estimates with the reference scheme (same resamples).
    palm : dict
        ``(family, k, L) -> Estimate``: the Palm average, the profiled
        positions' expected tokens per call weighted by their start
        probabilities :math:`r(t)` (:func:`otspec.profile.palm_tokens_per_call`;
        consistent for the tokens emitted per call of decodes of ``T`` tokens
        by a decoder that drafts whole chains or trees to the end, the last
        iteration's overshoot included; otspec's decoder drafts only the tokens
        left and makes the renewal estimate's tokens kept per call; the two
        share the long-run limit).
    position_bias : dict
        ``(family, k, L) -> Estimate``: ``tokens_per_call / palm - 1``, the
        relative bias of the per-position average (the inspection paradox of
        docs/theory/profile.rst), on the same resamples.
    positions : int
        Profiled positions (the ``"all"`` set).
    prompts : int
    settings, models : dict
    skipped : dict
        ``{"families": {name: reason}, "verifiers": {name: reason}}``: what the run left out, and why.
    trees : TreeSummary or None
        The draft-tree families (a run with ``trees``): tokens per call, speed-ups, and the choice of a tree.
    timings : dict
        Every timing of the run's cost calibration (:func:`cost_timings`; empty without one): the spread
        behind each median of :attr:`costs`.
    cost_overrides : dict
        ``{"draft_cost": ..., "score_cost": ...}`` as given to :func:`summarize` (None: not given).
    provenance : dict
        The manifest's ``packages`` (otspec's version among them) and ``machine`` (the models' devices,
        torch's threads, the load average when the run started); ``shards``, the run's number of shards, and
        ``missing_shards``, the file names of those not written yet (an unfinished run is summarised on the
        shards it holds).
    configurations : tuple of Configuration
        Every lossless configuration a decoder can run -- the ``(k, L)`` schemes of the recommendation's
        position set and the draft-tree families and chosen shapes -- fastest first
        (:func:`configurations`).
    """

    acceptance: dict
    gaps: dict
    tokens_per_call: dict
    differences: dict
    speedup: dict
    draft_cost: float
    score_cost: float
    positions: int
    prompts: int
    settings: dict
    models: dict
    renewal: dict = field(default_factory=dict)
    renewal_differences: dict = field(default_factory=dict)
    palm: dict = field(default_factory=dict)
    position_bias: dict = field(default_factory=dict)
    costs: Costs | None = None
    sets: dict = field(default_factory=dict)
    recommendation: Recommendation | None = None
    skipped: dict = field(default_factory=dict)
    trees: TreeSummary | None = None
    timings: dict = field(default_factory=dict)
    cost_overrides: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    configurations: tuple = ()
    speedup_forward: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"ProfileSummary(prompts={self.prompts}, positions={self.positions}, "
                f"verifiers={len({v for v, *_ in self.acceptance})}, families={len({f for f, *_ in self.tokens_per_call})})")


def _boot(S: np.ndarray, C: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Point estimates ``sum S / sum C`` per column and their resampled values ``(B, K)``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        point = S.sum(axis=0) / C.sum(axis=0)
        res = (W @ S) / (W @ C)
    return point, res


def _interval(point: float, res: np.ndarray, positions: int = 0, prompts: int = 0, student=None, *,
              difference: bool = False, lower: float = -np.inf, upper: float = np.inf) -> Estimate:
    r"""The 95 % interval of ``point`` from its bootstrap resamples ``res`` over ``prompts`` prompts, inside the
    quantity's range ``[lower, upper]``.

    .. math::

        [\min(q^*_{0.025},\ \hat\theta - h),\ \max(q^*_{0.975},\ \hat\theta + h)] \cap [a, b],\qquad
        h = t_{0.975,\, n - 1} \sqrt{\tfrac{n}{n - 1}}\ \operatorname{sd}(\theta^*)

    for :math:`2 \le n <` :data:`MIN_PERCENTILE_PROMPTS` prompts (the percentile interval alone from more, or when
    the prompts are not recorded: ``prompts = 0``). The bootstrap variance of a mean over :math:`n` resampled units
    is :math:`(n - 1)/n` times the unbiased one, so :math:`h` is Student's half-width, exact for a mean of normal
    per-prompt values; the percentile interval cannot reach beyond the values of the :math:`n` prompts (from 2 it
    holds the truth about half the time). The scale of Student's interval:

    * a quantity with a range of two finite ends ``a < b`` (a probability or a share of a bound in ``[0, 1]``,
      tokens per call in ``[1, L + 1]``) whose estimate lies strictly inside it: the logit scale of
      :math:`u = (\theta - a) / (b - a)`, its ends :math:`a + (b - a)\,\operatorname{expit}(\operatorname{logit}
      \hat u \pm h)` with :math:`h = t\, \sqrt{n / (n - 1)}\, \operatorname{sd}(\theta^*) / ((b - a)\,
      \hat u (1 - \hat u))`, the bootstrap standard error carried to the logit scale by the delta method (the
      logit interval of a binomial proportion: Brown, Cai and DasGupta, "Interval estimation for a binomial
      proportion", *Statistical Science* 16(2), 2001), so that the ends stay inside the range. Not the spread
      of the resamples' logits, which one prompt near an end of the range inflates without limit (shares of
      0.99999, 0.9 and 0.93 gave [0.002, 0.99999]; exactly 1 instead of 0.99999, [0.82, 1]);
    * else a positive estimate whose resamples are all positive (speed-ups, a bound): the log scale,
      :math:`\hat\theta\, e^{\pm h}` with :math:`h` from :math:`\operatorname{sd}(\log \theta^*)`;
    * a difference (``difference=True``: paired differences, gaps to a bound, relative biases, TV and KL of a
      lossy rule) on its own scale whatever its resamples, so that two differences of one kind are never put on
      two scales; and any other estimate.

    Every end is then clipped to ``[lower, upper]``, the range the quantity (the parameter, not the estimate on
    one sample) holds by proof at each call site. Where the truth lies in the range, an end clipped to it holds
    the truth whenever the unclipped end did (and an interval wholly outside the range, which missed it,
    becomes the nearest end of the range), so the coverage is kept: Mandelkern, "Setting confidence intervals for
    bounded parameters", *Statistical Science* 17(2), 2002 (the interval intersected with the parameter
    space). The point estimate is never moved: one whose per-position values are not themselves in the range (a
    share of the bound of one drawn tree per position may exceed 1) may lie outside its clipped interval. Only
    the ends outside the range move, so from :data:`MIN_PERCENTILE_PROMPTS` prompts an interval of a ratio of
    means of values in the range (whose resamples are in it) is the percentile interval, unchanged. Resamples
    that are not finite (no position drawn) are left out.

    ``student``: the resamples whose spread Student's interval takes (default ``res``). A speed-up's ``res`` carry
    the timings' bootstrap replicates as well as the prompts' resamples; its ``student`` are the prompts' alone
    (its tokens per call resampled, times the point costs), so that the prompts' part is widened and the timings'
    part, from a few repetitions of each call whose replicates may be long-tailed, stays the percentile's.
    """
    a, b = float(lower), float(upper)
    if np.isnan(a) or np.isnan(b) or a > b:
        raise ValueError(f"`lower` must be <= `upper` (neither NaN), got lower={lower!r}, upper={upper!r}")
    lo, hi = np.nanpercentile(res, [2.5, 97.5]) if np.isfinite(res).any() else (np.nan, np.nan)
    if 2 <= prompts < MIN_PERCENTILE_PROMPTS and np.isfinite(point):
        fin = np.asarray(res if student is None else student, dtype=np.float64)
        fin = fin[np.isfinite(fin)]
        if fin.size > 1 and not np.ptp(fin) > 0:  # no spread: Student's interval is the point itself, exactly (the
            lo, hi = min(lo, point), max(hi, point)  # round trip through the logit gave 1.0000000000000237e-300)
        elif fin.size > 1:
            from scipy.special import expit, logit, stdtrit

            q = float(stdtrit(prompts - 1, 0.975)) * np.sqrt(prompts / (prompts - 1))
            if not difference and np.isfinite(a) and np.isfinite(b) and a < point < b:  # on the logit scale
                u = (point - a) / (b - a)
                z, h = float(logit(u)), q * float(np.std(fin, ddof=1)) / ((b - a) * u * (1.0 - u))
                lo, hi = min(lo, a + (b - a) * float(expit(z - h))), max(hi, a + (b - a) * float(expit(z + h)))
            elif not difference and point > 0 and (fin > 0).all():  # a positive quantity: on the log scale
                h = q * float(np.std(np.log(fin), ddof=1))
                lo, hi = min(lo, point * np.exp(-h)), max(hi, point * np.exp(h))
            else:
                h = q * float(np.std(fin, ddof=1))
                lo, hi = min(lo, point - h), max(hi, point + h)
    # inside the range (NaN ends stay NaN); an end already inside is returned bit for bit
    lo, hi = (float(x) if np.isnan(x) else float(min(max(x, a), b)) for x in (lo, hi))
    return Estimate(float(point), lo, hi, int(positions), int(prompts))


def _prompts(counts: np.ndarray) -> int:
    """How many prompts (rows of ``counts``, per-prompt positions) hold at least one position."""
    return int((np.asarray(counts) > 0).sum())


def prompt_sums(table, kinds, prompts=None):
    """Per-prompt sums and counts of each ``(kind, name, k, j)`` key: ``(keys, prompts, S (N, K), C (N, K))``.

    ``prompts`` (sorted indices) fixes the rows, e.g. to those of the whole run for a subset of positions.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    t = table.filter(pc.is_in(table["kind"], value_set=pa.array(list(kinds))))
    prompt = t["prompt"].to_numpy()
    kind = np.asarray(t["kind"].to_pylist(), dtype=object)
    name = np.asarray(t["name"].to_pylist(), dtype=object)
    k = t["k"].to_numpy()
    j = t["j"].to_numpy()
    v = t["value"].to_numpy()
    if prompts is None:
        prompts, pi = np.unique(prompt, return_inverse=True)
    else:
        pi = np.searchsorted(prompts, prompt)
    keys = sorted({(a, b, int(c), int(d)) for a, b, c, d in zip(kind, name, k, j)})
    index = {key: i for i, key in enumerate(keys)}
    ki = np.fromiter((index[(a, b, int(c), int(d))] for a, b, c, d in zip(kind, name, k, j)), dtype=np.int64,
                     count=len(v))
    S = np.zeros((len(prompts), len(keys)))
    C = np.zeros((len(prompts), len(keys)))
    np.add.at(S, (pi, ki), v)
    np.add.at(C, (pi, ki), 1.0)
    return keys, prompts, S, C


def _emitted_and_calls(keys, S, C):
    """Per prompt, expected tokens emitted, target calls and positions of every (scheme, k, L):
    ``(keys, E (N, K), C (N, K), n (N, K))``.

    ``E[emitted] = E[tau_L | X] + 1`` per position (``L + 1`` for Sun et al.'s block verification,
    whose expected calls are recorded), one call per position otherwise.
    """
    col = {key: i for i, key in enumerate(keys)}
    out_keys, Es, Cs, ns = [], [], [], []
    for key, i in col.items():
        kind, name, k, L = key
        if kind != "tau":
            continue
        n = C[:, i]
        if name == "block":
            Es.append((L + 1) * n)
            Cs.append(S[:, col[("calls", name, k, L)]])
        else:
            Es.append(S[:, i] + n)
            Cs.append(n)
        ns.append(n)
        out_keys.append((name, k, L))
    if not out_keys:
        z = np.zeros((S.shape[0], 0))
        return [], z, z, z
    return out_keys, np.stack(Es, axis=1), np.stack(Cs, axis=1), np.stack(ns, axis=1)


def _timing(out) -> tuple[float, float]:
    """Seconds per draft step and per target call, over the whole run (NaN: none timed)."""
    import pyarrow.compute as pc

    sums = {"draft": np.zeros(2), "target": np.zeros(2)}
    for t in iter_shards(out):
        t = t.filter(pc.equal(t["kind"], "time"))
        for name, j, v in zip(t["name"].to_pylist(), t["j"].to_pylist(), t["value"].to_pylist()):
            sums[name][j - 1] += v
    d = sums["draft"][0] / sums["draft"][1] if sums["draft"][1] > 0 else float("nan")
    q = sums["target"][0] / sums["target"][1] if sums["target"][1] > 0 else float("nan")
    return d, q


def _no_timers(out, need: str) -> ValueError:
    """The error of a summary whose costs would come from a run's timers, which it does not hold."""
    return ValueError(f"`out` {str(out)!r} holds no timed target call and draft step (its shards have no cost "
                      f"calibration and no timers): {need}")


def cost_timings(out) -> dict:
    """Every timing of every calibrated call of a run: ``(model, rows, new tokens per row) -> tuple of seconds``
    (``model``: ``"target"``, ``"draft"`` or ``"tree-target"``, the target scoring a tree of ``m - 1`` nodes)."""
    import pyarrow.compute as pc

    got: dict = {}
    for t in iter_shards(out):
        t = t.filter(pc.equal(t["kind"], "cost"))
        for name, k, m, v in zip(t["name"].to_pylist(), t["k"].to_pylist(), t["m"].to_pylist(),
                                 t["value"].to_pylist()):
            got.setdefault((name, int(k), int(m)), []).append(float(v))
    return {key: tuple(v) for key, v in sorted(got.items())}


#: The model calls of the calibration, whose costs must grow with their rows and tokens.
_CALLS = ("target", "draft", "tree-target")


def _inversions(med: dict, spread: dict) -> list:
    """``(larger call, smaller call)`` pairs of one model, the larger measured cheaper beyond the two spreads
    (the target's plain call is compared with the tree calls too)."""
    groups: dict = {}
    for key in med:
        if key[0] in _CALLS:
            groups.setdefault(key[0], []).append(key)
    if ("target", 1, 1) in med and "tree-target" in groups:
        groups["tree-target"].append(("target", 1, 1))
    out = []
    for keys in groups.values():
        for a in keys:
            for b in keys:
                if a != b and a[1] <= b[1] and a[2] <= b[2] and (a[1], a[2]) != (b[1], b[2]) and \
                        med[b] < med[a] - spread[a] - spread[b]:
                    out.append((b, a))
    return sorted(out)


def cost_inversions(timings: dict) -> list:
    r"""The pairs of calibrated calls whose order their timings contradict beyond their spread.

    .. math::

        a \preceq b \ (\text{rows and tokens per row both at most } b\text{'s}),\qquad
        \operatorname{med} t(b) < \operatorname{med} t(a) - s(a) - s(b),

    with :math:`s` half the range of a call's timings: a call on at least as many rows and tokens as another,
    measured cheaper beyond both spreads. The cost table is then not monotone, which no model computes (timing
    noise: a shared or busy device); the predictions use the monotone envelope instead. The target's plain
    call (one row of one token) is compared with the tree calls too.

    Parameters
    ----------
    timings : dict
        :func:`cost_timings`.

    Returns
    -------
    list of tuple
        ``(larger call, smaller call)`` keys, the larger one cheaper.
    """
    med = {key: float(np.median(v)) for key, v in timings.items()}
    return _inversions(med, {key: 0.5 * (max(v) - min(v)) for key, v in timings.items()})


def _cost_violations(med: dict, spread: dict) -> tuple:
    """:func:`cost_inversions` of medians and spreads, as sentences."""
    return tuple(f"{b[0]}: {b[1]} rows x {b[2]} tokens {1e3 * med[b]:.3f} ms, cheaper than {a[1]} x {a[2]} "
                 f"({1e3 * med[a]:.3f} ms) beyond their spreads" for b, a in _inversions(med, spread))


def _envelope(med: dict) -> dict:
    """Every model call at least as dear as any call on no more rows and no more tokens (the monotone envelope);
    values are floats or arrays of bootstrap replicates."""
    env = dict(med)
    for (model, k, m) in med:
        if model in _CALLS:
            env[(model, k, m)] = np.maximum.reduce([v for (n, a, b), v in med.items()
                                                    if n == model and a <= k and b <= m])
    return env


def _overhead(med: dict, settings: dict, env: dict) -> tuple[dict, float, dict, dict]:
    r"""The decoder's work beyond the calibrated forward passes: ``(per (family, k, L) or tree name, plain,
    residual, fit)``.

    At a timed configuration :math:`o = s - t(k, L)`, the measured seconds of a whole step less the calibrated
    forward passes (:mod:`otspec.profile._overhead`: every ``L`` at ``k = 1`` and ``(K, L_max)``), used as
    measured. At the others, a family's least-squares line :math:`o = a + b\, x`, :math:`x = k (2 L + 1)` (the laws
    an iteration handles), through its timed configurations; ``fit`` maps each such ``(family, k, L)`` to the
    line's residual standard error :math:`\sqrt{\sum_i (o_i - a - b x_i)^2 / (n - 2)}` over the family's
    :math:`n` timed points (NaN with two points or fewer: an interpolation whose error is not measured). One timed
    configuration: that value everywhere; a family the decoder refused at its larger ``k`` (no timed step there)
    gets none for ``k > 1``. A tree family's entry is its step's seconds :math:`s` (the tree's forward passes are
    subtracted where its shape is known, :class:`_TreeCosts`). The values may be arrays of bootstrap replicates
    (the fit is taken replicate by replicate, and an interpolated entry's replicates carry, beside the timed
    points' spread, a normal draw of the residual standard error: the scatter of a new point about the line, so
    that the interval of a prediction read off the line holds the fit's error).
    """
    k_max, L_max = settings["k_max"], settings["L_max"]
    fams = set(settings["families"])

    def fwd(k, L):
        return env[("draft", 1, 1)] + (L - 1) * env[("draft", k, 1)] + env[("target", k, L + 1)]

    over, residual, fit = {}, {}, {}
    for f in settings["families"]:
        o = {(k, m): v - fwd(k, m) for (n, k, m), v in med.items() if n == f"step:{f}"}
        if not o:
            continue
        spec = get_verifier(f)
        multi = not (spec.single_draft or spec.kind == "block")
        # k > 1 predicted when a k > 1 step was timed, or one was left untimed by the racing calibration (its budget,
        # or a prediction (b) too low to contend: the line extends to it); the decoder refused k > 1: no prediction
        left = any(n == f"untimed:{f}" and k > 1 for (n, k, _) in med)
        ks = range(1, k_max + 1) if multi and (max(k for k, _ in o) > 1 or left) else range(1, 2)
        pts = sorted(o, key=lambda km: km[0] * (2 * km[1] + 1))
        x = np.array([k * (2 * m + 1) for k, m in pts], dtype=float)
        y = np.stack([np.asarray(o[p], dtype=float) for p in pts])  # (points, ...) : replicates behind
        dx = (x - x.mean()).reshape((-1,) + (1,) * (y.ndim - 1))
        sxx = float((dx**2).sum())
        b = (dx * (y - y.mean(axis=0))).sum(axis=0) / sxx if sxx > 0 else np.zeros_like(y[0])
        a = y.mean(axis=0) - b * x.mean()
        n_pts = len(pts)
        err = np.sqrt(((y - a - b * x.reshape(dx.shape)) ** 2).sum(axis=0) / (n_pts - 2)) if n_pts > 2 else (
            np.full_like(y[0], np.nan))
        for k in ks:
            for L in range(1, L_max + 1):
                if (k, L) in o:
                    over[(f, k, L)] = o[(k, L)]
                else:
                    val, e = a + b * (k * (2 * L + 1)), err
                    if np.ndim(val) and np.isfinite(e).all():  # replicates: a new point's scatter about the line
                        val = val + e * np.random.default_rng([k, L, 13]).standard_normal(np.shape(val))
                    over[(f, k, L)] = float(val) if np.ndim(val) == 0 else val
                    fit[(f, k, L)] = float(e) if np.ndim(e) == 0 else e
        res = [v for (n, _, _), v in med.items() if n == f"residual:{f}"]
        if res:
            residual[f] = np.mean(res, axis=0)
    for (n, _, _), v in med.items():
        name = n.partition(":")[2]
        if n.startswith("step:") and name not in fams and name != "plain":
            over[name] = v
    plain = med[("step:plain", 1, 1)] - env[("target", 1, 1)] if ("step:plain", 1, 1) in med else 0.0
    return over, plain, residual, fit


def _measured(med: dict, settings: dict, spread: dict, samples: dict, violations: tuple | None = None) -> Costs:
    """The :class:`Costs` of a calibration's medians (floats, or arrays of bootstrap replicates)."""
    ks = range(1, settings["k_max"] + 1)
    Ls = range(1, settings["L_max"] + 1)
    env = _envelope(med)
    over, plain_over, residual, fit = _overhead(med, settings, env)
    return Costs("measured", env[("target", 1, 1)], {(k, L): env[("target", k, L + 1)] for k in ks for L in Ls},
                 {k: env[("draft", k, 1)] for k in ks},
                 "measured by the run on its own device: every forward pass shape timed with the device "
                 "synchronised before and after, after a warm-up round, in interleaved rounds; the median of "
                 f"{max((len(v) for v in samples.values()), default=0)} repetitions (the target scoring k rows of "
                 "L + 1 tokens, or one token; the draft stepping k rows)", spread=spread, overhead=over,
                 overhead_plain=plain_over, residual=residual, overhead_fit=fit,
                 violations=_cost_violations(med, spread) if violations is None else violations,
                 samples=samples, calls={key: v for key, v in env.items() if key[0] in _CALLS})


def _costs(out, settings: dict, draft_cost, score_cost) -> Costs:
    """The :class:`Costs` of a run: given, measured by its calibration, or its timers."""
    ks = range(1, settings["k_max"] + 1)
    Ls = range(1, settings["L_max"] + 1)
    if draft_cost is not None or score_cost is not None:
        if draft_cost is None:
            d, q = _timing(out)
            if not (np.isfinite(d) and np.isfinite(q) and q > 0):
                raise _no_timers(out, "`score_cost` alone takes the draft step's cost from them; give `draft_cost` too")
            draft_cost = d / q
        s = 1.0 if score_cost is None else float(score_cost)
        return Costs("given", 1.0, {(k, L): s for k in ks for L in Ls}, {k: float(draft_cost) for k in ks},
                     f"given in target calls: a draft step c = {draft_cost:.3f}, scoring k blocks of L + 1 tokens "
                     f"s = {s:.3f}, whatever k and L")
    samples = cost_timings(out)
    med = {key: float(np.median(v)) for key, v in samples.items()}
    need = [("target", 1, 1)] + [("target", k, L + 1) for k in ks for L in Ls] + [("draft", k, 1) for k in ks]
    if all(key in med for key in need):
        spread = {key: 0.5 * (max(v) - min(v)) for key, v in samples.items()}
        return _measured(med, settings, spread, {key: tuple(v) for key, v in samples.items()})
    d, q = _timing(out)
    if not (np.isfinite(d) and np.isfinite(q) and q > 0):
        raise _no_timers(out, "give `draft_cost` and `score_cost` (units of one target call)")
    return Costs("timers", q, {(k, L): q for k in ks for L in Ls}, {k: d for k in ks},
                 "from the run's timers (it has no cost calibration): the mean seconds of its draft steps and of "
                 "its target calls, every target call costing the same whatever its size")


def _replicates(costs: Costs, settings: dict, n_boot: int, seed: int) -> Costs:
    """``costs`` with every measured value replaced by ``n_boot`` bootstrap replicates: the median of a resample
    (with replacement) of its timing repetitions; unmeasured costs stay as they are."""
    if costs.source != "measured" or n_boot < 1:
        return costs
    rng = np.random.default_rng([seed, 7])
    pool = _pooled_deviations(costs.samples)
    med = {}
    for key, v in costs.samples.items():
        x = np.asarray(v, dtype=np.float64)
        med[key] = np.median(x[rng.integers(0, len(x), size=(n_boot, len(x)))], axis=1)
        g = _timing_group(key[0])
        r = pool.get(g, pool.get("calls")) if g is not None else None  # no repeated step: the calls' scatter
        if len(x) == 1 and r is not None:  # timed once: a single timing's scatter, not none
            med[key] = x[0] * (1.0 + r[rng.integers(0, len(r), size=n_boot)])
    return _measured(med, settings, costs.spread, costs.samples, costs.violations)


def _timing_group(name: str) -> str | None:
    """Which timings share a scatter: the model calls (``"calls"``), the decoder's steps (``"steps"``); None for the
    calibration's own records."""
    if name in _CALLS:
        return "calls"
    return "steps" if name.partition(":")[0] in ("step", "forward", "residual") else None


def _pooled_deviations(samples: dict) -> dict:
    r"""``group -> array`` of the relative deviations :math:`t_i / \operatorname{med}(t) - 1` of every timing of
    every repeated key of the group (:func:`_timing_group`): how far one timing falls from its key's median. A key
    the racing calibration timed once draws its bootstrap replicates as :math:`t (1 + r^*)`, :math:`r^*` from its
    group's pool (a step with no repeated step: the calls' pool), so that its interval holds a single timing's
    scatter (wider than a median's)."""
    out: dict = {}
    for key, v in samples.items():
        g = _timing_group(key[0])
        x = np.asarray(v, dtype=np.float64)
        if g is not None and len(x) > 1 and np.median(x) > 0:
            out.setdefault(g, []).extend((x / np.median(x) - 1.0).tolist())
    return {g: np.asarray(r) for g, r in out.items()}


def _speedups(keys, tp, tres, extra, costs: Costs, reps: Costs):
    """Point and resampled speed-ups over plain decoding of every (scheme, k, L): prediction (a), otspec's
    decoder, and (b), the forward passes alone; the resampled ones with the costs of ``reps`` (bootstrap
    replicates of the timing repetitions, paired with the prompts' resamples)."""
    pa, ra, pb, rb = {}, {}, {}, {}
    for i, (f, k, L) in enumerate(keys):
        e = extra[i]
        for c, pt in ((costs, True), (reps, False)):
            fb = (1.0 + e) * c.plain / (c.iteration(k, L) + e * c.residual_call(f))
            fa = (1.0 + e) * c.decoder_plain / (c.decoder_iteration(f, k, L) + e * c.residual_call(f))
            if pt:
                pa[(f, k, L)], pb[(f, k, L)] = tp[i] * fa, tp[i] * fb
            else:
                ra[(f, k, L)], rb[(f, k, L)] = tres[:, i] * fa, tres[:, i] * fb
    return pa, ra, pb, rb


def calibration_predictions(cols: dict, settings, tokens: dict) -> tuple[dict, dict]:
    """Predictions (a) and (b) of every ``(family, k, L)`` of ``tokens`` (:func:`otspec.profile._overhead.walk_tokens`)
    from a cost calibration's rows so far (``cols``: every call shape timed), by this module's own speed-up model
    (:func:`_measured`, :func:`_speedups`): what the racing calibration ranks its configurations by; ``({}, {})``
    before the shapes are timed."""
    samples: dict = {}
    for kind, name, k, m, v in zip(cols["kind"], cols["name"], cols["k"], cols["m"], cols["value"]):
        if kind == "cost":
            samples.setdefault((name, int(k), int(m)), []).append(float(v))
    med = {key: float(np.median(v)) for key, v in samples.items()}
    ks, Ls = range(1, settings.k_max + 1), range(1, settings.L_max + 1)
    need = [("target", 1, 1)] + [("target", k, L + 1) for k in ks for L in Ls] + [("draft", k, 1) for k in ks]
    keys = [key for key in tokens if np.isfinite(tokens[key][0])]
    if not keys or not all(key in med for key in need):
        return {}, {}
    spread = {key: 0.5 * (max(v) - min(v)) for key, v in samples.items()}
    sd = {"k_max": settings.k_max, "L_max": settings.L_max, "families": list(settings.families)}
    costs = _measured(med, sd, spread, {key: tuple(v) for key, v in samples.items()}, violations=())
    tp = np.array([tokens[key][0] for key in keys])
    extra = np.array([tokens[key][1] for key in keys])
    pa, _, pb, _ = _speedups(keys, tp, tp[None, :], extra, costs, costs)
    return pa, pb


def _recommend(point, res, tokens, positions, student=None) -> Recommendation | None:
    """The fastest lossless configuration, the runner-up and their paired difference (``student``: the prompts'
    part of each speed-up's resamples, :func:`_interval`)."""
    cands = [key for key in point if get_verifier(key[0]).lossless and np.isfinite(point[key])]
    if not cands:
        return None
    order = sorted(cands, key=lambda key: (-point[key], key))
    st = student if student is not None else res
    ranking = tuple((key, _interval(point[key], res[key], positions, tokens[key].prompts, st[key], lower=0.0))
                    for key in order)
    best = order[0]
    ru = order[1] if len(order) > 1 else None
    diff = (_interval(point[best] - point[ru], res[best] - res[ru], positions,
                      min(tokens[best].prompts, tokens[ru].prompts), st[best] - st[ru], difference=True) if ru else None)
    return Recommendation(best=best, speedup=ranking[0][1], tokens_per_call=tokens[best], runner_up=ru,
                          runner_up_speedup=ranking[1][1] if ru else None, difference=diff, ranking=ranking,
                          positions=positions)


def _position_set(name, keys, S, C, W, costs: Costs, keep, reps: Costs | None = None) -> PositionSet:
    """The estimates of one position set, for the ``(kind, name)`` pairs ``keep`` accepts."""
    col = {key: i for i, key in enumerate(keys)}
    point, res = _boot(S, C, W)
    acceptance, gaps = {}, {}
    for key, i in col.items():
        kind, nm, k, j = key
        if not keep(kind if kind in ("acc", "tv", "kl") else "tau", nm):
            continue
        n = int(C[:, i].sum())
        # each position's acceptance at a depth is a probability, its TV in [0, 1] and its KL >= 0: a ratio of
        # sums of such values over positions (and its parameter) lies in the same range
        if kind == "acc":
            acceptance[(nm, k, j)] = _interval(point[i], res[:, i], n, _prompts(C[:, i]), lower=0.0, upper=1.0)
        elif kind in ("tv", "kl"):
            gaps[(kind, nm, k, j)] = _interval(point[i], res[:, i], n, _prompts(C[:, i]), difference=True,
                                               lower=0.0, upper=1.0 if kind == "tv" else np.inf)
    tkeys, E, Cm, npos = _emitted_and_calls(keys, S, C)
    sel = [i for i, key in enumerate(tkeys) if keep("tau", key[0])]
    tkeys = [tkeys[i] for i in sel]
    E, Cm, npos = E[:, sel], Cm[:, sel], npos[:, sel]
    tokens, speed, forward, sst = {}, {}, {}, {}
    rec = None
    if tkeys:
        tp, tres = _boot(E, Cm, W)
        extra = Cm.sum(axis=0) / np.maximum(npos.sum(axis=0), 1.0) - 1.0
        sp, sres, fp, fres = _speedups(tkeys, tp, tres, extra, costs, costs if reps is None else reps)
        for i, key in enumerate(tkeys):
            n = int(npos[:, i].sum())
            # per position, 1 <= emitted / calls <= L + 1 (E[tau_L | X] <= L; block: L + 1 tokens in 1 to L + 1
            # calls, each emitting one at least): so is the ratio of sums
            tokens[key] = _interval(tp[i], tres[:, i], n, _prompts(npos[:, i]), lower=1.0, upper=key[2] + 1.0)
            # the prompts' part of the resamples: tokens per call resampled, at the point costs
            sst[key] = tres[:, i] * (sp[key] / tp[i])
            # a speed-up: tokens per call times a ratio of positive seconds, > 0 (no upper end by proof)
            speed[key] = _interval(sp[key], sres[key], n, _prompts(npos[:, i]), sst[key], lower=0.0)
            forward[key] = _interval(fp[key], fres[key], n, _prompts(npos[:, i]), tres[:, i] * (fp[key] / tp[i]),
                                     lower=0.0)
        rec = _recommend(sp, sres, tokens, max(e.positions for e in tokens.values()), sst)
    counts = [e.positions for e in (*acceptance.values(), *tokens.values())]
    return PositionSet(name=name, positions=max(counts, default=0), acceptance=acceptance, gaps=gaps,
                       tokens_per_call=tokens, speedup=speed, recommendation=rec, speedup_forward=forward)


def summarize(out, *, draft_cost: float | None = None, score_cost: float | None = None, reference: str | None = None,
              reference_multi: str | None = "optimal", n_boot: int = N_BOOT, seed: int = 0) -> ProfileSummary:
    r"""Summarise a profile run: acceptance per depth, tokens per target call, paired differences, speed-ups.

    .. math::

        \widehat{\text{tpc}}(f, k, L) = \frac{\sum_{i, t} E[\text{emitted}_{i,t}]}{\sum_{i, t} E[\text{calls}_{i,t}]},
        \qquad
        \widehat{S}(f, k, L) = \frac{\widehat{\text{tpc}}\ (1 + e)\ t_{\text{plain}}}{t(k, L) + e\, t_{\text{plain}}},

    with ``E[emitted] = E[\tau_L | X] + 1`` (``L + 1`` for Sun et al.'s
    block verification, whose residual costs ``e = E[calls] - 1`` extra
    target calls of one token), :math:`t(k, L)` the seconds of one iteration's model calls
    (:class:`Costs`: one draft step from the context, ``L - 1`` batched draft
    steps on ``k`` rows, one target call scoring ``k`` rows of ``L + 1``
    tokens) and :math:`t_{\text{plain}}` the seconds of one step of plain
    decoding. By default every :math:`t` is what the run measured on its own
    device (its cost calibration), so the prediction is for that device.

    Quantities cheap at a real vocabulary are computed at every profiled
    position, the costly ones (:func:`otspec.profile._settings.costly`) at every
    ``subsample``-th; each estimate says on how many positions it rests
    (:attr:`Estimate.positions`), comparisons are made on common positions
    only, and :attr:`ProfileSummary.sets` gives the tables of each position set.

    Parameters
    ----------
    out : str or path
        The run's folder.
    draft_cost, score_cost : float or None, keyword-only
        Overrides of the measured costs, in units of one target call of plain
        decoding: one draft step ``c`` and the scoring call ``s`` (then
        :math:`t(k, L) = L c + s`; ``draft_cost`` alone keeps ``s = 1``,
        ``score_cost`` alone measures ``c`` from the run's timers).
    reference : str or None, keyword-only
        The family every other is compared with (paired) at ``k = 1``; default
        ``"token"`` if profiled, else the first family.
    reference_multi : str or None, keyword-only
        The family compared with at the same ``k`` when ``k > 1`` (default the
        optimal verifier, the ceiling; the same drafts on both sides, so the
        interval is narrow); ``None``, or not profiled: ``reference`` at ``k = 1``.
    n_boot : int, keyword-only
        Bootstrap resamples.
    seed : int, keyword-only
        Seed of the resampling (the summary is a function of the run and ``seed``).

    Returns
    -------
    ProfileSummary

    Raises
    ------
    ValueError
        ``out`` holds no run, or no finished shard; ``draft_cost`` negative, ``score_cost`` not above 0, or
        either not finite; ``reference`` not profiled; the costs would come from the run's timers (no cost
        calibration, or ``score_cost`` alone) and it holds none; a shard or the manifest unreadable, a shard
        with other columns than the rows' or not counted by the manifest (the message names the file).
    TypeError
        ``draft_cost`` or ``score_cost`` not a number.

    Examples
    --------
    See :func:`profile`.
    """
    for nm, val, least in (("draft_cost", draft_cost, ">= 0"), ("score_cost", score_cost, "> 0")):
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, (int, float, np.integer, np.floating)):
            raise TypeError(f"`{nm}` must be a number, got {type(val).__name__}")
        # a target call that scores tokens takes time: s = 0 would make an iteration without draft steps free
        if not (np.isfinite(val) and (val > 0 if least == "> 0" else val >= 0)):
            raise ValueError(f"`{nm}` must be a finite number {least}, got {val!r}")
    man = read_manifest(out)
    settings = man["settings"]
    missing = _missing_shards(out, man)
    sums = _stream_sums(out, settings)
    if sums is None:
        raise ValueError(f"`out` {str(out)!r} holds no finished shard yet")
    keys, prompts, S, C = sums["all"]
    N = len(prompts)
    rng = np.random.default_rng(seed)
    W = rng.multinomial(N, np.full(N, 1.0 / N), size=n_boot).astype(np.float64)
    costs = _costs(out, settings, draft_cost, score_cost)
    reps = _replicates(costs, settings, W.shape[0], seed)
    # each quantity on the positions where it was computed (the cheap ones everywhere, the costly on the subsample)
    own = _position_set("own", keys, S, C, W, costs, lambda kind, name: True, reps)
    sets = {"all": _position_set("all", keys, S, C, W, costs, lambda kind, name: not costly(kind, name), reps)}
    skeys, _, sS, sC = sums["sub"]
    if sC.size and sC.sum() > 0:
        sets["subsample"] = _position_set("subsample", skeys, sS, sC, W, costs, lambda kind, name: True, reps)
    tokens, speed = own.tokens_per_call, own.speedup
    tpc_keys = list(tokens)
    diffs = {}
    if tpc_keys:
        fams = list(dict.fromkeys(f for f, _, _ in tpc_keys))
        ref = reference if reference is not None else ("token" if "token" in fams else fams[0])
        if ref not in fams:
            raise ValueError(f"`reference` must be a profiled family {tuple(fams)}, got {ref!r}")
        # both schemes on the same positions: the subsample when either is costly, else every position
        a_keys, aE, aC, an = _emitted_and_calls(keys, S, C)
        s_keys, sE, sCm, sn = _emitted_and_calls(skeys, sS, sC)
        ap, ares = _boot(aE, aC, W)
        sp, sres = _boot(sE, sCm, W)
        for (f, k, L) in tpc_keys:
            other = (reference_multi, k, L) if k > 1 and (reference_multi, k, L) in tokens else (ref, 1, L)
            if f == other[0]:
                continue
            on_sub = costly("tau", f) or costly("tau", other[0])
            src, srcp, srcr, cnt = (s_keys, sp, sres, sn) if on_sub else (a_keys, ap, ares, an)
            if other not in src or (f, k, L) not in src:
                continue
            i, r = src.index((f, k, L)), src.index(other)
            # two tokens per call in [1, L + 1] each (the same L): their difference in [-L, L]
            diffs[((f, k, L), other)] = _interval(srcp[i] - srcp[r], srcr[:, i] - srcr[:, r], int(cnt[:, i].sum()),
                                                  _prompts(cnt[:, i]), difference=True, lower=-float(L), upper=float(L))
    has_trees = bool(settings.get("trees") or settings.get("tree_universe"))
    tree_labels = {n for f in resolve_trees(settings.get("trees") or (), settings.get("tree_universe")).families
                   for n in f.names()} if has_trees else set()
    renewal, ren_res = _renewal_estimates(sums["T_n"], {k: v for k, v in sums["starts"].items()
                                                        if k[0] not in tree_labels}, W,
                                          lambda name: get_verifier(name).lossless)
    tree_renewal = {"T_n": sums["T_n"], "starts": {k: v for k, v in sums["starts"].items() if k[0] in tree_labels},
                    "palm": {k: v for k, v in sums["palm"].items() if k[0] in tree_labels}}
    palm, bias = {}, {}
    if tpc_keys:
        a_keys, aE, aC, _ = _emitted_and_calls(keys, S, C)
        tp, tres = _boot(aE, aC, W)
        for key, (num, den) in sums["palm"].items():
            if key not in tokens:
                continue
            pp, pres = _boot(num[:, None], den[:, None], W)
            L = key[2]
            # the Palm average: an r-weighted mean (r >= 0) of E[tau_L | X] + 1 in [1, L + 1]; the bias: the ratio
            # of two values in [1, L + 1], less 1, in [1 / (L + 1) - 1, L]
            palm[key] = _interval(pp[0], pres[:, 0], tokens[key].positions, tokens[key].prompts, lower=1.0,
                                  upper=L + 1.0)
            i = a_keys.index(key)
            bias[key] = _interval(tp[i] / pp[0] - 1.0, tres[:, i] / pres[:, 0] - 1.0, tokens[key].positions,
                                  tokens[key].prompts, difference=True, lower=1.0 / (L + 1.0) - 1.0, upper=float(L))
    ren_diffs = {}
    if renewal:
        fams = list(dict.fromkeys(f for f, _, _ in renewal))
        rref = reference if reference in fams else ("token" if "token" in fams else fams[0])
        for (f, k, L), e in renewal.items():
            r = (rref, 1, L)
            if f != rref and r in renewal:
                # two renewal estimates of tokens per call (in [1, L + 1] for a lossless scheme): in [-L, L]
                lim = float(L) if get_verifier(f).lossless and get_verifier(rref).lossless else np.inf
                ren_diffs[((f, k, L), r)] = _interval(e.value - renewal[r].value, ren_res[(f, k, L)] - ren_res[r], 0,
                                                      min(e.prompts, renewal[r].prompts), difference=True, lower=-lim,
                                                      upper=lim)
    # rank every scheme on the positions where all were computed, when there are enough of them for an interval
    # over prompts; else the schemes computed at every position (the report says which)
    sub = sets.get("subsample")
    every = sets["all"] if sets["all"].recommendation is not None else None
    if sub is not None and any(costly("tau", f) for f, _, _ in tpc_keys) and (
            every is None or sub.positions >= MIN_RANKED_POSITIONS):
        common = sub
    else:
        common = every or sub or sets["all"]
    trees = _tree_summary(out, settings, prompts, W, costs, sets["all"], n_boot, seed, tree_renewal) \
        if has_trees else None
    profiled = max(sets["all"].positions, trees.positions if trees is not None else 0) or own.positions
    return ProfileSummary(acceptance=own.acceptance, gaps=own.gaps, tokens_per_call=tokens, differences=diffs,
                          speedup=speed, draft_cost=float(costs.draft[1] / costs.plain),
                          score_cost=float(costs.target[(1, settings["L_max"])] / costs.plain),
                          positions=profiled, prompts=N, settings=settings,
                          models=man["models"], renewal=renewal, renewal_differences=ren_diffs, palm=palm,
                          position_bias=bias, costs=costs, sets=sets, recommendation=common.recommendation,
                          skipped=man.get("skipped", {}), trees=trees,
                          timings=dict(costs.samples) if costs.source == "measured" else {},
                          cost_overrides={"draft_cost": draft_cost, "score_cost": score_cost},
                          provenance={"packages": man.get("packages", {}), "machine": man.get("machine"),
                                      "shards": int(man["shards"]), "missing_shards": missing},
                          configurations=configurations(common, trees), speedup_forward=own.speedup_forward)


#: Which serving engines run a ``(k, L)`` scheme, by family (the others: none; :mod:`otspec.decoding` runs every
#: one). Sources: vLLM ``RejectionSampler`` and SGLang's chain path (token-level speculative sampling, Leviathan
#: et al., arXiv:2211.17192, §2.3); block verification (Sun et al., arXiv:2403.10444) merged in vLLM's V2 model
#: runner as an opt-in rule (vllm-project/vllm pull request 46781), not in SGLang.
CHAIN_ENGINES = {
    "token": "vLLM, SGLang, transformers",
    "block": "vLLM's V2 model runner (opt-in); not SGLang",
}
#: Which serving engines run a draft-tree family, by draft process (a static top-k tree: Medusa, Cai et al.,
#: arXiv:2401.10774, §2.1.2; EAGLE-2, Li et al., arXiv:2406.16858, in SGLang; SpecInfer, Miao et al.,
#: arXiv:2305.09781; Sequoia, Chen et al., arXiv:2402.12374).
TREE_ENGINES = {
    "topk": "Medusa (`medusa_choices`)",
    "eagle2": "SGLang",
    "iid": "none (SpecInfer's research system)",
    "wor": "none (Sequoia's research code)",
}
#: What no engine runs (otspec.decoding runs every configuration).
NO_ENGINE = "none"
#: Longest ``medusa_choices`` a configuration writes out in full (a larger shape is named by its text).
MAX_LISTED_PATHS = 64
#: What a deterministic tree is verified with: its value is the same under every lossless rule.
DETERMINISTIC_VERIFIER = "any lossless verifier (engines: the target-only rule)"


@dataclass(frozen=True)
class Configuration:
    """One configuration a decoder can run, with its predicted speed-up over plain decoding.

    Attributes
    ----------
    name : str
        ``"token, k = 1, L = 3"``, a tree family's label, or the chosen static shape.
    kind : {"chain", "tree", "chosen tree"}
        A ``(k, L)`` scheme; a profiled draft-tree family; a shape chosen on the even-indexed prompts.
    speedup, tokens_per_call : Estimate
    positions : str
        Which positions the values rest on: ``"all"``, ``"subsample"`` (the ``(k, L)`` schemes' own set) or
        ``"held out"`` (the odd-indexed prompts; a chosen shape is never measured on the prompts that chose it).
    verifier : str
        The verifier to run it with.
    settings : str
        The engine settings that run it (``medusa_choices``, SGLang's flags), or ``""``.
    engines : str
        Which serving engines ship it.
    key : tuple or str
        ``(family, k, L)``, the tree family's label, or ``("static", n)``.
    speedup_forward : Estimate or None
        Prediction (b): the speed-up with the forward passes alone (an engine whose verification is fused into
        its forward pass; an upper bound on what removing the decoder's own work could reach). ``speedup`` is
        prediction (a), otspec's decoder on the run's device, when the run timed it (:class:`Costs`).
    """

    name: str
    kind: str
    speedup: Estimate
    tokens_per_call: Estimate
    positions: str
    verifier: str
    settings: str
    engines: str
    key: tuple | str
    speedup_forward: Estimate | None = None


def sglang_flags(params: dict) -> str:
    """SGLang's command-line flags of an EAGLE-2 tree (``speculative_num_steps`` ... as keys)."""
    return (f"--speculative-num-steps {params['speculative_num_steps']} --speculative-eagle-topk "
            f"{params['speculative_eagle_topk']} --speculative-num-draft-tokens {params['speculative_num_draft_tokens']}")


def _chain_verifier(family: str) -> str:
    spec = get_verifier(family)
    summary = getattr(spec, "summary", "") or ""
    return f"{family}" + (f": {summary}" if summary else "")


def configurations(chains: PositionSet | None, trees: TreeSummary | None) -> tuple:
    r"""Every lossless configuration a decoder can run, fastest first by predicted speed-up.

    .. math::

        \widehat S(c) = \frac{\widehat{\text{tpc}}(c)\ t_{\text{plain}}}{t(c)}\quad\text{for every } c,

    the ``(k, L)`` schemes ranked by ``chains``' recommendation (on its positions), the draft-tree families
    with a prediction (a) (on every profiled position; not those of :attr:`TreeSummary.unranked`) and the
    device-aware static top-k shape chosen on the even-indexed prompts,
    at its held-out value (measured on the odd-indexed ones; left out when those are fewer than
    :data:`MIN_RANKED_POSITIONS` positions and the others are not). Equal speed-ups are ordered by name, its
    numbers compared as numbers (tied ``(k, L)`` schemes by family, ``k``, ``L``: the recommendation's order; a
    configuration without a finite speed-up last).

    Parameters
    ----------
    chains : PositionSet or None
        The position set the recommendation ranks.
    trees : TreeSummary or None

    Returns
    -------
    tuple of Configuration
    """
    out = []
    rec = chains.recommendation if chains is not None else None
    for key, sp in (rec.ranking if rec is not None else ()):
        f, k, L = key
        out.append(Configuration(name=f"{f}, k = {k}, L = {L}", kind="chain", speedup=sp,
                                 tokens_per_call=chains.tokens_per_call[key], positions=chains.name,
                                 verifier=_chain_verifier(f), settings="",
                                 engines=CHAIN_ENGINES.get(f, NO_ENGINE), key=key,
                                 speedup_forward=chains.speedup_forward.get(key)))
    if trees is not None:
        for name, fam in trees.families.items():
            v = fam["verifier"]
            if (v is not None and not get_verifier(v).lossless) or name in trees.unranked:
                continue  # lossy; or no prediction (a) (its decoder not timed): not ranked, as the (k, L) schemes
            proc = fam["process"]
            settings = ""
            if proc == "eagle2":
                d, k, t = (int(x) for x in name.split(":")[1].split(","))
                settings = sglang_flags({"speculative_num_steps": d, "speculative_eagle_topk": k,
                                         "speculative_num_draft_tokens": t})
            elif proc == "topk":
                mc = fam.get("medusa_choices") or []
                settings = (f"medusa_choices = {mc}" if len(mc) <= MAX_LISTED_PATHS else
                            f"medusa_choices of {fam['spec']} ({len(mc)} rank paths)")
            out.append(Configuration(name=name, kind="tree", speedup=trees.speedup[name],
                                     tokens_per_call=trees.tokens_per_call[name], positions="all",
                                     verifier=DETERMINISTIC_VERIFIER if v is None else v, settings=settings,
                                     engines=TREE_ENGINES[proc], key=name,
                                     speedup_forward=trees.speedup_forward.get(name)))
        ch = trees.choice
        if ch is not None and ch.fastest is not None and (ch.positions[1] >= MIN_RANKED_POSITIONS
                                                          or trees.positions < MIN_RANKED_POSITIONS):
            st, ex = ch.fastest, ch.export
            out.append(Configuration(
                name=f"static top-k tree, n = {st.n} (chosen" + ("; at the edge of the recorded universe)" if ch.edge
                                                               else ")"),
                kind="chosen tree", speedup=st.speedup,
                tokens_per_call=st.tokens_per_call, positions="held out", verifier=DETERMINISTIC_VERIFIER,
                settings=f"medusa_choices = {ex['medusa_choices']}", engines=TREE_ENGINES["topk"], key=("static", st.n),
                speedup_forward=st.speedup_forward))
    return tuple(sorted(out, key=lambda c: (-c.speedup.value if np.isfinite(c.speedup.value) else np.inf,
                                            _natural(c.name))))


def _natural(name: str) -> tuple:
    """``name`` as a sort key with its numbers compared as numbers (``L = 2`` before ``L = 10``), so that tied
    ``(k, L)`` schemes keep the recommendation's order, by ``(family, k, L)``."""
    return tuple(int(x) if i % 2 else x for i, x in enumerate(re.split(r"(\d+)", name)))


def _missing_shards(out, man: dict) -> tuple:
    """The file names of the run's shards not (yet) written: an unfinished run is summarised on the shards it holds,
    and the report says which are missing. A shard file the manifest does not count is refused, named."""
    from pathlib import Path

    expected = int(man["shards"])
    names = {shard_path(Path(out), s).name for s in range(expected)}
    for path in sorted(Path(out).glob("shard-*.parquet")):
        if path.name not in names:
            raise ValueError(f"shard {str(path)!r} is not one of the {expected} shards of the run in `out` "
                             f"{str(out)!r} (shard-00000.parquet to {shard_path(Path(out), expected - 1).name}): a "
                             "file of another run, or renamed; move it out of the folder")
    return tuple(sorted(n for n in names if not (Path(out) / n).is_file()))


def _merge_sums(parts):
    """Stack per-shard ``(keys, prompts, S, C)`` (disjoint prompts) on the union of their keys."""
    keys = sorted({k for p in parts for k in p[0]})
    col = {k: i for i, k in enumerate(keys)}
    prompts = np.concatenate([p[1] for p in parts])
    S = np.zeros((len(prompts), len(keys)))
    C = np.zeros((len(prompts), len(keys)))
    row = 0
    for pk, pp, pS, pC in parts:
        idx = [col[k] for k in pk]
        S[row:row + len(pp), idx] = pS
        C[row:row + len(pp), idx] = pC
        row += len(pp)
    return keys, prompts, S, C


def _stream_sums(out, settings: dict):
    """Per-prompt sums of a run, reading one shard at a time (memory: one shard plus the ``(N, keys)`` sums).

    Returns ``{"all": (keys, prompts, S, C), "sub": ... on the costly subsample, "T_n": (N,),
    "starts": {(scheme, k, L): (N,)}, "palm": {(scheme, k, L): ((N,), (N,))}}`` (the renewal starts per
    prompt; the Palm sums over the profiled positions), or None without shards.
    """
    import pyarrow as pa
    import pyarrow.compute as pc


    alls, subs, T_parts, start_parts, palm_parts = [], [], [], [], []
    for t in iter_shards(out):
        t = t.filter(pc.invert(pc.is_in(t["kind"], value_set=pa.array(TIMING_KINDS))))
        if t.num_rows == 0:
            continue
        # every prompt of the shard has a row, also one whose only rows are the trees' (a run whose (k, L)
        # schemes are computed on the subsample only): the trees and the renewal starts are indexed by these rows
        part = prompt_sums(t, ("acc", "tv", "kl", "tau", "calls"), np.unique(t["prompt"].to_numpy()))
        prompts = part[1]
        alls.append(part)
        mask = [is_subsampled(p, i, settings) for p, i in zip(t["pos"].to_pylist(), t["prompt"].to_pylist())]
        subs.append(prompt_sums(t.filter(pa.array(mask, type=pa.bool_())), ("acc", "tv", "kl", "tau", "calls"),
                                prompts))
        T_n, starts, palm = _renewal_starts(t, prompts)
        T_parts.append(T_n)
        start_parts.append(starts)
        palm_parts.append(palm)
    if not alls:
        return None
    skeys = sorted({k for st in start_parts for k in st})
    starts = {k: np.concatenate([st.get(k, np.zeros(len(a[1]))) for st, a in zip(start_parts, alls)]) for k in skeys}
    pkeys = sorted({k for pa_ in palm_parts for k in pa_})
    zeros = [(np.zeros(len(a[1])),) * 2 for a in alls]
    palm = {k: tuple(np.concatenate([pa_.get(k, z)[c] for pa_, z in zip(palm_parts, zeros)]) for c in (0, 1))
            for k in pkeys}
    return {"all": _merge_sums(alls), "sub": _merge_sums(subs), "T_n": np.concatenate(T_parts), "starts": starts,
            "palm": palm}


def _renewal_starts(table, prompts: np.ndarray) -> tuple[np.ndarray, dict, dict]:
    r"""Per prompt of one shard: the text length :math:`T_n`, :math:`\sum_t r_n(t)` of every recorded scheme,
    and the Palm sums :math:`(\sum_t r_n(t)\, m_n(t), \sum_t r_n(t))` over the positions where the scheme's
    :math:`m = E[\tau_L \mid X] + 1` is recorded (for a static top-k tree family, keyed ``(label, n, depth)``,
    :math:`m = E[\tau \mid T] + 1` from its ``kind="tree"`` rows).

    ``r`` is :func:`otspec.profile.starts_recursion` of the prompt's emission tables.
    """
    import pyarrow as pa
    import pyarrow.compute as pc


    t = table.filter(pc.is_in(table["kind"], value_set=pa.array(["e", "logq"])))
    T_n = np.zeros(len(prompts))
    if t.num_rows == 0:
        return T_n, {}, {}
    tau = table.filter(pc.is_in(table["kind"], value_set=pa.array(["tau", "tree"])))  # a tree: (label, n, depth)
    tau_cols = {c: tau[c].to_numpy() for c in ("prompt", "pos", "k", "j", "value")}
    tau_name = np.asarray(tau["name"].to_pylist(), dtype=object)
    prompt = t["prompt"].to_numpy()
    kind = np.asarray(t["kind"].to_pylist(), dtype=object)
    name = np.asarray(t["name"].to_pylist(), dtype=object)
    pos, k, j, m, v = (t[c].to_numpy() for c in ("pos", "k", "j", "m", "value"))
    row = {p: i for i, p in enumerate(prompts.tolist())}
    lq_mask = kind == "logq"
    logq = {}
    for p in np.unique(prompt[lq_mask]):
        sel = lq_mask & (prompt == p)
        order = np.argsort(pos[sel])
        logq[int(p)] = v[sel][order]
        T_n[row[int(p)]] = sel.sum()
    e_mask = ~lq_mask
    starts, palm = {}, {}
    for key in sorted({(a, int(b), int(c)) for a, b, c in zip(name[e_mask], k[e_mask], m[e_mask])}):
        f, kk, L = key
        sel0 = e_mask & (name == f) & (k == kk) & (m == L)
        tsel0 = (tau_name == f) & (tau_cols["k"] == kk) & (tau_cols["j"] == L)
        S_n, num, den = np.zeros(len(prompts)), np.zeros(len(prompts)), np.zeros(len(prompts))
        for p, lq in logq.items():
            sel = sel0 & (prompt == p)
            E = np.zeros((lq.shape[0], L + 1))
            E[pos[sel], j[sel] - 1] = v[sel]
            r = starts_recursion(E, lq)
            S_n[row[p]] = r.sum()
            tsel = tsel0 & (tau_cols["prompt"] == p)
            rt = r[tau_cols["pos"][tsel]]
            num[row[p]] = float(rt @ (tau_cols["value"][tsel] + 1.0))
            den[row[p]] = float(rt.sum())
        starts[key] = S_n
        if den.any():
            palm[key] = (num, den)
    return T_n, starts, palm


def _renewal_estimates(T_n: np.ndarray, starts: dict, W: np.ndarray, lossless=lambda name: True) -> tuple[dict, dict]:
    r"""Tokens per call by the renewal estimator: :math:`\sum_n T_n / \sum_n \sum_t r_n(t)` over prompts.

    The interval resamples prompts with the same weights ``W`` as every other estimate. Its range: the limit
    estimated, real decoding's tokens per call, lies in ``[1, L + 1]`` for a scheme whose output follows the
    target (``lossless(name)``; keys ``(name, k, L)``, or ``(label, n, depth)`` with ``depth`` for ``L``), each
    call emitting from 1 to ``L + 1`` tokens; none is used for the others (the recursion's ``r`` is then no
    probability of a start).
    """
    out, resampled = {}, {}
    for key, S_n in starts.items():
        with np.errstate(invalid="ignore", divide="ignore"):
            point = T_n.sum() / S_n.sum()
            res = (W @ T_n) / (W @ S_n)
        lo, hi = (1.0, key[2] + 1.0) if lossless(key[0]) else (-np.inf, np.inf)
        out[key] = _interval(point, res, 0, _prompts(S_n), lower=lo, upper=hi)
        resampled[key] = res
    return out, resampled


# --------------------------------------------------------------------------- draft trees
#: Largest node budget of the static shapes chosen from the top-k universe (each budget builds its shape).
MAX_STATIC_BUDGET = 256


@dataclass(frozen=True)
class StaticShape:
    r"""A static top-k shape with ``n`` nodes, chosen on one half of the prompts and measured on the other.

    .. math::

        S_n = \{\text{the } n \text{ rank paths of largest } \bar Q_{\text{choose}}\},\qquad
        \widehat{\text{tpc}}(S_n) = 1 + \frac{\sum_{t \in \text{evaluate}} \sum_{s \in S_n} Q_t(x_t(s))}
        {\#\text{evaluate}}.

    Attributes
    ----------
    n : int
    paths : tuple of tuples
        The rank paths, root excluded, in node order (Medusa's ``medusa_choices``: :attr:`medusa_choices`).
    tokens_per_call, speedup : Estimate
        On the evaluation half only (never on the prompts that chose the shape).
    node_values : tuple of float
        Each node's mean target path probability on the evaluation half (its mean acceptance: the probability
        that a target sample passes through it), in node order.
    seconds : float
        One iteration's seconds by the run's cost model (draft calls per depth and the tree call).
    speedup_forward : Estimate or None
        Prediction (b), the forward passes alone (``speedup`` is prediction (a), otspec's decoder: see
        :class:`Costs`).
    """

    n: int
    paths: tuple
    tokens_per_call: Estimate
    speedup: Estimate
    node_values: tuple
    seconds: float
    speedup_forward: Estimate | None = None

    @property
    def shape(self) -> TreeShape:
        return TreeShape(self.paths)

    @property
    def medusa_choices(self) -> list:
        """The rank paths as Medusa's ``medusa_choices`` (lists, root excluded, node order)."""
        return [list(p) for p in self.paths]


@dataclass(frozen=True)
class SequoiaShape:
    """Sequoia's dynamic-programme shape with ``n`` nodes (acceptance vector from the choosing half).

    Attributes
    ----------
    n, depth : int
    paths : tuple
    predicted : float
        Sequoia's predicted tokens per call (its :math:`c(n + 1, \\mathrm{depth} + 1)`, the bonus included).
    tokens_per_call : Estimate or None
        Measured exactly on the evaluation half (the recorded per-node acceptance of the family it came from),
        None when the shape does not lie inside that family's shape.
    """

    n: int
    depth: int
    paths: tuple
    predicted: float
    tokens_per_call: Estimate | None


@dataclass(frozen=True)
class TreeChoice:
    """The choice of a draft tree: chosen on the even-indexed prompts, measured on the odd-indexed ones.

    Attributes
    ----------
    choose_prompts, evaluate_prompts : int
    positions : tuple of int
        Profiled positions of the two halves.
    static : tuple of StaticShape
        The best static top-k shape for every node budget ``n = 1, ..., N`` (from the universe).
    fastest : StaticShape or None
        The device-aware choice: the budget whose shape has the largest predicted speed-up on the choosing half.
    sequoia : tuple of SequoiaShape
    acceptance : tuple of float
        Sequoia's acceptance vector (choosing half); ``sequoia_source`` the family it is measured on.
    sequoia_source : str or None
    eagle2, eagle2_speedup : dict
        EAGLE-2 families -> Estimate on the evaluation half; ``best_eagle2`` the one chosen on the choosing half
        (largest predicted speed-up).
    best_eagle2 : str or None
    heldout : dict
        Every tree family -> its tokens per call on the evaluation half (the same positions as the choices).
    versus : dict
        Every ``"topk"`` family -> the best static shape of its size minus it, tokens per call on the evaluation
        half (paired: the same resamples on both sides).
    heldout_speedup : dict
        Every tree family -> its predicted speed-up on the evaluation half (:attr:`heldout` by the cost model).
    edge : tuple of str
        Where ``fastest`` touches the edge of the recorded universe, so that a shape beyond it might be faster
        and was not considered: ``"size"`` (the largest budget), ``"depth"`` (the universe's deepest level),
        ``"rank"`` (a node of the largest rank the universe holds under its parent); empty: inside it.
    export : dict
        For ``fastest``: ``medusa_choices``; ``sglang`` (``speculative_num_steps``, ``speculative_eagle_topk``,
        ``speculative_num_draft_tokens``: its depth, its widest node and its size + 1); ``sglang_tokens_per_call``
        (EAGLE-2 with those parameters on the evaluation half, from the universe or a profiled family; None when
        neither covers it) and ``closest_eagle2`` (the nearest profiled EAGLE-2 family).
    """

    choose_prompts: int
    evaluate_prompts: int
    positions: tuple
    static: tuple
    fastest: StaticShape | None
    sequoia: tuple
    acceptance: tuple
    sequoia_source: str | None
    eagle2: dict
    eagle2_speedup: dict
    best_eagle2: str | None
    export: dict
    heldout: dict = field(default_factory=dict)
    versus: dict = field(default_factory=dict)
    heldout_speedup: dict = field(default_factory=dict)
    edge: tuple = ()


@dataclass(frozen=True)
class TreeSummary:
    """The draft-tree families of a run, beside the ``(k, L)`` families on the same positions.

    Attributes
    ----------
    families : dict
        ``name -> {"process", "verifier", "n", "depth", "spec", "medusa_choices"}`` of every ``kind="tree"`` row
        name (``medusa_choices``: a ``topk`` family's rank paths, else None).
    tokens_per_call, speedup : dict
        ``name -> Estimate`` on every profiled position (all prompts; the same resamples as every estimate);
        ``speedup`` is prediction (a), otspec's decoder (:class:`Costs`).
    speedup_forward : dict
        ``name -> Estimate``: prediction (b), the forward passes alone.
    seconds : dict
        ``name -> seconds``: one iteration's seconds by the cost model.
    chains, chains_speedup : dict
        The ``(family, k, L)`` schemes computed at every profiled position (the same positions), ``-> Estimate``.
    positions : int
    choice : TreeChoice or None
    note : str
        Why there is no choice, when there is none.
    renewal, palm, position_bias : dict
        For the static top-k families (profiled along a target-sampled text), ``name -> Estimate``: tokens per
        call by the renewal estimator (their emission law along the text is exact: no verifier, no drawn tree;
        tokens kept per call of decodes of the texts' length, as otspec's decoder makes them), the Palm average
        of ``1 + E[tau | T]`` (weighted by the start probabilities; tokens emitted per call by a decoder that
        drafts whole trees to the end, overshoot included) and ``tokens_per_call / palm - 1``, the per-position
        average's bias.
    along : dict
        ``name -> (route, reason)``: how each family's emission law along the text is computed (``route``, a
        sentence), or why it has none (``route`` None, ``reason`` a sentence).
    bounds : dict
        ``name -> TreeBoundSummary`` of every sampled family's verifier: its value beside the upper bound on every
        lossless verifier, on the positions where the bound was computed (empty when it was not).
    unranked : tuple of str
        The families with no prediction (a): the run's cost calibration timed the decoder but no tree family's
        decode within its budget (``calibration_s``), so no tree decoder's work outside the forward passes was
        measured; their ``speedup`` is NaN and :func:`configurations` leaves them out (as a ``(k, L)`` family with
        no timed configuration), their ``speedup_forward`` (prediction (b)) stands.
    chains_speedup_forward : dict
        Prediction (b) of the ``chains`` (``-> Estimate``).
    """

    families: dict
    tokens_per_call: dict
    speedup: dict
    seconds: dict
    chains: dict
    chains_speedup: dict
    positions: int
    choice: TreeChoice | None
    note: str = ""
    renewal: dict = field(default_factory=dict)
    palm: dict = field(default_factory=dict)
    position_bias: dict = field(default_factory=dict)
    along: dict = field(default_factory=dict)
    speedup_forward: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)
    unranked: tuple = ()
    chains_speedup_forward: dict = field(default_factory=dict)


def _interp(x: float, xs: np.ndarray, ys: list):
    """Linear interpolation of ``ys`` (floats or arrays of replicates) at ``x``, constant beyond the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = int(np.searchsorted(xs, x))
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return (1.0 - w) * ys[i - 1] + w * ys[i]


class _TreeCosts:
    """Seconds of a tree decoder's iteration: the target scoring ``n`` nodes, the draft stepping ``r`` rows, and
    (prediction (a)) the decoder's measured work outside them; with the bootstrap replicates of the timings."""

    def __init__(self, costs: Costs, settings: dict, reps: Costs | None = None):
        self.costs, self.reps = costs, costs if reps is None else reps
        self.plain = costs.plain
        cal = costs.calls if costs.source == "measured" else {}
        self.n = np.array(sorted(m - 1 for (name, _, m) in cal if name == "tree-target"), float)
        self.r = np.array(sorted(k for (name, k, m) in cal if name == "draft" and m == 1), float)
        if self.n.size and self.r.size:
            self.description = ("measured by the run on its own device: the target scoring a tree of n nodes (n + 1 "
                                "tokens, tree mask) and the draft stepping r rows, medians of synchronised timings, "
                                "linear between the measured sizes")
        else:
            self.n = self.r = None
            self.description = (f"{costs.description}; a tree call costs what scoring one block of L_max + 1 tokens "
                                "does, whatever its size")
        self.L_max = settings["L_max"]
        plan = resolve_trees(settings.get("trees") or (), settings.get("tree_universe"))
        sizes = {name: (f.n, f.process) for f in plan.families for name in f.names()}
        self.shapes = {name: f.shape for f in plan.families for name in f.names()}
        timed = [(sizes[nm][0], nm) for nm in costs.overhead if isinstance(nm, str) and nm in sizes]
        topk = [t for t in timed if sizes[t[1]][1] == "topk"]
        self.over = sorted(topk or timed)  # static shapes: interpolated in n between these families' own

    def _tree(self, c: Costs, n: int):
        if self.n is None:
            return c.target[(1, self.L_max)]
        return _interp(n, self.n, [c.calls[("tree-target", 1, int(m) + 1)] for m in self.n])

    def _draft(self, c: Costs, r: int):
        if self.r is None:
            return c.draft[1]
        return _interp(r, self.r, [c.calls[("draft", int(k), 1)] for k in self.r])

    def _beyond(self, c: Costs, name: str):
        """A timed tree family's measured step less its calibrated forward passes."""
        return c.overhead[name] - self.iteration(self.shapes[name], c)

    @property
    def unranked(self) -> bool:
        """Whether the run timed the decoder (prediction (a) adds its measured work) but no tree family's decode:
        then no tree has a prediction (a) (NaN), as a ``(k, L)`` family with no timed configuration has none."""
        return self.costs.decoder_measured and not self.over

    def _overhead(self, c: Costs, n: int, name: str | None):
        if name is not None and name in c.overhead:
            return self._beyond(c, name)
        if not self.over:  # no tree decoder timed: none to read off (nothing when the run timed no decoder at all)
            return float("nan") if self.unranked else 0.0
        return _interp(n, np.array([a for a, _ in self.over], float), [self._beyond(c, nm) for _, nm in self.over])

    def iteration(self, shape, c: Costs | None = None):
        """One iteration's forward passes: a draft call per depth (the nodes of that depth with children) and one
        tree call."""
        c = self.costs if c is None else c
        return sum(self._draft(c, r) for r in draft_rows(shape)) + self._tree(c, shape.n)

    def factors(self, shape, name: str | None = None) -> tuple:
        """``(a, a replicates, b, b replicates)``: the speed-up per token per call of prediction (a), otspec's
        decoder (forward passes plus its measured work outside them, :meth:`Costs.decoder_plain` per plain token),
        and of (b), the forward passes alone."""
        out = []
        for c in (self.costs, self.reps):
            it = self.iteration(shape, c)
            out.append((c.decoder_plain / (it + self._overhead(c, shape.n, name)), c.plain / it))
        (a, b), (ar, br) = out
        return a, ar, b, br


def _tree_sums(out, prompts: np.ndarray):
    """Per-prompt sums and counts of the tree rows, on the rows of ``prompts`` (the run's order)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    for t in iter_shards(out):
        t = t.filter(pc.is_in(t["kind"], value_set=pa.array(list(TREE_KINDS))))
        if t.num_rows:
            parts.append(prompt_sums(t, TREE_KINDS))
    if not parts:
        return [], np.zeros((len(prompts), 0)), np.zeros((len(prompts), 0))
    keys, got, S, C = _merge_sums(parts)
    rows = np.searchsorted(got, prompts)
    ok = (rows < len(got)) & (got[np.minimum(rows, len(got) - 1)] == prompts)
    S2, C2 = np.zeros((len(prompts), len(keys))), np.zeros((len(prompts), len(keys)))
    S2[ok], C2[ok] = S[rows[ok]], C[rows[ok]]
    return keys, S2, C2


def _universe_positions(out, plan: TreePlan, prompts: np.ndarray):
    """Per profiled position of ``prompts``: its prompt and the universe's draft and target path probabilities,
    ``(prompt (M,), P (M, U + 1), Q (M, U + 1))`` (column 0, the root, is 1)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    U = plan.universe.n
    keys, Ps, Qs = [], [], []
    for t in iter_shards(out):
        t = t.filter(pc.and_(pc.is_in(t["kind"], value_set=pa.array(["treeq", "treep"])),
                             pc.is_in(t["prompt"], value_set=pa.array(prompts.tolist(), type=pa.int32()))))
        if not t.num_rows:
            continue
        pr, pos, j, v = (t[c].to_numpy() for c in ("prompt", "pos", "j", "value"))
        kind = np.asarray(t["kind"].to_pylist(), dtype=object)
        at = sorted(set(zip(pr.tolist(), pos.tolist())))
        row = {a: i for i, a in enumerate(at)}
        P, Q = np.ones((len(at), U + 1)), np.ones((len(at), U + 1))
        idx = np.fromiter((row[(a, b)] for a, b in zip(pr.tolist(), pos.tolist())), dtype=np.int64, count=len(v))
        isq = kind == "treeq"
        Q[idx[isq], j[isq]] = v[isq]
        P[idx[~isq], j[~isq]] = v[~isq]
        keys += [a for a, _ in at]
        Ps.append(P)
        Qs.append(Q)
    if not Ps:
        return np.zeros(0, dtype=np.int64), np.ones((0, U + 1)), np.ones((0, U + 1))
    return np.array(keys), np.concatenate(Ps), np.concatenate(Qs)


def _resample(N: int, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.multinomial(N, np.full(N, 1.0 / N), size=n_boot).astype(np.float64)


def _ratio_estimate(E: np.ndarray, C: np.ndarray, W: np.ndarray, positions: int, factor: float = 1.0,
                    factor_res=None, *, difference: bool = False, lower: float = -np.inf,
                    upper: float = np.inf) -> Estimate:
    """``sum E / sum C`` times ``factor``, its resamples times ``factor_res`` (replicates paired with ``W``'s rows;
    default ``factor``); ``difference``: ``E`` sums differences (:func:`_interval`'s own scale); ``lower``,
    ``upper``: the range of the quantity (:func:`_interval`)."""
    p, r = _boot(E[:, None], C[:, None], W)
    return _interval(p[0] * factor, r[:, 0] * (factor if factor_res is None else factor_res), positions,
                     _prompts(C), r[:, 0] * factor, difference=difference, lower=lower, upper=upper)


def _tree_summary(out, settings: dict, prompts: np.ndarray, W: np.ndarray, costs: Costs, every: PositionSet,
                  n_boot: int, seed: int, ren: dict | None = None) -> TreeSummary:
    """Tokens per call and speed-ups of the tree families on every profiled position, and the choice of a tree;
    for the static top-k families, the renewal estimate, the Palm average and the per-position bias from ``ren``
    (``{"T_n", "starts", "palm"}`` keyed ``(label, n, depth)``, as the ``(k, L)`` families')."""
    plan = resolve_trees(settings.get("trees") or (), settings.get("tree_universe"))
    tc = _TreeCosts(costs, settings, _replicates(costs, settings, W.shape[0], seed))
    keys, S, C = _tree_sums(out, prompts)
    col = {key: i for i, key in enumerate(keys)}
    fams, tokens, speed, secs, renewal, palm, bias, along, forward = {}, {}, {}, {}, {}, {}, {}, {}, {}
    positions = 0
    for f in plan.families:
        for v, name in zip(f.verifiers or (None,), f.names()):
            i = col.get(("tree", name, f.n, f.depth))
            if i is None:
                continue
            n = C[:, i]
            positions = max(positions, int(n.sum()))
            fams[name] = {"process": f.process, "verifier": v, "n": f.n, "depth": f.depth, "spec": f.spec,
                          "medusa_choices": f.shape.to_medusa_choices() if f.process == "topk" else None}
            along[name] = along_text_route(f.process, v, stride=settings.get("stride", 1),
                                           context=settings.get("context", "sample"))
            secs[name] = tc.iteration(f.shape)
            # E[tau | T] + 1 in [1, depth + 1] per position (at most one node per depth accepted); speed-ups > 0
            top = f.depth + 1.0
            tokens[name] = _ratio_estimate(S[:, i] + n, n, W, int(n.sum()), lower=1.0, upper=top)
            a, ar, b, br = tc.factors(f.shape, name)
            speed[name] = _ratio_estimate(S[:, i] + n, n, W, int(n.sum()), a, ar, lower=0.0)
            forward[name] = _ratio_estimate(S[:, i] + n, n, W, int(n.sum()), b, br, lower=0.0)
            key = (name, f.n, f.depth)
            if ren and key in ren["starts"]:
                ok = v is None or get_verifier(v).lossless
                renewal[name] = _renewal_estimates(ren["T_n"], {key: ren["starts"][key]}, W,
                                                   lambda _, ok=ok: ok)[0][key]
            if ren and key in ren["palm"]:
                num, den = ren["palm"][key]
                pp, pres = _boot(num[:, None], den[:, None], W)
                tp, tres = _boot((S[:, i] + n)[:, None], n[:, None], W)
                # as the chains': the Palm average in [1, depth + 1], the bias in [1 / (depth + 1) - 1, depth]
                palm[name] = _interval(pp[0], pres[:, 0], int(n.sum()), _prompts(n), lower=1.0, upper=top)
                bias[name] = _interval(tp[0] / pp[0] - 1.0, tres[:, 0] / pres[:, 0] - 1.0, int(n.sum()), _prompts(n),
                                       difference=True, lower=1.0 / top - 1.0, upper=top - 1.0)
    choice, note = None, ""
    even = prompts % 2 == 0
    if not even.any() or even.all():
        note = "The choice needs prompts of both parities (even-indexed to choose, odd-indexed to measure)."
    elif not S.size:
        note = "No tree rows were recorded."
    else:
        choice = _tree_choice(plan, prompts, even, keys, col, S, C, tc, out, n_boot, seed)
    return TreeSummary(families=fams, tokens_per_call=tokens, speedup=speed, seconds=secs, speedup_forward=forward,
                       chains=dict(every.tokens_per_call), chains_speedup=dict(every.speedup), positions=positions,
                       choice=choice, note=note, renewal=renewal, palm=palm, position_bias=bias, along=along,
                       bounds=_bound_summary(out, settings, plan, prompts, W),
                       unranked=tuple(name for name, e in speed.items() if tc.unranked and not np.isfinite(e.value)),
                       chains_speedup_forward=dict(every.speedup_forward))


def _tree_choice(plan: TreePlan, prompts, even, keys, col, S, C, tc: _TreeCosts, out, n_boot: int,
                 seed: int) -> TreeChoice:
    """Every choice on the even-indexed prompts, every reported value on the odd-indexed ones."""
    odd = ~even
    We = _resample(int(odd.sum()), n_boot, seed + 1)
    Sc, Cc, Se, Ce = S[even], C[even], S[odd], C[odd]

    def npos(Cm, name_key):
        return Cm[:, col[name_key]]

    static, fastest, versus = (), None, {}
    pos_c = pos_e = 0
    # tokens per call of a tree of depth D: E[tau | T] + 1 in [1, D + 1] per position; speed-ups > 0
    heldout = {name: _ratio_estimate(Se[:, i] + Ce[:, i], Ce[:, i], We, int(Ce[:, i].sum()), lower=1.0,
                                     upper=depth + 1.0)
               for (kind, name, _, depth), i in col.items() if kind == "tree"}
    if plan.universe is not None and ("treeq", "topk", 0, 1) in col:
        U = plan.universe
        qcols = np.array([col[("treeq", "topk", 0, j)] for j in range(1, U.n + 1)])
        nc, ne = npos(Cc, ("treeq", "topk", 0, 1)), npos(Ce, ("treeq", "topk", 0, 1))
        pos_c, pos_e = int(nc.sum()), int(ne.sum())
        mean_c = Sc[:, qcols].sum(axis=0) / nc.sum()
        order = static_order(mean_c, U.parents)
        N = min(U.n, MAX_STATIC_BUDGET)
        cum_e = np.cumsum(Se[:, qcols[order[:N] - 1]], axis=1) + ne[:, None]
        point, res = _boot(cum_e, np.repeat(ne[:, None], N, axis=1), We)
        mean_e = Se[:, qcols].sum(axis=0) / ne.sum()
        tpc_c = 1.0 + np.cumsum(mean_c[order[:N] - 1])
        out_static, pred = [], []
        for n in range(1, N + 1):
            ids = np.sort(order[:n])
            paths = tuple(U.paths[i] for i in ids)
            shape = TreeShape(paths)
            secs = tc.iteration(shape)
            f, fr, fb, fbr = tc.factors(shape)
            # 1 + the sum of the nodes' probabilities of acceptance = 1 + E[accepted nodes] in [1, depth + 1]
            out_static.append(StaticShape(
                n=n, paths=shape.paths[1:],
                tokens_per_call=_interval(point[n - 1], res[:, n - 1], pos_e, _prompts(ne), lower=1.0,
                                          upper=shape.max_depth + 1.0),
                speedup=_interval(point[n - 1] * f, res[:, n - 1] * fr, pos_e, _prompts(ne), res[:, n - 1] * f,
                                  lower=0.0),
                speedup_forward=_interval(point[n - 1] * fb, res[:, n - 1] * fbr, pos_e, _prompts(ne),
                                          res[:, n - 1] * fb, lower=0.0),
                node_values=tuple(float(mean_e[i - 1]) for i in (plan.index[p] for p in shape.paths[1:])),
                seconds=secs))
            pred.append(tpc_c[n - 1] * f)
        static = tuple(out_static)
        pred = np.array(pred, dtype=float)
        if np.isfinite(pred).any():  # no prediction (a) (no tree decoder timed): no device-aware choice
            fastest = static[int(np.argmax(np.where(np.isfinite(pred), pred, -np.inf)))]
        for f in plan.topk:
            i = col.get(("tree", f.label, f.n, f.depth))
            if i is None or f.n > N:
                continue
            both = np.stack([cum_e[:, f.n - 1], Se[:, i] + Ce[:, i]], axis=1)
            p2, r2 = _boot(both, np.stack([ne, Ce[:, i]], axis=1), We)
            # a static shape's tokens per call in [1, D_s + 1] less the family's in [1, depth + 1]
            versus[f.label] = _interval(p2[0] - p2[1], r2[:, 0] - r2[:, 1], pos_e, _prompts(ne), difference=True,
                                        lower=-float(f.depth), upper=float(static[f.n - 1].shape.max_depth))
    # Sequoia: the acceptance vector of a per-node rule on a recorded sampled family, on the choosing half
    seq, acc, source = (), (), None
    cands = [(f, name, v) for f in plan.sampled for v, name in zip(f.verifiers, f.names())
             if v in ("sequoia", "specinfer") and not f.shape.has_rank_gaps and ("treenode", name, f.n, 1) in col]
    if cands:
        f, name, _ = max(cands, key=lambda c: (c[2] == "sequoia", c[0].n))
        ncols = np.array([col[("treenode", name, f.n, j)] for j in range(1, f.n + 1)])
        nc, ne = npos(Cc, ("treenode", name, f.n, 1)), npos(Ce, ("treenode", name, f.n, 1))
        root = [i for i in range(1, f.n + 1) if f.shape.depth[i] == 1]
        a = Sc[:, ncols[np.array(root) - 1]].sum(axis=0) / nc.sum()
        acc, source = tuple(float(x) for x in a), name
        fidx = {p: i for i, p in enumerate(f.shape.paths)}
        out_seq = []
        for n in range(1, f.n + 1):
            try:
                value, shape = sequoia(np.clip(a, 0.0, 1.0), n, f.depth)
            except ValueError:
                continue
            measured = None
            if all(p in fidx for p in shape.paths[1:]):
                ids = np.array([fidx[p] for p in shape.paths[1:]])
                E = ne + Se[:, ncols[ids - 1]].sum(axis=1)
                measured = _ratio_estimate(E, ne, We, int(ne.sum()), lower=1.0, upper=shape.max_depth + 1.0)
            out_seq.append(SequoiaShape(n=n, depth=f.depth, paths=shape.paths[1:], predicted=float(value) + 1.0,
                                        tokens_per_call=measured))
        seq = tuple(out_seq)
    # EAGLE-2: every profiled grid point on the evaluation half; the best chosen on the choosing half
    e2, e2s, best, best_c = {}, {}, None, -np.inf
    for f in plan.eagle2:
        key = ("tree", f.label, f.n, f.depth)
        if key not in col:
            continue
        i = col[key]
        fac, fac_r, _, _ = tc.factors(f.shape, f.label)
        e2[f.label] = _ratio_estimate(Se[:, i] + Ce[:, i], Ce[:, i], We, int(Ce[:, i].sum()), lower=1.0,
                                      upper=f.depth + 1.0)
        e2s[f.label] = _ratio_estimate(Se[:, i] + Ce[:, i], Ce[:, i], We, int(Ce[:, i].sum()), fac, fac_r, lower=0.0)
        sc = (Sc[:, i].sum() + Cc[:, i].sum()) / max(Cc[:, i].sum(), 1.0) * fac
        if sc > best_c:
            best, best_c = f.label, sc
    export = _export(fastest, plan, prompts[odd], We, e2, out) if fastest is not None else {}
    shapes = {name: f.shape for f in plan.families for name in f.names()}
    heldout_speedup = {name: _scaled(e, tc.plain / tc.iteration(shapes[name])) for name, e in heldout.items()
                       if name in shapes}
    edge = (_universe_edge(fastest, plan.universe, len(static), read_manifest(out)["models"]["target"]["vocab_size"])
            if fastest is not None else ())
    return TreeChoice(choose_prompts=int(even.sum()), evaluate_prompts=int(odd.sum()), positions=(pos_c, pos_e),
                      static=static, fastest=fastest, sequoia=seq, acceptance=acc, sequoia_source=source, eagle2=e2,
                      eagle2_speedup=e2s, best_eagle2=best, export=export, heldout=heldout, versus=versus,
                      heldout_speedup=heldout_speedup, edge=edge)


def _scaled(e: Estimate, factor: float) -> Estimate:
    """``e`` times a positive constant (its interval with it)."""
    return Estimate(e.value * factor, e.lo * factor, e.hi * factor, e.positions, e.prompts)


def _universe_edge(chosen: StaticShape, universe: TreeShape, largest: int, vocab: int | None = None) -> tuple:
    """Where a shape chosen inside ``universe`` touches its edge (:attr:`TreeChoice.edge`); a node of rank
    ``vocab - 1`` is not at the edge (the vocabulary has no larger rank)."""
    paths = chosen.paths
    width: dict = {}
    for p in universe.paths[1:]:
        width[p[:-1]] = max(width.get(p[:-1], 0), p[-1] + 1)
    out = []
    if chosen.n >= largest:
        out.append("size")
    if max(len(p) for p in paths) >= universe.max_depth:
        out.append("depth")
    if any(p[-1] + 1 >= width.get(p[:-1], 0) and (vocab is None or p[-1] + 1 < vocab) for p in paths):
        out.append("rank")
    return tuple(out)


def _export(chosen: StaticShape, plan: TreePlan, eval_prompts: np.ndarray, We: np.ndarray, e2: dict, out) -> dict:
    """The chosen shape as ``medusa_choices`` and as SGLang's EAGLE-2 parameters, with EAGLE-2's value there."""
    shape = chosen.shape
    steps = shape.max_depth
    topk = max(len(shape.children(i)) for i in range(shape.n + 1))
    tokens = min(shape.n + 1, 1 + topk + (steps - 1) * topk * topk)
    params = Eagle2Params(steps, topk, tokens)
    label = f"eagle2:{steps},{topk},{tokens}"
    value = e2.get(label)
    how = "a profiled family" if value is not None else None
    if value is None and plan.universe is not None:
        pr, P, Q = _universe_positions(out, plan, eval_prompts)
        vals = [eagle2_from_universe(params, plan.universe, plan.index, P[m], Q[m]) for m in range(len(pr))]
        if vals and all(v is not None for v in vals):
            rows = np.searchsorted(eval_prompts, pr)
            E, Cn = np.zeros(len(eval_prompts)), np.zeros(len(eval_prompts))
            np.add.at(E, rows, np.array(vals) + 1.0)
            np.add.at(Cn, rows, 1.0)
            # EAGLE-2's tree of ``steps`` levels: E[tau] + 1 in [1, steps + 1]
            value, how = _ratio_estimate(E, Cn, We, len(vals), lower=1.0, upper=steps + 1.0), "the recorded universe"
    closest = None
    if e2:
        def dist(name):
            d, k, t = (int(x) for x in name.split(":")[1].split(","))
            return (abs(t - tokens), abs(d - steps), abs(k - topk), name)

        closest = min(e2, key=dist)
    return {"medusa_choices": chosen.medusa_choices,
            "sglang": {"speculative_num_steps": steps, "speculative_eagle_topk": topk,
                       "speculative_num_draft_tokens": tokens},
            "sglang_tokens_per_call": value, "sglang_source": how, "closest_eagle2": closest,
            "closest_eagle2_tokens_per_call": e2.get(closest) if closest else None}


@dataclass(frozen=True)
class TreeBoundSummary:
    r"""A sampled-tree family's verifier beside the upper bound on every lossless verifier, on the same positions.

    .. math::

        \text{share} = \frac{\sum_{\text{positions}} \mathbb E[\tau \mid T]}{\sum_{\text{positions}} \hat B}, \qquad
        \text{gap} = \overline{\hat B} - \overline{\mathbb E[\tau \mid T]},

    over the positions where the bound :math:`\hat B \ge \mathrm{OPT}_c \ge \mathbb E[\tau]` was computed
    (:func:`otspec.tree.bound`; docs/theory/trees.rst), every estimate a ratio of sums over prompts with the
    summary's bootstrap intervals. :math:`\hat B` bounds the mean over the drawn trees, so the share estimates a
    lower bound on the share of the best possible value that the verifier reaches; on one drawn tree
    :math:`\mathbb E[\tau \mid T]` may exceed :math:`\hat B`.

    Attributes
    ----------
    family, verifier, process : str
        The family's label, the verifier's name and the draft process (``"iid"``, ``"wor"``).
    value : Estimate
        Mean :math:`\mathbb E[\tau \mid T]`, accepted draft tokens per call (as the ``kind="tree"`` rows).
    bound : Estimate
        Mean :math:`\hat B`.
    gap : Estimate
        ``bound - value``.
    share : Estimate
        ``value / bound`` (ratio of sums).
    remainder : float
        Mean of what the budget left open (:attr:`otspec.tree.TreeBound.remainder`): with exact :math:`\pi`,
        the true bound lies within it below ``bound``.
    pi_exact : bool
        :math:`\pi` exact at every position (else an upper bound on it was used somewhere: the bound is still an
        upper bound, the share a lower bound on the true share).
    budget : int
        Most prefixes expanded per family and position.
    expanded : float
        Mean prefixes expanded (below ``budget`` where the context has fewer children with
        :math:`\min(Q, \pi) > 0`).
    positions : int
    """

    family: str
    verifier: str
    process: str
    value: Estimate
    bound: Estimate
    gap: Estimate
    share: Estimate
    remainder: float
    pi_exact: bool
    budget: int
    expanded: float
    positions: int


def _bound_estimates(SE: np.ndarray, SB: np.ndarray, n: np.ndarray, W: np.ndarray, depth: int,
                     lossless: bool) -> dict:
    r"""The value, bound, gap and share of :class:`TreeBoundSummary` from per-prompt sums of
    :math:`\mathbb E[\tau \mid T]` (``SE``) and :math:`\hat B` (``SB``) over ``n`` positions each.

    Their ranges (:func:`_interval`): :math:`\mathbb E[\tau \mid T]` in ``[0, depth]`` at each position (at most
    one node per depth accepted); :math:`\hat B \ge 0`; for a lossless verifier, at each position
    :math:`\hat B \ge \mathrm{OPT}_c \ge \mathbb E[\tau]`, the mean over the drawn trees
    (:func:`otspec.tree.bound`), so the parameters (means over the positions and the trees) of the gap and the
    share lie in ``[0, inf)`` and ``[0, 1]``, though one drawn tree's :math:`\mathbb E[\tau \mid T]` may exceed
    :math:`\hat B` (the estimates may leave the range; their intervals do not). A lossy verifier's gap and share
    have no such range.
    """
    pos, np_ = int(n.sum()), _prompts(n)
    rng = {"value": (0.0, float(depth)), "bound": (0.0, np.inf), "gap": (0.0 if lossless else -np.inf, np.inf),
           "share": (0.0, 1.0 if lossless else np.inf)}
    est = {}
    for key, (num, den) in {"value": (SE, n), "bound": (SB, n), "gap": (SB - SE, n), "share": (SE, SB)}.items():
        p, r = _boot(num[:, None], den[:, None], W)
        est[key] = _interval(p[0], r[:, 0], pos, np_, difference=key == "gap", lower=rng[key][0], upper=rng[key][1])
    return est


def _bound_summary(out, settings: dict, plan: TreePlan, prompts: np.ndarray, W: np.ndarray) -> dict:
    """``name -> TreeBoundSummary`` of every sampled family's verifier, on the positions with a bound row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    budget = int(settings.get("bound_budget") or 0)
    fams = {f.label: f for f in plan.sampled}
    if not budget or not fams:
        return {}
    at = {}  # (prompt, pos, label) -> [value, remainder, pi_exact, n_expanded]
    taus = []
    for t in iter_shards(out):
        t = t.filter(pc.is_in(t["kind"], value_set=pa.array(["tree", BOUND_KIND])))
        for kind, pr, pos, name, j, v in zip(*(t[c].to_pylist() for c in ("kind", "prompt", "pos", "name", "j",
                                                                             "value"))):
            if kind == BOUND_KIND:
                at.setdefault((pr, pos, name), [None] * len(BOUND_FIELDS))[j - 1] = v
            else:
                taus.append((pr, pos, name, v))
    row = {int(p): i for i, p in enumerate(prompts.tolist())}
    names = [(f, v, f"{f.label}/{v}") for f in fams.values() for v in f.verifiers]
    col = {name: i for i, (_, _, name) in enumerate(names)}
    N, K = len(prompts), len(names)
    SE, SB, SR, SX, C = (np.zeros((N, K)) for _ in range(5))
    exact = np.ones(K, dtype=bool)
    for pr, pos, name, v in taus:
        i = col.get(name)
        if i is None:
            continue
        got = at.get((pr, pos, names[i][0].label))
        if got is None:  # not a subsampled position
            continue
        r = row[pr]
        SE[r, i] += v
        SB[r, i] += got[0]
        SR[r, i] += got[1]
        SX[r, i] += got[3]
        C[r, i] += 1.0
        exact[i] &= got[2] == 1.0
    out_: dict = {}
    for i, (f, v, name) in enumerate(names):
        n = C[:, i]
        if not n.sum():
            continue
        pos = int(n.sum())
        est = _bound_estimates(SE[:, i], SB[:, i], n, W, f.depth, get_verifier(v).lossless)
        out_[name] = TreeBoundSummary(family=f.label, verifier=v, process=f.process, remainder=float(SR[:, i].sum() / pos),
                                      pi_exact=bool(exact[i]), budget=budget, expanded=float(SX[:, i].sum() / pos),
                                      positions=pos, **est)
    return out_
