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

    s(f, k, L) = \frac{W - F_{\text{residual}}}{I}, \qquad
    r(f) = \frac{F_{\text{residual}}}{\#\text{residual calls}},

with :math:`W` the seconds of the whole call (setting up included, as a
caller of the decoder pays them; the prompt's prefill counted as a typical
call), :math:`I` its iterations and :math:`F_{\text{residual}}` the seconds
of the target calls after the first of an iteration (the residual calls of
Sun et al.'s block verification, arXiv:2403.10444 v1, Algorithm 2), and the
seconds of its model calls apart (the share outside them). Plain decoding's
seconds per token are measured the same way on
:func:`otspec.decoding.autoregressive_decode`. The summary takes the
decoder's work beyond the calibrated forward passes,
:math:`o(f, k, L) = s(f, k, L) - t(k, L)`, so that prediction (a) at a timed
configuration is the measured time of a whole step, as engines rank their
settings (SGLang's ``bench_speculative.py``); the forward passes the decoder
makes can cost more than the calibration's (on a CPU, its own work evicts
the weights from the caches), and that difference is the decoder's too.

The configurations timed per family are ``(1, 1)`` and ``(K, L_max)``, ``K``
the largest ``k`` the family supports; the summary fits
:math:`o = a + b\, k (2 L + 1)` through them (exact at the timed points):
the decoder's work per iteration grows with the laws it handles, ``k L``
draft rows and ``k (L + 1)`` target rows.
"""

from __future__ import annotations

import numpy as np

from .._timing import Stopwatch
from ..decoding._loop import autoregressive_decode, speculative_decode

__all__ = ["TimedLM", "decode_args", "overhead_configs", "overhead_rows", "OVERHEAD_REPEATS", "OVERHEAD_ITERATIONS",
           "OVERHEAD_MAX_K", "UNTIMED_ABOVE"]

#: Timed decodes of every configuration (the summary keeps the median), after one untimed warm-up decode per run.
OVERHEAD_REPEATS = 3
#: Largest ``k`` decoded (the fit extends to the larger ``k`` of the run): at a real vocabulary some verifiers'
#: decoders need memory that grows fast with ``k`` (the optimal verifier at ``V = 49,152`` and ``k = 4`` held
#: 22 GB), and the calibration must not be what a run fails on.
OVERHEAD_MAX_K = 2
#: Families whose decoder is not timed above a vocabulary size, with the reason: k-Khisti's decoder solves a
#: selection LP whose matrix grows as V squared (at V = 49,152 and k = 1 it held 23 GB and the run was killed).
UNTIMED_ABOVE = {"khisti": (4096, "its selection LP grows as the vocabulary squared")}
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
    """The configurations decoded by :func:`overhead_rows`: ``(family, k, L)`` at ``(1, 1)`` and ``(K, L_max)`` of
    every profiled family (``K`` the largest ``k`` it supports, at most :data:`OVERHEAD_MAX_K`; one when they
    coincide), then ``(tree name, n,
    depth)`` of every tree family of the run (each verifier of a sampled family; a deterministic family once)."""
    out = []
    for name in settings.families:
        ks = settings.ks(name)
        for k, L in ((1, 1), (min(max(ks), OVERHEAD_MAX_K), settings.L_max)):
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


def _prefill_excess(laps: list) -> float:
    """Seconds by which a model's first call of a decode (the prompt's prefill) exceeds its typical call."""
    return laps[0] - float(np.median(laps[1:])) if len(laps) > 1 else 0.0


def _decode_once(draft, target, prompt, settings, name, k, L, seed, iterations: int = OVERHEAD_ITERATIONS):
    """One timed decode: ``(step, forward, iterations, residual seconds, residual calls)``, the seconds of the
    whole call and of its model calls less the prompt's prefill (each model's first call counted as a typical
    one) and less the residual calls."""
    d, t = TimedLM(draft), TimedLM(target)
    s = settings
    whole = Stopwatch(target.device)
    if name == "plain":
        with whole:
            res = autoregressive_decode(t, prompt, max_new_tokens=iterations * (s.L_max + 1),
                                        temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                        top_p_rule=s.top_p_rule, rng=seed)
        excess = _prefill_excess(t.laps)
        return whole.seconds - excess, t.seconds - excess, int(res.target_calls), 0.0, 0
    plan = getattr(s, "tree_plan", None)
    tree = plan is not None and name in {n for f in plan.families for n in f.names()}
    how = decode_args(s, name if tree else (name, k, L))
    with whole:
        res = speculative_decode(prompt, draft=d, target=t, rng=seed, max_new_tokens=iterations * (L + 1),
                                 **how)
    calls = np.asarray(res.target_calls, dtype=np.int64)
    res_s, res_n, scoring = 0.0, 0, t.laps
    if int(calls.sum()) == len(t.laps):  # the target's calls in order: the scoring call first in each iteration
        at = np.concatenate([[0], np.cumsum(calls)[:-1]])
        extra = [t.laps[i] for a, c in zip(at, calls) for i in range(a + 1, a + c)]
        scoring = [t.laps[a] for a in at]
        res_s, res_n = float(sum(extra)), len(extra)
    excess = _prefill_excess(d.laps) + _prefill_excess(scoring)
    return (whole.seconds - excess - res_s, d.seconds + t.seconds - excess - res_s, res.iterations, res_s,
            res_n)


def overhead_rows(rows, draft, target, prompt: list[int], settings) -> None:
    r"""Time a few real decoding iterations of every family (:func:`overhead_configs`) and of plain decoding.

    Appends, for every repetition ``j`` (interleaved: every configuration once per round), rows
    ``kind="cost"``, all per iteration (per token for plain decoding), the prompt's prefill counted as a
    typical call and the residual calls left out: ``name="step:<family>"`` (``k``, ``m = L``; a tree family:
    ``k = n`` its nodes, ``m`` its depth; ``"step:plain"``: ``k = m = 1``) the seconds of the whole step;
    ``name="forward:<family>"`` the seconds of its model calls, timed as the decoder makes them;
    ``name="residual:<family>"`` the seconds of one residual target call (block verification; only when
    there were some). A configuration the decoder refuses (a ``ValueError``: e.g. an LP over too many draft
    multisets at this vocabulary), or a family of :data:`UNTIMED_ABOVE` above its vocabulary size, gets no rows:
    the summary makes no prediction (a) for it.
    """
    seed = int(settings.seed)
    configs = []
    V = int(target.vocab_size)
    for c in [("plain", 1, 1)] + overhead_configs(settings):  # one untimed decode each: warm-up, and the ones the
        if c[0] in UNTIMED_ABOVE and V > UNTIMED_ABOVE[c[0]][0]:  # decoder refuses at this vocabulary left out
            continue
        try:
            _decode_once(draft, target, prompt, settings, *c, seed, iterations=1)
        except ValueError:
            continue
        configs.append(c)
    for rep in range(OVERHEAD_REPEATS):
        shift = rep % len(configs)
        for name, k, L in configs[shift:] + configs[:shift]:
            step, fwd, iters, res_s, res_n = _decode_once(draft, target, prompt, settings, name, k, L, seed + rep)
            iters = max(int(iters), 1)
            rows.add(-1, "cost", f"step:{name}", k, [step / iters], m=L, j0=rep + 1)
            rows.add(-1, "cost", f"forward:{name}", k, [fwd / iters], m=L, j0=rep + 1)
            if res_n:
                rows.add(-1, "cost", f"residual:{name}", k, [res_s / res_n], m=L, j0=rep + 1)
