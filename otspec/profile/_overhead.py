r"""The decoder's own work outside the forward passes, measured on a few real iterations of every scheme.

A speed-up predicted from the forward passes alone is what an engine whose
verification is fused into its forward pass could reach; otspec's own
decoder also spends time outside them every iteration (the laws, the
verification, the draws, the cache cuts). The profile's first shard decodes
a few iterations of every scheme family with
:func:`otspec.decoding.speculative_decode` on the run's first prompt, with
each model call timed as it is made (:class:`TimedLM`: the device
synchronised before and after, :class:`otspec._timing.Stopwatch`), and
records per iteration

.. math::

    s(f, k, L) = \frac{(T_{I} - T_{1}) - e - F_{\text{residual}}}{I - 1}, \qquad
    r(f) = \frac{F_{\text{residual}}}{\#\text{residual calls}},

in the decoder's steady state: :math:`T_i` the clock at the start of the
target's first call of iteration :math:`i` (:attr:`otspec._timing.Stopwatch.starts`),
so that the span holds iterations :math:`1, \dots, I - 1` whole and no
setting up, no draft prefill and no last iteration's bookkeeping (the
decoder's last iterations draft only the tokens left before
``max_new_tokens``: :math:`I` is then the last iteration before the first
that drafts fewer than ``L``, so that the span holds whole iterations of
``L`` drafts only; ``max_new_tokens = 3 (L + 1)`` leaves at least three);
:math:`e` the first call's excess over a typical call (the prompt's
prefill); :math:`F_{\text{residual}}` the seconds of the target calls after
the first of an iteration inside the span (the residual calls of Sun et
al.'s block verification, arXiv:2403.10444 v1, Algorithm 2); the seconds of
the model calls inside the span apart (the share outside them). Plain
decoding's seconds per token are measured the same way on
:func:`otspec.decoding.autoregressive_decode` (every call an iteration).
Each timed decode follows an untimed decode of the same configuration (in
the first round as long as the timed one, so that every call shape and
cache length the configuration makes has been met once: on an H100 the
first round's steps cost up to five times the later ones after a
one-iteration warm-up; later, of one iteration), so that the caches and the allocator's free blocks are the
decoder's own, as in a server that runs one scheme, not the previous
configuration's (a 12-token plain decode measured 20 % dearer right after a
chain's decode than after a plain one). The summary takes the
decoder's work beyond the calibrated forward passes,
:math:`o(f, k, L) = s(f, k, L) - t(k, L)`, so that prediction (a) at a timed
configuration is the measured time of a whole step, as engines rank their
settings (SGLang's ``bench_speculative.py``); the forward passes the decoder
makes can cost more than the calibration's (on a CPU, its own work evicts
the weights from the caches), and that difference is the decoder's too.

The configurations timed per family are every ``L`` at ``k = 1`` (what the
recommendations pick on every pair profiled so far) and ``(K, L_max)``,
``K`` the largest ``k`` the family supports: every single-draft
configuration the report can recommend rests on its own measurement. The
summary takes the measured value at a timed configuration and, at the
others (``1 < k``, ``L < L_max``), the least-squares line
:math:`o = a + b\, k (2 L + 1)` through the family's timed points (the
decoder's work per iteration grows with the laws it handles, ``k L`` draft
rows and ``k (L + 1)`` target rows), with the fit's root-mean-square
residual over those points recorded beside it
(:attr:`otspec.profile.Costs.overhead_fit`). Timing only ``(1, 1)`` and
``(K, L_max)`` and interpolating between them once predicted
``block-onestep`` ``(1, 2)`` 27 % off on SmolLM2 (the line through two noisy
points magnifies their noise onto the points between them).

Those are the configurations the calibration *may* decode; it decodes what the recommendation needs, within the
run's budget of seconds (``calibration_s``): a sequential ("racing") calibration, :func:`overhead_rows`. On the
SmolLM2 pair (2-core CPU, ``k_max = L_max = 4``, default families) the full calibration -- every configuration
decoded 3 times, each after an untimed decode -- took 226 s at a load of 1.3 (cProfile: 96 % in the decodes, k-Seq
and multi-round at ``(2, 4)`` and ``(1, 4)`` the dearest; 4 % in the 84 calls of the call shapes); round 1 decodes
each configuration once, by priority, skips those whose forward passes alone cannot contend, and the later rounds
time the contenders only.
"""

