r"""The text of a draft tree, read the same way by the profile and the decoder: ``process:shape[:verifiers]``.

One language and one node limit for every place that takes a tree as text
(``python -m otspec profile --trees``, :class:`otspec.profile.ProfileSettings`'s
``trees`` and :func:`otspec.decoding.speculative_decode`'s ``tree``):

* ``process`` -- a draft process: ``topk`` (Medusa's and EAGLE's
  deterministic trees), ``iid`` (SpecInfer's), ``wor`` (Sequoia's, without
  replacement), ``eagle2`` (EAGLE-2's dynamic tree), ``spechub`` (SpecHub's
  pairs; the decoder only);
* ``shape`` -- ``branching(b1,...,bD)`` (``b1`` children of the root, ``b2``
  of each of them, ...), ``chains(k,L)`` (``k`` chains of ``L`` tokens), a
  JSON list of rank paths (Medusa's ``medusa_choices``, e.g.
  ``[[0],[1],[0,0]]``), or for ``eagle2`` three integers
  ``num_steps,topk,num_draft_tokens`` (SGLang's ``--speculative-num-steps``,
  ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``:
  :class:`~otspec.tree.Eagle2Params`);
* ``verifiers`` -- optional, comma-separated tree verifiers (registered with
  ``kind="tree"``).

A tree has at least one and at most :data:`MAX_DRAFT_TREE_NODES` draft nodes
(the root, the context, is not one). Sizes in messages are exact (computed
from the shape's numbers, never by building the tree).
"""

from __future__ import annotations

import json
import numbers
import re
from dataclasses import dataclass

from .._registry import suggest
from ._tree import Eagle2Params, TreeShape

__all__ = ["MAX_DRAFT_TREE_NODES", "SPEC_PROCESSES", "SHAPE_FORMS", "TreeSpec", "parse_shape_text",
           "parse_tree_spec", "check_tree_size", "check_process"]

#: Largest draft tree, in draft nodes, that the profile profiles and the decoder drafts at every step: one
#: target call with a tree attention mask scores all its nodes, and the verifiers run at every node (Medusa's
#: and EAGLE-2's trees have 60 to 64 nodes, Sequoia's up to 768).
MAX_DRAFT_TREE_NODES = 1024
#: The draft processes the text may name (``spechub``: the decoder only).
SPEC_PROCESSES = ("topk", "eagle2", "iid", "wor", "spechub")
#: The forms of a shape, for messages.
SHAPE_FORMS = ("branching(b1,...,bD), chains(k,L) or a JSON list of rank paths such as [[0],[1],[0,0]] "
               "(Medusa's medusa_choices)")
#: The form of a tree's text, for messages.
SPEC_FORM = ("'process:shape[:verifiers]' (e.g. 'topk:branching(4,2)', 'wor:chains(2,3):sequoia', "
             "'eagle2:3,4,16' for SGLang's num_steps,topk,num_draft_tokens)")
#: Longest integer (in digits) of a shape's text: a longer one is refused as such before any size is computed.
_MAX_DIGITS = 30


@dataclass(frozen=True)
class TreeSpec:
    """A tree's text, read: its process, its shape (or EAGLE-2's parameters), its verifiers and canonical text.

    Attributes
    ----------
    process : str
    shape : TreeShape or Eagle2Params
    verifiers : tuple of str
        As named (not checked against the registry here).
    canon : str
        The canonical text of the shape: ``branching(...)``, ``chains(...)``, the compact JSON of the rank
        paths, or ``num_steps,topk,num_draft_tokens``.
    """

    process: str
    shape: object
    verifiers: tuple
    canon: str


def _ints(text: str, what: str) -> list[int]:
    parts = text.split(",")
    if not text or any(not re.fullmatch(r"\d+", p) for p in parts):
        raise ValueError(f"{what} must list positive integers separated by commas, got {text!r}")
    if any(len(p.lstrip("0")) > _MAX_DIGITS for p in parts):
        raise ValueError(f"{what} must be integers of at most {_MAX_DIGITS} digits, got {text!r}")
    return [int(p) for p in parts]


def _size(nodes: int) -> str:
    return f"{nodes:,}"


def check_tree_size(n: int, where: str, limit: int = MAX_DRAFT_TREE_NODES, *, what: str = "a tree",
                    name: str = "MAX_DRAFT_TREE_NODES") -> None:
    """Refuse a tree without draft nodes, or with more than ``limit`` (the message gives the exact count)."""
    if n < 1:
        raise ValueError(f"{where}: {what} must have at least one draft node, got the root alone (no rank path)")
    if n > limit:
        raise ValueError(f"{where}: {what} of {_size(n)} draft nodes is above the limit {name} = {limit:,}")


