r"""The per-prompt hook that records :mod:`otspec.profile._renewal`'s emission tables along the text.

For the unbiased tokens-per-call estimator (docs/theory/profile.rst) the
profile records, at each text position ``s``, the emission table
``e[j - 1]`` = P(an iteration begun at ``s`` emits exactly ``y_s .. y_{s+j-1}``)
of every scheme, ``k`` and ``L``, and of every static top-k tree family
(:func:`otspec.profile._trees.topk_emission_along`), computed from the draft
and target laws at the text's own contexts.
"""

from __future__ import annotations

import numpy as np

from ._quantities import drop_null_columns
from ._renewal import emission_tables
from ._trees import topk_emission_along

__all__ = ["emission_rows", "renewal_families", "renewal_trees"]

#: Schemes whose emission tables need only the text tokens' probabilities under both models.
_TOKEN_ONLY = ("token", "block-onestep")


def renewal_families(settings) -> list[str]:
    """The profiled schemes with a closed-form emission table (the others would need enumeration or Monte Carlo)."""
    if settings.context != "sample":  # the estimator needs a text sampled from the target
        return []
    return [f for f in settings.renewal if not settings.options(f)]


def renewal_trees(settings) -> tuple:
    """The profiled static top-k tree families (exact emission tables along the text, no verifier needed)."""
    plan = settings.tree_plan
    if settings.context != "sample" or plan is None:
        return ()
    return tuple(plan.topk)


def _draft_path_laws(draft, prompt, y, sampling, timer) -> np.ndarray:
    """One teacher-forced draft pass: ``p(. | prompt, y_{<t})`` for ``t = 0..T-1``, ``(T, V)`` float64."""
    ids = np.array([list(prompt) + y[:-1].tolist()], dtype=np.int64)
    P = timer.call(draft, draft.new_state(), ids, sampling, "draft", len(y))[0]
    timer.draft_steps -= 1  # not a drafting step: the cost ratio counts the tree's draft steps only
    return P


def emission_rows(rows, draft, prompt, y, q_path, settings, timer) -> None:
    """Rows ``kind="e"`` (``m = L``, ``j = 1..L+1``) at every text position, and ``kind="logq"``.

    A static top-k tree family's rows are named by its label, with ``k`` its
    draft nodes and ``m`` its depth (the keys of its ``kind="tree"`` rows).

    Each scheme's step laws are computed once for every ``k`` and ``L``
    (:func:`otspec.profile._renewal.emission_tables`); token verification and
    the one-step block verifier read only the text tokens' probabilities, so
    the laws are restricted to the tokens with mass (:func:`drop_null_columns`)
    only when another scheme needs them whole.
    """
    fams = renewal_families(settings)
    trees = renewal_trees(settings)
    if not fams and not trees:
        return

    p_path = _draft_path_laws(draft, prompt, y, settings.sampling, timer)
    T = len(y)
    log_q = np.log(q_path[np.arange(T), y])
    for f in trees:  # the ranks need every token's draft probability: before dropping columns
        e = topk_emission_along(f.shape, p_path, q_path, y)
        for s in range(T):
            rows.add(s, "e", f.label, f.n, e[s], m=f.depth)
    if any(name not in _TOKEN_ONLY for name in fams):
        p_path, q_path, y = drop_null_columns(p_path, q_path, y)  # same tables on the tokens with mass
    for s in range(T):
        rows.add(s, "logq", "target", 1, [log_q[s]])
    Ls = range(1, settings.L_max + 1)
    for name in fams:
        tables = emission_tables(name, p_path, q_path, y, settings.ks(name), Ls)
        for k in settings.ks(name):
            for L in Ls:
                e = tables[(k, L)]
                for s in range(T):
                    rows.add(s, "e", name, k, e[s], m=L)