from __future__ import annotations

import numpy as np

from .._registry import get_verifier
from .._timing import Stopwatch, now
from ..decoding._loop import autoregressive_decode, speculative_decode

__all__ = ["TimedLM", "CalibrationBudget", "decode_args", "overhead_configs", "overhead_rows", "walk_tokens",
           "contenders", "OVERHEAD_REPEATS", "OVERHEAD_ITERATIONS", "OVERHEAD_MAX_K", "UNTIMED_ABOVE",
           "CONTENDER_MARGIN", "UNTIMED", "BUDGET_ROW", "SPENT_ROW"]

#: Timed decodes of every configuration (the summary keeps the median), each after an untimed one-iteration decode
#: of the same configuration.
OVERHEAD_REPEATS = 3
#: Largest ``k`` decoded (the fit extends to the larger ``k`` of the run): at a real vocabulary some verifiers'
#: decoders need memory that grows fast with ``k`` (the optimal verifier at ``V = 49,152`` and ``k = 4`` held
#: 22 GB), and the calibration must not be what a run fails on.
OVERHEAD_MAX_K = 2
#: Families whose decoder is not timed above a vocabulary size, with the reason: k-Khisti's decoder solves a
#: selection LP whose matrix grows as V squared (at V = 49,152 and k = 1 it held 23 GB and the run was killed).
UNTIMED_ABOVE = {"khisti": (4096, "its selection LP grows as the vocabulary squared")}
#: A configuration is a contender -- timed :data:`OVERHEAD_REPEATS` times -- when its prediction (a) after one timing
#: is at least ``1 - CONTENDER_MARGIN`` times the best lossless configuration's (the runner-up always is one).
CONTENDER_MARGIN = 0.10
#: Name prefix of the rows recording a configuration the calibration did not time, ``value`` the reason's code.
UNTIMED_PREFIX = "untimed:"
#: Reasons a configuration was not timed: the calibration's budget ran out before it, or its prediction (b) -- the
#: forward passes alone, which the decoder's own work only lowers -- lies below ``1 - CONTENDER_MARGIN`` times the
#: best prediction (a) measured (it cannot be a contender; its decoder's work is read off its family's line).
UNTIMED = {1.0: "budget", 2.0: "bound"}
#: Names of the rows recording the calibration's budget and the seconds it took (``k = m = 0``).
BUDGET_ROW, SPENT_ROW = "calibration:budget", "calibration:seconds"
#: Wall seconds of a decode over its forward passes' estimate assumed before any decode was timed.
FIRST_RATIO = 2.0
#: Iterations of each timed decode (at least; ``max_new_tokens = OVERHEAD_ITERATIONS (L + 1)``; plain decoding:
#: ``OVERHEAD_ITERATIONS (L_max + 1)`` tokens, as long as the longest, so that its setting up weighs alike).
OVERHEAD_ITERATIONS = 3


class TimedLM:
    """A language model whose calls (``logits``, ``tree_logits``) are timed, each as one synchronised section.

    Every other attribute is the wrapped model's. ``laps`` holds every call's seconds in order, ``seconds``
    their sum.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding import CallableLM
    >>> lm = TimedLM(CallableLM(lambda ids: torch.zeros(ids.shape + (5,)), vocab_size=5))
    >>> _ = lm.logits(lm.new_state(), torch.zeros((1, 2), dtype=torch.long))
    >>> len(lm.laps), lm.vocab_size
    (1, 5)
    """

    def __init__(self, lm):
        self.lm = lm
        self.watch = Stopwatch(lm.device)

    @property
    def laps(self) -> list:
        return self.watch.laps

    @property
    def seconds(self) -> float:
        return self.watch.seconds

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    @property
    def device(self):
        return self.lm.device

    def new_state(self, *args, **kwargs):
        return self.lm.new_state(*args, **kwargs)

    def select(self, *args, **kwargs):
        return self.lm.select(*args, **kwargs)

    def logits(self, *args, **kwargs):
        with self.watch:
            return self.lm.logits(*args, **kwargs)

    def tree_logits(self, *args, **kwargs):
        with self.watch:
            return self.lm.tree_logits(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.lm, name)