def parse_shape_text(text: str, where: str, limit: int = MAX_DRAFT_TREE_NODES, *,
                     name: str = "MAX_DRAFT_TREE_NODES") -> tuple[TreeShape, str]:
    r"""A shape from its text, checked for size before it is built; returns ``(shape, canonical text)``.

    The number of draft nodes of ``branching(b1,...,bD)`` is
    :math:`\sum_{d=1}^{D} \prod_{j \le d} b_j`, of ``chains(k,L)`` :math:`kL`, of a list of rank paths the
    number of paths (the root's empty path not counted).

    Raises
    ------
    ValueError
        A text of none of :data:`SHAPE_FORMS`, zero arguments, a shape without draft nodes or of more than
        ``limit`` (with its exact size), a list of paths that is not prefix-closed.
    TypeError
        Rank paths that are not lists of integers.
    """
    t = re.sub(r"\s+", "", text)
    m = re.fullmatch(r"(branching|chains)\((.*)\)", t)
    if m:
        kind, nums = m.group(1), _ints(m.group(2), f"{where}: the arguments of {m.group(1)}(...)")
        if any(x < 1 for x in nums):
            raise ValueError(f"{where}: {kind}(...) takes integers >= 1, got {t!r}")
        if kind == "chains":
            if len(nums) != 2:
                raise ValueError(f"{where}: chains(k,L) takes two integers, got {t!r}")
            nodes = nums[0] * nums[1]
        else:
            nodes, level = 0, 1
            for b in nums:
                level *= b
                nodes += level
        if nodes > limit:
            raise ValueError(f"{where}: {t} has {_size(nodes)} draft nodes, above the limit {name} = {limit:,}")
        shape = TreeShape.chains(*nums) if kind == "chains" else TreeShape.branching(*nums)
        return shape, f"{kind}({','.join(map(str, nums))})"
    if t.startswith("["):
        try:
            paths = json.loads(t)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: the rank paths {text!r} are not valid JSON ({exc.msg})") from None
        except RecursionError:  # thousands of nested brackets: no list of rank paths, and no traceback
            raise ValueError(f"{where}: the rank paths must be a list of lists of ranks, got lists nested "
                             f"{len(t) - len(t.lstrip('['))} deep") from None
        if not isinstance(paths, list):
            raise ValueError(f"{where}: the rank paths must be a list of lists of ranks, got {type(paths).__name__}")
        real = sum(1 for p in paths if p != [])
        if real > limit:
            raise ValueError(f"{where}: the rank paths name {_size(real)} draft nodes, above the limit {name} = "
                             f"{limit:,}")
        shape = shape_of(paths, where)
        check_tree_size(shape.n, where, limit, what="a shape", name=name)
        return shape, json.dumps(shape.to_medusa_choices(), separators=(",", ":"))
    raise ValueError(f"{where}: a shape must be {SHAPE_FORMS}, got {text!r}")


def shape_of(paths, where: str) -> TreeShape:
    """``TreeShape(paths)``, its errors prefixed by ``where``."""
    try:
        return TreeShape(paths)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def eagle2_of(text: str, where: str) -> Eagle2Params:
    """EAGLE-2's parameters from ``num_steps,topk,num_draft_tokens`` (SGLang's names in every message)."""
    nums = _ints(text, f"{where}: eagle2's num_steps,topk,num_draft_tokens")
    if len(nums) != 3:
        raise ValueError(f"{where}: eagle2 takes three integers num_steps,topk,num_draft_tokens (SGLang's "
                         f"--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens), "
                         f"got {text!r}")
    try:
        return Eagle2Params(num_steps=nums[0], topk=nums[1], num_draft_tokens=nums[2])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{where}: {exc}") from None


def check_process(process: str, processes: tuple, where: str) -> None:
    """Refuse a process the caller does not run (with the closest name, or the reason it is left out)."""
    if process not in processes:
        also = (" (SpecHub's pairs are drafted by otspec.decoding.speculative_decode only)"
                if process in SPEC_PROCESSES else suggest(process, processes))
        raise ValueError(f"{where}: the process must be one of {processes}, got {process!r}{also}")


