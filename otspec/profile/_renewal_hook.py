r"""The per-prompt hook that records :mod:`otspec.profile._renewal`'s emission tables along the text.

For the unbiased tokens-per-call estimator (docs/theory/profile.rst) the
profile records, at each text position ``s``, the emission table
``e[j - 1]`` = P(an iteration begun at ``s`` emits exactly ``y_s .. y_{s+j-1}``)
of every scheme, ``k`` and ``L``, and of every static top-k tree family
(:func:`otspec.profile._trees.topk_emission_along`), computed from the draft
and target laws at the text's own contexts, and of the i.i.d. families
verified by SpecInfer's rule (:func:`otspec.profile._trees.iid_emission_along`);
with a tree drawn at every text position (``stride=1``), also of EAGLE-2's
trees and of the target-only rule on sampled trees
(:func:`otspec.profile._trees.tree_emission_along`: exact given the drawn
tree, so the row averaged over the draws is the process's).
"""

from __future__ import annotations

import numpy as np

from ._quantities import drop_null_columns, to_host
from ._renewal import emission_tables
from ._trees import (
    along_text_families,
    along_text_names,
    iid_emission_along,
    static_along_names,
    topk_emission_along,
    tree_emission_along,
)

__all__ = ["emission_rows", "renewal_families", "renewal_trees", "renewal_drawn_trees"]

#: Schemes whose emission tables need only the text tokens' probabilities under both models.
_TOKEN_ONLY = ("token", "block-onestep")


def renewal_families(settings) -> list[str]:
    """The profiled schemes with a closed-form emission table (the others would need enumeration or Monte Carlo)."""
    if settings.context != "sample":  # the estimator needs a text sampled from the target
        return []
    return [f for f in settings.renewal if not settings.options(f)]


def renewal_trees(settings) -> tuple:
    """The profiled tree families with an exact emission table from the text's laws alone: the static top-k
    families (no verifier needed) and the i.i.d. families verified by SpecInfer's rule."""
    plan = settings.tree_plan
    if settings.context != "sample" or plan is None:
        return ()
    return tuple(f for f in plan.families if static_along_names(f))


def renewal_drawn_trees(settings) -> tuple:
    """The profiled families whose emission along the text reads the tree drawn at each text position (EAGLE-2's,
    the target-only rule on sampled trees): only with a tree at every position, ``stride=1``."""
    if settings.context != "sample" or settings.stride != 1:
        return ()
    return along_text_families(settings.tree_plan)


def _draft_path_laws(draft, prompt, y, sampling, timer, *, keep: bool = False):
    """One teacher-forced draft pass: ``p(. | prompt, y_{<t})`` for ``t = 0..T-1``, ``(T, V)`` float64 (numpy, or
    with ``keep`` a tensor left on the draft's device)."""
    ids = np.array([list(prompt) + y[:-1].tolist()], dtype=np.int64)
    P = timer.call(draft, draft.new_state(), ids, sampling, "draft", len(y), keep=keep)[0]
    timer.draft_steps -= 1  # not a drafting step: the cost ratio counts the tree's draft steps only
    return P


def emission_rows(rows, draft, prompt, y, q_path, settings, timer, *, trees=None, device=None) -> None:
    """Rows ``kind="e"`` (``m = L``, ``j = 1..L+1``) at every text position, and ``kind="logq"``.

    A tree family's rows are named as its ``kind="tree"`` rows, with ``k`` its
    draft nodes and ``m`` its depth (the keys of those rows): the static top-k
    families' from the ranks along the text, SpecInfer's on i.i.d. children in closed form
    (:func:`otspec.profile._trees.iid_emission_along`), EAGLE-2's and the
    target-only rule's on sampled trees from ``trees`` (``{pos: {label: (2, n + 1) parents and tokens}}``, the
    tree drawn at every text position, kept by the walk). With ``device`` (the walk's accelerator,
    :func:`otspec.profile._collect.analysis_device`), the draft's path laws stay on the draft's device and the
    text's quantities are computed there (only ``(T,)``-sized values reach the host).

    Each scheme's step laws are computed once for every ``k`` and ``L``
    (:func:`otspec.profile._renewal.emission_tables`); token verification and
    the one-step block verifier read only the text tokens' probabilities, so
    the laws are restricted to the tokens with mass (:func:`drop_null_columns`)
    only when another scheme needs them whole.
    """
    fams = renewal_families(settings)
    static = renewal_trees(settings)
    drawn = renewal_drawn_trees(settings) if trees else ()
    if not fams and not static and not drawn:
        return

    # on an accelerator the draft's path laws stay there: the ranks, the text tokens' probabilities and the i.i.d.
    # levels along the text are computed where they are, and only (T,)-sized values come to the host
    dev = device
    p_path = _draft_path_laws(draft, prompt, y, settings.sampling, timer, keep=dev is not None)
    T = len(y)
    log_q = np.log(q_path[np.arange(T), y])
    q_dev = None
    for f in static:  # the ranks need every token's draft probability: before dropping columns
        for name, route in static_along_names(f):
            if route == "iid" and dev is not None and q_dev is None:  # the levels read both laws: one move
                import torch

                q_dev = torch.as_tensor(q_path).to(p_path.device)
            q_at = q_path if route == "topk" or q_dev is None else q_dev
            e = (topk_emission_along if route == "topk" else iid_emission_along)(f.shape, p_path, q_at, y)
            for s in range(T):
                rows.add(s, "e", name, f.n, e[s], m=f.depth)
    for f in drawn:
        names = along_text_names(f)
        for s in range(T):
            end = min(T, s + f.depth + 1)
            e = tree_emission_along(trees[s][f.label], q_path[s:end], y[s:end], depth=f.depth)
            for name in names:  # the same walk for every name of the family
                rows.add(s, "e", name, f.n, e, m=f.depth)
    if any(name not in _TOKEN_ONLY for name in fams):  # same tables on the tokens with mass, on the host
        p_path, q_path, y = drop_null_columns(to_host(p_path), q_path, y)
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
