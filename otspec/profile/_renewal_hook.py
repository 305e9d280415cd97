r"""The bridge to :mod:`otspec.profile._renewal` (emission tables along the text), used when it exists.

For the unbiased tokens-per-call estimator (docs/theory/profile.rst) the
profile records, at each text position ``s``, the emission table
``e[j - 1]`` = P(an iteration begun at ``s`` emits exactly ``y_s .. y_{s+j-1}``)
of every scheme, ``k`` and ``L``, computed from the draft and target laws at
the text's own contexts.
"""

from __future__ import annotations

import numpy as np

__all__ = ["renewal_rows", "available"]


def available() -> bool:
    """Whether the emission tables can be computed (the theory module is present)."""
    try:
        from . import _renewal  # noqa: F401
    except ImportError:
        return False
    return hasattr(_renewal, "emission_probs")


def renewal_rows():
    """The per-prompt hook of :func:`profile_prompt`, or None when the theory module is absent."""
    if not available():
        return None
    return _emission_rows


def _draft_path_laws(draft, prompt, y, sampling, timer) -> np.ndarray:
    """One teacher-forced draft pass: ``p(. | prompt, y_{<t})`` for ``t = 0..T-1``, ``(T, V)`` float64."""
    ids = np.array([list(prompt) + y[:-1].tolist()], dtype=np.int64)
    P = timer.call(draft, draft.new_state(), ids, sampling, "draft", len(y))[0]
    timer.draft_steps -= 1  # not a drafting step: the cost ratio counts the tree's draft steps only
    return P


def _emission_rows(rows, draft, prompt, y, q_path, settings, timer) -> None:
    from . import _renewal

    p_path = _draft_path_laws(draft, prompt, y, settings.sampling, timer)
    T = len(y)
    Lm = settings.L_max
    for s in range(T):
        w = min(Lm + 1, T - s)
        if w < 1:
            continue
        for name in settings.families:
            for k in settings.ks(name):
                for L in range(1, Lm + 1):
                    if w < L + 1:
                        break
                    e = _renewal.emission_probs(name, p_path[s:s + L + 1], q_path[s:s + L + 1], y[s:s + L + 1],
                                                k=k, L=L, **settings.options(name))
                    rows.add(s, "e", name, k, e, m=L, j0=1)
