r"""A profile's predicted speed-ups checked against real decoding on the same pair, prompts and device.

.. math::

    \widehat S_{\text{measured}}(s) = \operatorname{med}_{r, i}
    \frac{W^{\text{plain}}_{r,i} / n^{\text{plain}}_{r,i}}{W^{s}_{r,i} / n^{s}_{r,i}},

the per-token seconds of :func:`otspec.decoding.autoregressive_decode` over those of
:func:`otspec.decoding.speculative_decode` with scheme ``s`` on prompt ``i`` in round ``r`` (each whole
call, synchronised: :class:`otspec._timing.Stopwatch`; :math:`n` every token the iterations made: the
last iterations of a chain or a tree draft only the tokens left, as transformers' assisted generation
does, so that none is made past ``max_new_tokens``), every contender on the same prompt one after the
other in a rotated order (so that a pair shares the machine's load), each timed decode right after a
short untimed decode of the same contender (its caches and the allocator's free blocks its own, as in a
server that runs one scheme; the profile times its steps the same way: :mod:`otspec.profile._overhead`),
the median over rounds and prompts. Round 0 is a warm-up, run with every model call timed
(:class:`otspec.profile._overhead.TimedLM`) for the share of the decoder's time outside its forward
passes; the counted rounds run the models bare."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._timing import Stopwatch
from ..decoding._loop import autoregressive_decode, speculative_decode
from ._overhead import TimedLM, decode_args

__all__ = ["DecodeCheck", "check_decodes"]


@dataclass(frozen=True)
class DecodeCheck:
    """One scheme decoded for real beside plain decoding.

    Attributes
    ----------
    scheme : tuple or str
        ``(family, k, L)``, or a tree family's name.
    speedup : float
        Median over rounds and prompts of plain decoding's seconds per token over the scheme's.
    rounds : tuple of float
        Every (round, prompt)'s speed-up.
    seconds_per_token, plain_seconds_per_token : float
        Medians over rounds (per token made, see above).
    tokens_per_call : float
        Tokens emitted per target call, over every counted round.
    outside_share : float
        The share of the scheme's decoding time outside its model calls (warm-up round).
    plain_outside_share : float
        The same for plain decoding.
    """

    scheme: object
    speedup: float
    rounds: tuple
    seconds_per_token: float
    plain_seconds_per_token: float
    tokens_per_call: float
    outside_share: float
    plain_outside_share: float


def _decode(draft, target, prompt, settings, scheme, max_new_tokens: int, seed: int):
    whole = Stopwatch(target.device)
    if scheme == "plain":
        s = settings
        with whole:
            r = autoregressive_decode(target, prompt, max_new_tokens=max_new_tokens, temperature=s.temperature,
                                      top_k=s.top_k, top_p=s.top_p, top_p_rule=s.top_p_rule, rng=seed)
        return whole.seconds, int(r.tokens.shape[0]), int(r.target_calls), int(r.tokens.shape[0])
    with whole:
        r = speculative_decode(prompt, draft=draft, target=target, max_new_tokens=max_new_tokens, rng=seed,
                               **decode_args(settings, scheme))
    return whole.seconds, int(r.tokens.shape[0]), int(np.sum(r.target_calls)), int(np.sum(r.emitted))


def check_decodes(draft, target, prompts, schemes, settings, *, rounds: int = 3, max_new_tokens: int = 32,
                  seed: int = 0) -> dict:
    """Decode every scheme and plain decoding on ``prompts``, interleaved in rounds: ``scheme -> DecodeCheck``.

    Parameters
    ----------
    draft, target : LanguageModel
    prompts : list of list of int
    schemes : sequence
        ``(family, k, L)`` tuples and tree family names of ``settings.tree_plan``.
    settings : ProfileSettings
        The sampling (temperature, top-k, top-p) and verifier options of the profile being checked.
    rounds : int, keyword-only
        Counted rounds (after one warm-up round).
    max_new_tokens : int, keyword-only
    seed : int, keyword-only
        Prompt ``i`` of round ``r`` decodes with ``rng = seed + 1000 r + i``.

    Returns
    -------
    dict
        ``scheme -> DecodeCheck``, in the order of ``schemes``.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"`rounds` must be an integer >= 1, got {rounds!r}")
    contenders = ["plain"] + list(schemes)
    share = {}
    td, tt = TimedLM(draft), TimedLM(target)
    for c in contenders:  # warm-up round, every model call timed
        w0, d0, t0 = 0.0, td.seconds, tt.seconds
        for i, p in enumerate(prompts):
            w0 += _decode(td, tt, p, settings, c, max_new_tokens, seed + i)[0]
        fwd = (td.seconds - d0) + (tt.seconds - t0)
        share[c] = max(w0 - fwd, 0.0) / w0 if w0 > 0 else float("nan")
    warm = max(1, max_new_tokens // 4)
    per_token = {c: [] for c in contenders}
    emitted = {c: 0 for c in contenders}
    calls = {c: 0 for c in contenders}
    for r in range(1, rounds + 1):
        for i, p in enumerate(prompts):  # every contender on one prompt, side by side: a pair shares the load
            shift = (r + i) % len(contenders)
            for c in contenders[shift:] + contenders[:shift]:
                # a short untimed decode of the same contender first: the caches and the allocator's free
                # blocks its own, as in a server that runs one scheme (not the previous contender's)
                _decode(draft, target, p, settings, c, warm, seed + 1000 * r + i)
                w, got, cl, em = _decode(draft, target, p, settings, c, max_new_tokens, seed + 1000 * r + i)
                calls[c] += cl
                emitted[c] += em
                per_token[c].append(w / max(em, 1))  # every token the iterations made: a rate, as predicted
    plain = np.array(per_token["plain"])
    out = {}
    for c in schemes:
        ratios = plain / np.array(per_token[c])
        out[c] = DecodeCheck(scheme=c, speedup=float(np.median(ratios)), rounds=tuple(float(x) for x in ratios),
                             seconds_per_token=float(np.median(per_token[c])),
                             plain_seconds_per_token=float(np.median(plain)),
                             tokens_per_call=emitted[c] / max(calls[c], 1), outside_share=share[c],
                             plain_outside_share=share["plain"])
    return out