def overhead_configs(settings) -> list[tuple]:
    """The configurations decoded by :func:`overhead_rows`: ``(family, k, L)`` at ``k = 1`` and every ``L`` up to
    ``L_max`` (only ``L = 1`` for a lossy family, which is never recommended), and at ``(K, L_max)``, of every
    profiled family (``K`` the largest ``k`` it supports, at most
    :data:`OVERHEAD_MAX_K`; once when they coincide), then ``(tree name, n,
    depth)`` of every tree family of the run (each verifier of a sampled family; a deterministic family once)."""
    out = []
    for name in settings.families:
        ks = settings.ks(name)
        # a lossy family is never recommended: its two ends suffice for the fitted line its predictions use
        Ls = range(1, settings.L_max + 1) if get_verifier(name).lossless else (1,)
        for k, L in [(1, L) for L in Ls] + [(min(max(ks), OVERHEAD_MAX_K), settings.L_max)]:
            if (name, k, L) not in out:
                out.append((name, k, L))
    plan = getattr(settings, "tree_plan", None)
    for f in plan.families if plan is not None else ():
        for name in f.names():
            out.append((name, f.n, f.depth))
    return out


def decode_args(settings, scheme) -> dict:
    """``speculative_decode``'s keyword arguments for ``scheme`` -- ``(family, k, L)`` or a tree family's name of
    ``settings.tree_plan`` -- with the profile's sampling (``max_new_tokens`` and ``rng`` left to the caller)."""
    s = settings
    out = dict(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, top_p_rule=s.top_p_rule)
    if isinstance(scheme, str):
        f = s.tree_plan.family_of(scheme)
        return {**out, "tree": f.shape, "process": f.process,
                "verifier": f.verifiers[f.names().index(scheme)] if f.verifiers else "target-only"}
    name, k, L = scheme
    return {**out, "verifier": name, "k": k, "L": L, "verifier_options": s.options(name) or None}


def _steady(starts: list, laps: list, firsts, extra: float = 0.0) -> tuple[float, int]:
    """Seconds and count of the iterations from the start of the first of ``firsts`` to the start of the last
    (indices into a timed model's ``starts`` and ``laps``: the first call of each iteration), less the first
    call's excess over the typical call (the prompt's prefill) and ``extra`` seconds (timed work inside the
    span that is not the step's: residual calls); ``(nan, 0)`` with fewer than two iterations."""
    firsts = list(firsts)
    n = len(firsts) - 1
    if n < 1:
        return float("nan"), 0
    typical = float(np.median([laps[i] for i in firsts[1:]]))
    excess = laps[firsts[0]] - typical
    return starts[firsts[-1]] - starts[firsts[0]] - excess - extra, n