def parse_tree_spec(text, where: str = "`tree`", *, processes=SPEC_PROCESSES,
                    limit: int = MAX_DRAFT_TREE_NODES) -> TreeSpec:
    r"""Read a tree's text ``process:shape[:verifiers]``, the one language of the profile and the decoder.

    .. math::

        \texttt{"process:shape[:verifiers]"} \mapsto (\text{process}, T, (v_1, \dots)),
        \qquad 1 \le n(T) \le \texttt{limit},

    with :math:`n(T)` the draft nodes of the shape :math:`T` (``branching(b1,...,bD)``:
    :math:`\sum_d \prod_{j \le d} b_j`; ``chains(k,L)``: :math:`kL`; rank paths: their number;
    ``eagle2``'s ``num_steps,topk,num_draft_tokens``: ``num_draft_tokens - 1``), computed before the
    tree is built.

    Parameters
    ----------
    text : str
    where : str
        The parameter, for messages.
    processes : tuple of str
        The processes the caller runs (a subset of :data:`SPEC_PROCESSES`).
    limit : int
        Largest number of draft nodes.

    Returns
    -------
    TreeSpec

    Raises
    ------
    ValueError
        Not three parts at most, an unknown process (with the closest name), a shape of none of the forms,
        an empty verifier name (a trailing ``:`` or ``,``),
        a tree without draft nodes or above ``limit`` (with its exact size), EAGLE-2 parameters out of range
        (named as SGLang names them).

    References
    ----------
    .. [1] Cai et al., "Medusa", arXiv:2401.10774, §2.1.2 (``medusa_choices``); Li et al., "EAGLE-2",
       arXiv:2406.16858, §4, and SGLang's ``--speculative-num-steps``, ``--speculative-eagle-topk``,
       ``--speculative-num-draft-tokens``.

    Examples
    --------
    >>> from otspec.tree import parse_tree_spec
    >>> s = parse_tree_spec("eagle2:3,2,6")
    >>> s.process, s.shape, s.verifiers
    ('eagle2', Eagle2Params(num_steps=3, topk=2, num_draft_tokens=6), ())
    >>> parse_tree_spec("topk:[]")
    Traceback (most recent call last):
    ...
    ValueError: `tree`: a shape must have at least one draft node, got the root alone (no rank path)
    >>> parse_tree_spec("topk:branching(64,64,64)")
    Traceback (most recent call last):
    ...
    ValueError: `tree`: branching(64,64,64) has 266,304 draft nodes, above the limit MAX_DRAFT_TREE_NODES = 1,024
    """
    if not isinstance(text, str):
        raise TypeError(f"{where} must be a text {SPEC_FORM}, got {type(text).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 1:
        raise (ValueError if isinstance(limit, numbers.Integral) and not isinstance(limit, bool) else TypeError)(
            f"`limit` must be an integer >= 1 (draft nodes), got {limit!r}")
    if isinstance(processes, str) or not isinstance(processes, (tuple, list)) or not all(
            isinstance(x, str) for x in processes):
        raise TypeError(f"`processes` must be a tuple of process names, got {processes!r}")
    processes = tuple(processes)
    parts = [p.strip() for p in text.split(":")]
    if len(parts) < 2 or len(parts) > 3 or not parts[1]:
        raise ValueError(f"{where} must be {SPEC_FORM}, got {text!r}")
    # blanks around the separators are dropped, blanks inside a name are refused ('spec infer' is no
    # 'specinfer'); inside a shape they separate numbers only ('branching(4, 2)')
    names = [parts[0], *(v.strip() for v in (parts[2].split(",") if len(parts) == 3 else ()))]
    if any(re.search(r"\s", v) for v in names):
        raise ValueError(f"{where}: a process or verifier name has no blanks inside, got {text!r}")
    if re.search(r"\d\s+\d", parts[1]):
        raise ValueError(f"{where}: numbers of a shape are separated by commas, got {parts[1]!r} ('4 2' is not "
                         "'4,2' nor '42')")
    process, shape_text = parts[0], re.sub(r"\s+", "", parts[1])
    vs = ",".join(names[1:])
    check_process(process, processes, where)
    if process == "eagle2":
        shape = eagle2_of(shape_text, where)
        check_tree_size(shape.n, where, limit, what="an EAGLE-2 tree")
        canon = f"{shape.num_steps},{shape.topk},{shape.num_draft_tokens}"
    else:
        shape, canon = parse_shape_text(shape_text, where, limit)
    verifiers = tuple(vs.split(",")) if len(parts) == 3 else ()
    if any(not v for v in verifiers):
        raise ValueError(f"{where}: the verifiers after the second ':' must be comma-separated names, got "
                         f"{parts[2]!r} (leave out ':' and the verifiers for the defaults)")
    return TreeSpec(process, shape, verifiers, canon)
