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

from .._array import to_host
from ..decoding._sampling import bad_rows
from ._quantities import drop_null_columns, parts_after, read_parts, text_probs_where
from ._renewal import emission_tables
from ._trees import (
    along_text_families,
    along_text_names,
    iid_emission_along,
    iid_levels_where,
    static_along_names,
    text_ranks_of,
    text_ranks_where,
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


class _Flag:
    """The bad-logits check of the teacher-forced draft pass on the device, left there (``_Timer.call``'s
    ``checks``): :attr:`bad` whether a row of its laws came from bad logits, read with the text's values."""

    bad = None

    def add(self, lm, which: str, probs) -> None:
        self.bad = bad_rows(probs).any()


def _draft_path_laws(draft, prompt, y, sampling, timer, *, keep: bool = False, checks=None):
    """One teacher-forced draft pass: ``p(. | prompt, y_{<t})`` for ``t = 0..T-1``, ``(T, V)`` float64 (numpy, or
    with ``keep`` a tensor left on the draft's device, checked at once, or with ``checks`` (a :class:`_Flag`) in the
    caller's read)."""
    ids = np.array([list(prompt) + y[:-1].tolist()], dtype=np.int64)
    P = timer.call(draft, draft.new_state(), ids, sampling, "draft", len(y), keep=keep, checks=checks)[0]
    timer.draft_steps -= 1  # not a drafting step: the cost ratio counts the tree's draft steps only
    return P


def _read_along(p_path, q_path, y, static, fams, flag, again, before=None) -> dict:
    """Every value along the text that :func:`emission_rows` computes from the draft's path laws on their device,
    in one host read: the pass's bad-logits flag first (when set, ``again()`` -- the pass checked at once -- raises
    its error before any value is used), the text tokens' draft probabilities (``"py"``), the static top-k
    families' ranks (``"ranks"``), the i.i.d. families' levels for the widest node of any (``"levels"``) and, when a
    scheme reads every token, the laws themselves (``"P"``). Each is the value the functions it feeds would read on
    their own, bit for bit (the same ops). ``before``: the walk's values left unread at its end (a
    :class:`otspec.profile._collect.TreesLater`, or None), read first in the same read, their rows written before
    any value along the text is stored (:func:`otspec.profile._quantities.parts_after`)."""
    import torch

    got: dict = {}
    parts = []
    if flag.bad is not None:
        def check(host):
            if host[0]:
                again()  # the checked pass raises its error
                raise ValueError("the draft model gave non-finite logits (NaN or inf) along the text")
        parts.append((flag.bad.reshape(1), check))

    def put(key):
        return lambda vals: got.__setitem__(key, np.array(vals))

    parts.append((text_probs_where(p_path, y), put("py")))
    routes = {route for f in static for _, route in static_along_names(f)}
    if "topk" in routes:
        parts.append((text_ranks_where(p_path, y), lambda vals: got.__setitem__("ranks", text_ranks_of(vals))))
    if "iid" in routes:
        widest = 0  # the most children of a node of any i.i.d. family (a prefix of the levels serves the others)
        for f in static:
            if any(route == "iid" for _, route in static_along_names(f)):
                widest = max(widest, int(np.bincount(np.asarray(f.shape.parents[1:], dtype=np.int64)).max(initial=0)))
        q_dev = torch.as_tensor(q_path).to(p_path.device)  # the levels read both laws: one move
        parts.append((iid_levels_where(p_path, q_dev, widest), put("levels")))
    if any(name not in _TOKEN_ONLY for name in fams):
        parts.append((p_path, put("P")))
    if before is not None:
        parts = parts_after(before, parts)
    read_parts(parts)
    return got


def emission_rows(rows, draft, prompt, y, q_path, settings, timer, *, trees=None, device=None, before=None) -> None:
    """Rows ``kind="e"`` (``m = L``, ``j = 1..L+1``) at every text position, and ``kind="logq"``.

    A tree family's rows are named as its ``kind="tree"`` rows, with ``k`` its
    draft nodes and ``m`` its depth (the keys of those rows): the static top-k
    families' from the ranks along the text, SpecInfer's on i.i.d. children in closed form
    (:func:`otspec.profile._trees.iid_emission_along`), EAGLE-2's and the
    target-only rule's on sampled trees from ``trees`` (``{pos: {label: (2, n + 1) parents and tokens}}``, the
    tree drawn at every text position, kept by the walk). With ``device`` (the walk's accelerator,
    :func:`otspec.profile._collect.analysis_device`), the draft's path laws stay on the draft's device and the
    text's quantities are computed there (only ``(T,)``-sized values reach the host). ``before``: the walk's values
    left unread at its end (a :class:`otspec.profile._collect.TreesLater`), read with the text's values on the device
    (one read per walk for both) and their rows written first; read alone (:meth:`~otspec.profile._collect.TreesLater.
    finish`) where nothing along the text is read. The walk's last trees (``trees``) are those it records then.

    Each scheme's step laws are computed once for every ``k`` and ``L``
    (:func:`otspec.profile._renewal.emission_tables`); token verification and
    the one-step block verifier read only the text tokens' probabilities, so
    the laws are restricted to the tokens with mass (:func:`drop_null_columns`)
    only when another scheme needs them whole.
    """
    fams = renewal_families(settings)
    static = renewal_trees(settings)
    # (the last position's trees are recorded in ``trees`` when ``before``'s rows are written)
    drawn = renewal_drawn_trees(settings) if trees or (trees is not None and before is not None) else ()
    if not fams and not static and not drawn:
        if before is not None:
            before.finish()
        return

    # on an accelerator the draft's path laws stay there: the ranks, the text tokens' probabilities and the i.i.d.
    # levels along the text are computed where they are, and only (T,)-sized values come to the host
    dev = device
    flag = _Flag() if dev is not None else None
    p_path = _draft_path_laws(draft, prompt, y, settings.sampling, timer, keep=dev is not None, checks=flag)
    # on the device, every value along the text read at once (the pass's check with them): one read per walk
    got = _read_along(p_path, q_path, y, static, fams, flag, lambda: _draft_path_laws(
        draft, prompt, y, settings.sampling, timer, keep=True), before) if dev is not None else {}
    if dev is None and before is not None:
        before.finish()
    T = len(y)
    log_q = np.log(q_path[np.arange(T), y])
    for f in static:  # the ranks need every token's draft probability: before dropping columns
        for name, route in static_along_names(f):
            if route == "topk":
                e = topk_emission_along(f.shape, p_path, q_path, y, ranks=got.get("ranks"))
            else:
                e = iid_emission_along(f.shape, p_path, q_path, y, levels=got.get("levels"), py=got.get("py"))
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
        p_path, q_path, y = drop_null_columns(got["P"] if "P" in got else to_host(p_path), q_path, y)
    for s in range(T):
        rows.add(s, "logq", "target", 1, [log_q[s]])
    Ls = range(1, settings.L_max + 1)
    for name in fams:
        tables = emission_tables(name, p_path, q_path, y, settings.ks(name), Ls,
                                 py=None if isinstance(p_path, np.ndarray) else got.get("py"))
        for k in settings.ks(name):
            for L in Ls:
                e = tables[(k, L)]
                for s in range(T):
                    rows.add(s, "e", name, k, e[s], m=L)