def _decode_once(draft, target, prompt, settings, name, k, L, seed, iterations: int = OVERHEAD_ITERATIONS):
    """One timed decode: ``(step, forward, iterations, residual seconds, residual calls)``, the step in the decode's
    steady state: from the start of its first target call to the start of its last (the iterations between
    them: no setting up, no draft prefill, no last iteration's bookkeeping), the first call's excess over a
    typical call (the prompt's prefill) taken out, and the residual calls left out; ``forward`` the seconds of
    the model calls inside that span (the same excess out)."""
    d, t = TimedLM(draft), TimedLM(target)
    s = settings
    if name == "plain":
        autoregressive_decode(t, prompt, max_new_tokens=iterations * (s.L_max + 1) + 1, temperature=s.temperature,
                              top_k=s.top_k, top_p=s.top_p, top_p_rule=s.top_p_rule, rng=seed)
        step, n = _steady(t.watch.starts, t.laps, range(len(t.laps)))
        fwd = sum(t.laps[:-1]) - (t.laps[0] - float(np.median(t.laps[1:]))) if n else float("nan")
        return step, fwd, n, 0.0, 0
    plan = getattr(s, "tree_plan", None)
    tree = plan is not None and name in {n for f in plan.families for n in f.names()}
    how = decode_args(s, name if tree else (name, k, L))
    res = speculative_decode(prompt, draft=d, target=t, rng=seed, max_new_tokens=iterations * (L + 1), **how)
    calls = np.asarray(res.target_calls, dtype=np.int64)
    if int(calls.sum()) != len(t.laps):  # pragma: no cover - every decoder's target calls are counted
        raise RuntimeError("the decoder's target calls do not match the timed ones")
    at = np.concatenate([[0], np.cumsum(calls)[:-1]]).astype(int)  # each iteration's first (scoring) call
    extra = [[t.laps[i] for i in range(a + 1, a + c)] for a, c in zip(at, calls)]  # residual calls
    res_n = sum(len(e) for e in extra)  # every residual call timed, in the span or not
    res_s = float(sum(sum(e) for e in extra))
    # the span ends at the scoring call of the last iteration before the first that drafted fewer than L (the
    # decoder's last iterations draft only what is left, speculative_decode): it holds whole iterations of the
    # configuration's L only, their drafts included (those of an iteration come before its scoring call)
    short = np.flatnonzero(np.asarray(res.draft_lengths) < res.L)
    at = at[: int(short[0])] if short.size else at
    step, n = _steady(t.watch.starts, t.laps, at, extra=float(sum(sum(e) for e in extra[: len(at) - 1])))
    if not n:
        return float("nan"), float("nan"), 0, res_s, res_n
    lo, hi = t.watch.starts[at[0]], t.watch.starts[at[-1]]
    inside = [lap for st, lap in zip(d.watch.starts, d.laps) if lo <= st < hi]
    inside += [t.laps[a] for a in at[:-1]]
    fwd = float(sum(inside)) - (t.laps[at[0]] - float(np.median([t.laps[a] for a in at[1:]])))
    return step, fwd, n, res_s, res_n


class CalibrationBudget:
    """The seconds a cost calibration may take, read on the package's clock (:func:`otspec._timing.now`).

    ``seconds`` None: unbounded. :meth:`fits` says whether work estimated at ``est`` seconds still fits.

    Examples
    --------
    >>> b = CalibrationBudget(None)
    >>> b.fits(1e9), b.spent() >= 0.0
    (True, True)
    """

    def __init__(self, seconds: float | None):
        self.seconds = None if seconds is None else float(seconds)
        self.t0 = now()

    def spent(self) -> float:
        return now() - self.t0

    def fits(self, est: float) -> bool:
        return self.seconds is None or self.spent() + est <= self.seconds


def walk_tokens(cols: dict) -> dict:
    r"""Tokens per target call of every ``(family, k, L)`` on the walked positions of ``cols`` (rows of
    :data:`otspec.profile._collect.COLUMNS`): ``(family, k, L) -> (tokens per call, extra calls per position)``.

    .. math::

        \frac{\sum (E[\tau_L \mid X] + 1)}{\#\text{positions}}, \qquad
        \text{block: } \frac{(L + 1)\, \#\text{positions}}{\sum E[\text{calls}]},\
        e = \frac{\sum E[\text{calls}]}{\#\text{positions}} - 1,

    pooled over the prompts: the point estimates of :func:`otspec.profile.summarize` on these positions.
    """
    sums: dict = {}
    for kind, name, k, j, v in zip(cols["kind"], cols["name"], cols["k"], cols["j"], cols["value"]):
        if kind in ("tau", "calls"):
            a = sums.setdefault((name, int(k), int(j)), [0.0, 0, 0.0])
            if kind == "tau":
                a[0] += v
                a[1] += 1
            else:
                a[2] += v
    out = {}
    for (name, k, L), (tau, n, calls) in sums.items():
        if not n:
            continue
        if name == "block":
            out[(name, k, L)] = ((L + 1) * n / calls, calls / n - 1.0) if calls > 0 else (float("nan"), 0.0)
        else:
            out[(name, k, L)] = ((tau + n) / n, 0.0)
    return out


def contenders(pa: dict, margin: float = CONTENDER_MARGIN) -> set:
    r"""The lossless ``(family, k, L)`` whose prediction (a) could still be the best: at least ``1 - margin`` times
    the best's, and the runner-up whatever its distance (the report shows both).

    .. math::

        \{c : a(c) \ge (1 - \text{margin}) \max_{c'} a(c')\} \cup \{\text{the two fastest}\}

    Examples
    --------
    >>> sorted(contenders({("token", 1, 1): 1.5, ("token", 1, 2): 1.4, ("kseq", 1, 1): 1.0, ("typical", 1, 1): 9.0}))
    [('token', 1, 1), ('token', 1, 2)]
    """
    ok = {key: v for key, v in pa.items() if get_verifier(key[0]).lossless and np.isfinite(v)}
    if not ok:
        return set()
    order = sorted(ok, key=lambda key: (-ok[key], key))
    best = ok[order[0]]
    return set(order[:2]) | {key for key, v in ok.items() if v >= (1.0 - margin) * best}


class _DecodeCosts:
    """Wall seconds of the calibration's decodes: measured, or estimated before a configuration is run from the
    forward passes it makes (the timed call shapes, the walk's tokens per call) times the largest ratio of a
    measured decode's seconds to its own estimate (:data:`FIRST_RATIO` before any)."""

    def __init__(self, settings, cols: dict, tokens: dict):
        self.settings, self.cols, self.tokens = settings, cols, tokens
        self.walls: dict = {}
        self.ratio = None

    def _med(self, key):
        v = [val for kind, n, k, m, val in zip(self.cols["kind"], self.cols["name"], self.cols["k"], self.cols["m"],
                                               self.cols["value"]) if kind == "cost" and (n, int(k), int(m)) == key]
        return float(np.median(v)) if v else None

    def model(self, config) -> float | None:
        """Seconds of the forward passes of one full-length decode of ``config``, or None (shapes not timed)."""
        s, (name, k, L) = self.settings, config
        I = OVERHEAD_ITERATIONS
        if name == "plain":
            t = self._med(("target", 1, 1))
            return None if t is None else (I * (s.L_max + 1) + 1) * t
        plan = getattr(s, "tree_plan", None)
        if plan is not None and name in {n for f in plan.families for n in f.names()}:
            parts = [self._med(("tree-target", 1, k + 1)), self._med(("draft", 1, 1))]
            per = None if None in parts else parts[0] + L * parts[1]
            tpc = 1.0
        else:
            parts = [self._med(("draft", 1, 1)), self._med(("draft", k, 1)), self._med(("target", k, L + 1))]
            per = None if None in parts else parts[0] + (L - 1) * parts[1] + parts[2]
            tpc = self.tokens.get(config, (1.0, 0.0))[0]
            tpc = tpc if np.isfinite(tpc) and tpc >= 1.0 else 1.0
        return None if per is None else (I * (L + 1) / tpc + 1) * per

    def full(self, config) -> float:
        """Seconds of one full-length decode of ``config``: measured, else estimated."""
        if config in self.walls:
            return self.walls[config]
        m = self.model(config)
        if m is None:
            return max(self.walls.values(), default=0.0)
        return (FIRST_RATIO if self.ratio is None else self.ratio) * m

    def pair(self, config, first: bool) -> float:
        """Seconds of a warm-up and a timed decode: in the first round both full length, later the warm-up of one
        iteration."""
        f = self.full(config)
        return f * (2.0 if first else 1.0 + 1.0 / OVERHEAD_ITERATIONS)

    def record(self, config, seconds: float) -> None:
        self.walls[config] = seconds
        m = self.model(config)
        if m:
            self.ratio = max(self.ratio or 0.0, seconds / m)


def overhead_rows(rows, draft, target, prompt: list[int], settings, *, tokens: dict | None = None,
                  budget: CalibrationBudget | None = None, on_round=None, predict=None) -> set:
    r"""Time a few real decoding iterations of the configurations the recommendation needs
    (:func:`overhead_configs`), and of plain decoding.

    A sequential ("racing") calibration. Round 1 times every configuration once (each decode after an untimed
    one of the same configuration, as long as the timed one), in order of priority: plain decoding (the baseline
    every speed-up divides by), the smallest tree family (so that the trees' prediction (a) rests on a timed tree
    decoder before the budget is spent on the chains), each lossless family's configuration of largest prediction
    (b), the other tree families, the other lossless configurations by prediction (b), the lossy ones last (never
    recommended).
    With ``tokens`` (the walk's tokens per call, :func:`walk_tokens`), a lossless configuration other than its
    family's first whose prediction (b) -- the forward passes alone, which the decoder's work only lowers --
    lies below ``1 - CONTENDER_MARGIN`` times the best prediction (a) measured so far is not decoded (its
    decoder's work is read off its family's line). The later rounds, up to :data:`OVERHEAD_REPEATS` timings,
    time the contenders only (each decode after an untimed one of one iteration): plain decoding, the tree
    families, and the timed configurations behind every lossless ``(family, k, L)`` of :func:`contenders`
    (from the round-1 predictions (a) of the summary's own speed-up model: itself when timed, else its family's
    timed configurations, whose line gives it). Without ``tokens`` every configuration is a contender.

    Every decode runs only if the seconds spent (``budget``, the whole calibration's) and its estimate
    (:class:`_DecodeCosts`: its measured seconds, or its forward passes' estimate scaled by the decodes measured
    so far) fit the budget; a configuration not decoded is recorded (``name="untimed:<family>"``, ``value`` the
    reason's code in :data:`UNTIMED`), a contender cut short keeps the repetitions it got (the summary widens
    its intervals).

    Appends, for every repetition ``j``, rows ``kind="cost"``, all per iteration (per token for plain decoding),
    the prompt's prefill counted as a typical call and the residual calls left out: ``name="step:<family>"``
    (``k``, ``m = L``; a tree family: ``k = n`` its nodes, ``m`` its depth; ``"step:plain"``: ``k = m = 1``) the
    seconds of the whole step; ``name="forward:<family>"`` the seconds of its model calls, timed as the decoder
    makes them; ``name="residual:<family>"`` the seconds of one residual target call (block verification; only
    when there were some). A configuration the decoder refuses (a ``ValueError``: e.g. an LP over too many draft
    multisets at this vocabulary), or a family of :data:`UNTIMED_ABOVE` above its vocabulary size, gets no rows:
    the summary makes no prediction (a) for it; nor for the tree families when none of them was timed (their
    decoder's work is read off the timed tree families only).

    ``on_round(rep, keys)`` (optional) runs before each later round ``rep`` (1, 2, ...) with the contenders'
    ``(family, k, L)`` (None: every one), e.g. to time their call shapes again. ``predict(cols, settings, tokens)``
    gives predictions (a) and (b) from the calibration's rows so far
    (:func:`otspec.profile._summary.calibration_predictions`, passed in by the caller: the summary reads this
    module's rows); without it, or without ``tokens``, every configuration is a contender. Returns the contenders'
    keys (None: every configuration).
    """
    seed = int(settings.seed)
    V = int(target.vocab_size)
    budget = CalibrationBudget(None) if budget is None else budget
    configs = [c for c in [("plain", 1, 1)] + overhead_configs(settings)  # a family of UNTIMED_ABOVE above its
               if not (c[0] in UNTIMED_ABOVE and V > UNTIMED_ABOVE[c[0]][0])]  # vocabulary size left out
    plan = getattr(settings, "tree_plan", None)
    trees = {n for f in plan.families for n in f.names()} if plan is not None else set()
    cols = getattr(rows, "cols", None) or {c: [] for c in ("kind", "name", "k", "m", "value")}
    tokens = dict(tokens or {})
    cost = _DecodeCosts(settings, cols, tokens)
    ranked = bool(tokens) and predict is not None

    def predictions():
        return predict(cols, settings, tokens) if ranked else ({}, {})

    def run(c, rep: int) -> str:
        name, k, L = c
        if not budget.fits(cost.pair(c, rep == 0)):
            return "budget"
        # an untimed decode of the same configuration first: the decoder warm (its caches and the allocator's
        # free blocks its own, as in a server running one scheme), in the first round as long as the timed one
        # (every call shape and cache length of the configuration met once: on an H100 the first round's steps
        # cost up to 5x the later ones after a one-iteration warm-up), then of one iteration; the
        # configurations the decoder refuses at this vocabulary (a ValueError) found and left out
        try:
            _decode_once(draft, target, prompt, settings, name, k, L, seed + rep,
                         iterations=OVERHEAD_ITERATIONS if rep == 0 else 1)
        except ValueError:
            return "refused"
        t0 = now()
        step, fwd, iters, res_s, res_n = _decode_once(draft, target, prompt, settings, name, k, L, seed + rep)
        cost.record(c, now() - t0)
        if res_n:
            rows.add(-1, "cost", f"residual:{name}", k, [res_s / res_n], m=L, j0=rep + 1)
        if iters:  # a decode of one iteration (an end-of-sequence token): no step timed
            rows.add(-1, "cost", f"step:{name}", k, [step / iters], m=L, j0=rep + 1)
            rows.add(-1, "cost", f"forward:{name}", k, [fwd / iters], m=L, j0=rep + 1)
        return "timed"

    def untimed(c, why: str) -> None:
        code = next(v for v, w in UNTIMED.items() if w == why)
        rows.add(-1, "cost", f"{UNTIMED_PREFIX}{c[0]}", c[1], [code], m=c[2])

    # round 1, by priority
    pa, pb = predictions()
    chains = [c for c in configs[1:] if c[0] not in trees]
    lossless = [c for c in chains if get_verifier(c[0]).lossless]

    def b_of(c):
        return pb.get(c, float("inf"))

    firsts = {}
    for c in lossless:
        if c[0] not in firsts or b_of(c) > b_of(firsts[c[0]]):
            firsts[c[0]] = c
    head = sorted(firsts.values(), key=lambda c: -b_of(c))
    rest = sorted([c for c in lossless if c not in head], key=lambda c: -b_of(c))
    # the smallest tree family right after the baseline: the trees' prediction (a) rests on a timed tree decoder
    # (the others' work is interpolated in the nodes from it) before any chain family's budget is spent
    tree_cs = sorted((c for c in configs if c[0] in trees), key=lambda c: (c[1], c[2]))
    order = [configs[0], *tree_cs[:1], *head, *tree_cs[1:], *rest, *[c for c in chains if c not in lossless]]
    timed = []
    for c in order:
        if timed[:1] != [configs[0]] and c != configs[0]:  # no baseline, no speed-up: nothing else is decoded
            untimed(c, "budget")
            continue
        if ranked and c in rest and c in pb:
            pa, _ = predictions()
            best = max((v for key, v in pa.items() if key in timed and get_verifier(key[0]).lossless
                        and np.isfinite(v)), default=float("nan"))  # measured, not read off a line
            if np.isfinite(best) and pb[c] < (1.0 - CONTENDER_MARGIN) * best:
                untimed(c, "bound")
                continue
        got = run(c, 0)
        if got == "timed":
            timed.append(c)
        elif got == "budget":
            untimed(c, "budget")
    # later rounds: the contenders only
    keys = None
    again = list(timed)
    if ranked:
        pa, _ = predictions()
        keys = contenders(pa)
        known = {key[0] for key in tokens}
        fitted = {key[0] for key in keys if key not in timed}  # read off their family's line: all its points
        again = [c for c in timed if c[0] == "plain" or c[0] in trees or c in keys or c[0] in fitted
                 or c[0] not in known]
        keys = keys | {(c[0], k, L) for c in again if c[0] not in known and c[0] not in trees and c[0] != "plain"
                       for k in settings.ks(c[0]) for L in range(1, settings.L_max + 1)}
    others = [c for c in again if c != configs[0]]
    for rep in range(1, OVERHEAD_REPEATS):
        if on_round is not None:
            on_round(rep, keys)
        shift = rep % len(others) if others else 0  # the baseline first, the others' order rotated
        if configs[0] in again and run(configs[0], rep) == "budget":
            break  # no configuration timed more often than the baseline every speed-up divides by
        for c in others[shift:] + others[:shift]:
            run(c, rep)
    return keys
