r"""The one registry of named verifiers, read by :mod:`otspec.spectr`, :mod:`otspec.block` and :mod:`otspec.decoding`.

Every name a user can pass as ``verifier="..."`` anywhere in otspec is
registered here once, with the properties the exact analyses and the
decoding loop rely on. Notation: ``p`` is the draft law, ``q`` the target
law, ``k`` the number of drafts verified at one position.

A token-level verifier (``kind="token"``) is built by
``spec.build(p, q, k, **options) -> otspec.Verifier``; a block-level one
(``kind="block"``) by ``spec.build_block(draft, target, L, **kw) ->
otspec.block.BlockVerifier``; a tree-level one (``kind="tree"``) by
``spec.build_tree(**options) -> otspec.tree.TreeVerifier``. ``"token"`` has both: the maximal coupling at
one position, and per-token speculative sampling along a block
(Leviathan et al., arXiv:2211.17192, Algorithm 1).

Layering: this module imports nothing from otspec, so every family can read
it. The entries are registered from above the families that define them:
``otspec._catalogue`` (imported first by ``import otspec``) registers the
token-level and lossy verifiers of :mod:`otspec.multidraft`,
:mod:`otspec.lossy` and :mod:`otspec.otm`, and :mod:`otspec.block`
registers its block verifiers when it is imported, so the registry is
complete once ``otspec`` is imported.

To add a verifier: write it as a :class:`otspec.Verifier` (or a
:class:`otspec.block.BlockVerifier`) in the subpackage of its chapter, then
call :func:`register_verifier` with its builder and properties (in
``otspec/_catalogue.py`` for the package's own).
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable
from dataclasses import dataclass, field

from ._validation import validate_bool

__all__ = [
    "SUGGEST_CUTOFF",
    "VERIFIERS",
    "VerifierSpec",
    "get_verifier",
    "register_verifier",
    "registered_name",
    "registered_spelling",
    "suggest",
    "unknown_name_message",
    "verifier_names",
]

_KINDS = ("token", "block", "tree")


@dataclass(frozen=True)
class VerifierSpec:
    """A registered verifier: how to build it and what it guarantees.

    Attributes
    ----------
    name : str
        The name accepted by ``verifier=``.
    kind : {"token", "block", "tree"}
        ``"token"``: ``k`` drafts at one position to one token (built by
        ``build``); ``"block"``: one draft block of length ``L`` (built by
        ``build_block`` only, or ``k`` draft blocks by ``build_multi``);
        ``"tree"``: a realised draft tree to an accepted path and one token
        (built by ``build_tree``).
    build : callable or None
        ``(p, q, k, **options) -> Verifier`` (token-level schemes).
    build_block : callable or None
        ``(draft, target, L, **kw) -> BlockVerifier`` (block-level schemes,
        and ``"token"`` run along a block).
    build_multi : callable or None
        ``(draft, target, L, k) -> verifier`` of ``k`` draft blocks that
        enumerates all ``V**L`` blocks (``"multidraft-plan"``,
        ``"multidraft-one-token"``); only for tiny vocabularies.
    symmetric : bool
        The conditional law depends on the drafts only through their
        multiset (exact analyses may enumerate multisets).
    sequential : bool
        A first-accept rule scanning the drafts in order with a polynomial
        exact step law (k-Seq, recursive rejection with replacement).
    single_draft : bool
        Verifies exactly one draft per position (``k = 1``).
    lossless : bool
        The output follows ``q`` exactly (False for lossy rules, whose
        stated output law is ``Verifier.output_law``).
    options : frozenset of str
        Keyword options ``build`` accepts.
    required : frozenset of str
        Options that must be given.
    draft_process : str
        The draft law the verifier assumes (``"iid"``: ``k`` i.i.d. draws
        from ``p``; ``"tree"`` for tree verifiers, whose draft processes are
        listed in ``processes``).
    summary : str
        One line for tables and error messages.
    reference : str
        The paper (authors, arXiv id, section) that defines it.
    build_tree : callable or None
        ``(**options) -> otspec.tree.TreeVerifier`` (tree-level schemes).
    processes : tuple of str
        Tree verifiers: the draft-tree processes (``otspec.tree.PROCESSES``)
        they are lossless for.
    aliases : tuple of callables
        Public builders of the package that mean this entry when passed as
        ``verifier=`` (e.g. ``otspec.kseq`` for ``"kseq"``, ``otspec.otm_lp``
        for ``"lp"``); see :func:`registered_name`.
    """

    name: str
    kind: str
    build: Callable | None
    build_block: Callable | None = None
    symmetric: bool = False
    sequential: bool = False
    single_draft: bool = False
    lossless: bool = True
    options: frozenset = field(default_factory=frozenset)
    required: frozenset = field(default_factory=frozenset)
    draft_process: str = "iid"
    summary: str = ""
    reference: str = ""
    aliases: tuple = ()
    build_multi: Callable | None = None
    build_tree: Callable | None = None
    processes: tuple = ()


_REGISTRY: dict[str, VerifierSpec] = {}
#: Read-only view of every registered verifier, by name.
VERIFIERS = types.MappingProxyType(_REGISTRY)


def register_verifier(spec: VerifierSpec, *, replace: bool = False) -> VerifierSpec:
    """Add a verifier to the registry.

    Parameters
    ----------
    spec : VerifierSpec
        Its name, builders and properties.
    replace : bool, keyword-only
        Allow replacing an existing entry of the same name.

    Returns
    -------
    VerifierSpec
        ``spec``.

    Raises
    ------
    TypeError
        ``spec`` is not a :class:`VerifierSpec`.
    ValueError
        The name is taken (and ``replace`` is False), the kind is unknown,
        or the builder the kind needs is missing.

    Examples
    --------
    >>> import otspec
    >>> sorted(otspec.multidraft.VERIFIERS)[:2]
    ['block', 'block-onestep']
    """
    if not isinstance(spec, VerifierSpec):
        raise TypeError(f"`spec` must be a VerifierSpec, got {type(spec).__name__}")
    replace = validate_bool(replace, "replace")  # no truthiness: replace="no" replaced
    if spec.kind not in _KINDS:
        raise ValueError(unknown_name_message("spec.kind", spec.kind, _KINDS))
    if spec.kind == "token" and spec.build is None:
        raise ValueError(f"token-level verifier {spec.name!r} needs `build` (p, q, k, **options) -> Verifier")
    if spec.kind == "block" and spec.build_block is None and spec.build_multi is None:
        raise ValueError(
            f"block-level verifier {spec.name!r} needs `build_block` (draft, target, L) -> BlockVerifier "
            "or `build_multi` (draft, target, L, k)"
        )
    if spec.kind == "tree" and spec.build_tree is None:
        raise ValueError(f"tree-level verifier {spec.name!r} needs `build_tree` (**options) -> TreeVerifier")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"a verifier named {spec.name!r} is already registered (pass replace=True)")
    _REGISTRY[spec.name] = spec
    return spec


def verifier_names(*, kind: str | None = None, block: bool = False) -> tuple[str, ...]:
    """Registered names, in registration order.

    Parameters
    ----------
    kind : {"token", "block", "tree"} or None, keyword-only
        Only verifiers of this kind.
    block : bool, keyword-only
        Only verifiers that can run along a draft block (``build_block``).

    Returns
    -------
    tuple of str

    Raises
    ------
    TypeError
        ``kind`` is neither a string nor None, or ``block`` is no bool.
    ValueError
        ``kind`` is not one of ``"token"``, ``"block"``, ``"tree"``.

    Examples
    --------
    >>> from otspec.multidraft import verifier_names
    >>> "kseq" in verifier_names(kind="token"), "block" in verifier_names(kind="token")
    (True, False)
    """
    block = validate_bool(block, "block")  # no truthiness: block="no" listed the block verifiers
    kind = validate_name(kind, "kind", _KINDS, allow_none=True)  # kind="tokens" listed no verifier
    return tuple(
        name
        for name, s in _REGISTRY.items()
        if (kind is None or s.kind == kind) and (not block or s.build_block is not None)
    )


def registered_name(obj) -> str | None:
    """The registered name that ``obj`` stands for when passed as ``verifier=``, or None.

    ``obj`` may be a :class:`VerifierSpec` (its name), or a builder of the
    package: a spec's ``build``, ``build_block`` or one of its ``aliases``
    (``otspec.kseq`` -> ``"kseq"``, ``otspec.otm_lp`` -> ``"lp"``,
    ``otspec.block.BlockVerify`` -> ``"block"``). Anything else (a user's
    own callable) gives None.

    Parameters
    ----------
    obj : object

    Returns
    -------
    str or None

    Examples
    --------
    >>> import otspec
    >>> from otspec._registry import registered_name
    >>> registered_name(otspec.otm_lp), registered_name(otspec.get_verifier("kseq")), registered_name(len)
    ('lp', 'kseq', None)
    """
    if isinstance(obj, VerifierSpec):
        return obj.name if _REGISTRY.get(obj.name) == obj else None
    for name, spec in _REGISTRY.items():
        if any(obj is b for b in (spec.build, spec.build_block, spec.build_multi, *spec.aliases) if b is not None):
            return name
    return None


#: Similarity (difflib's ratio of the folded names) a close match must reach to be suggested: "kseg" -> "kseq"
#: is 0.75, "topk" -> "token" only 0.67 (no suggestion: a different name, not a typo of it).
SUGGEST_CUTOFF = 0.75


def _fold(name: str) -> str:
    """``name`` without case and separators: ``"K-Seq"``, ``"k_seq"`` and ``"kseq"`` all fold to ``"kseq"``."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _one_edit(a: str, b: str) -> bool:
    """Whether ``b`` is ``a`` with one letter inserted, deleted, replaced, or two neighbours swapped."""
    if abs(len(a) - len(b)) > 1:
        return False
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    if len(a) == len(b):
        return a[i + 1:] == b[i + 1:] or (a[i + 2:] == b[i + 2:] and a[i:i + 2] == b[i:i + 2][::-1])
    return a[i + 1:] == b[i:] if len(a) > len(b) else a[i:] == b[i + 1:]


def suggest(name, allowed) -> str:
    """`` (did you mean 'x'?)`` for the names in ``allowed`` that ``name`` most likely meant, or ``""``.

    Names are compared folded (case, ``-``, ``_``, spaces and dots ignored): a name equal to an allowed
    one once folded gets that one alone (``"k-seq"``, ``"KSeq"`` -> ``'kseq'``); otherwise the allowed
    names it is a prefix of, or that are a prefix of it (3 characters at least: ``"greedy"`` ->
    ``'greedy-drafts'``, ``"optimal_verifier"`` -> ``'optimal'``), those one edit away (a letter
    inserted, deleted, replaced, or two swapped: ``"otn"`` -> ``'otm'``) and those within
    :data:`SUGGEST_CUTOFF` of it by :func:`difflib.SequenceMatcher` (``"kseg"`` -> ``'kseq'``), at most
    two, prefixes first, then closest first. Anything else (``"top-k"`` where only ``'token'`` is
    near) gets no suggestion.

    Examples
    --------
    >>> from otspec._registry import suggest
    >>> suggest("k-seq", ["token", "kseq"]), suggest("top-k", ["token", "kseq"])
    (" (did you mean 'kseq'?)", '')
    """
    if not isinstance(name, str):
        return ""
    key = _fold(name)
    folded: dict[str, str] = {}
    for a in allowed:
        if isinstance(a, str):
            folded.setdefault(_fold(a), a)
    if not key:
        return ""
    if key in folded:
        close = [folded[key]]
    else:
        scored = []
        for f, a in folded.items():
            ratio = difflib.SequenceMatcher(None, key, f).ratio()
            prefix = min(len(key), len(f)) >= 3 and (f.startswith(key) or key.startswith(f))
            if prefix or ratio >= SUGGEST_CUTOFF or (min(len(key), len(f)) >= 3 and _one_edit(key, f)):
                scored.append((not prefix, -ratio, a))
        close = [a for *_, a in sorted(scored)[:2]]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def registered_spelling(name) -> str | None:
    """The registered name that ``name`` spells up to case and separators (``"K-Seq"`` -> ``"kseq"``), or None.

    For the messages of entry points that accept only some of the registered names: a name the
    registry knows under this spelling is explained (why it is not accepted there), not guessed at.

    Examples
    --------
    >>> import otspec
    >>> from otspec._registry import registered_spelling
    >>> registered_spelling("Top_K"), registered_spelling("spectr")
    ('top-k', None)
    """
    if not isinstance(name, str):
        return None
    if name in _REGISTRY:
        return name
    key = _fold(name)
    return next((n for n in _REGISTRY if _fold(n) == key), None)


def unknown_name_message(what: str, name, allowed, *, alternative: str = "", entries: bool = False,
                         note: str = "") -> str:
    """The one message for a name outside ``allowed``, with the suggestion of :func:`suggest`.

    ``"`what` must be one of ('a', 'b'){alternative}, got 'x' (did you mean 'a'?){note}"``; with
    ``entries=True`` (``what`` is a collection of names) ``"`what` entries must be among ..."``. A name
    that is not a string is shown by its type (``got int``), for a :class:`TypeError`.

    Parameters
    ----------
    what : str
        The parameter, without backticks (``"verifier"``, ``"method"``).
    name : object
        What was passed.
    allowed : iterable of str
        The accepted names, in the order to show.
    alternative : str, keyword-only
        What else is accepted, appended to the list (``" or a callable"``).
    entries : bool, keyword-only
        ``what`` holds several names and ``name`` is the first bad one.
    note : str, keyword-only
        Appended after the suggestion (e.g. why a registered name is not accepted here).

    Returns
    -------
    str

    Examples
    --------
    >>> from otspec._registry import unknown_name_message
    >>> unknown_name_message("verifier", "k-seq", ("token", "kseq"), alternative=" or a callable")
    "`verifier` must be one of ('token', 'kseq') or a callable, got 'k-seq' (did you mean 'kseq'?)"
    """
    allowed = tuple(allowed)
    subject = f"`{what}` entries must be among" if entries else f"`{what}` must be one of"
    got = f"{name!r}{suggest(name, allowed)}" if isinstance(name, str) else type(name).__name__
    return f"{subject} {allowed}{alternative}, got {got}{note}"


def validate_name(name, what: str, allowed, *, allow_none: bool = False):
    """``name`` if it is one of the strings ``allowed`` (or None with ``allow_none=True``), else the error of
    :func:`unknown_name_message`: a :class:`TypeError` for what is not a string (an array, a number: never
    compared, so an array gets no "truth value is ambiguous" error from numpy), a :class:`ValueError` for an
    unknown string.

    Examples
    --------
    >>> from otspec._registry import validate_name
    >>> validate_name("lp", "method", ("exact", "lp"))
    'lp'
    """
    if allow_none and name is None:
        return None
    allowed = tuple(allowed)
    if not isinstance(name, str):
        raise TypeError(unknown_name_message(what, name, allowed, alternative=" or None" if allow_none else ""))
    if name not in allowed:
        raise ValueError(unknown_name_message(what, name, allowed, alternative=" or None" if allow_none else ""))
    return name


def get_verifier(name, *, kind: str | None = None, block: bool = False) -> VerifierSpec:
    """The registered :class:`VerifierSpec` of ``name``.

    Parameters
    ----------
    name : str
        A registered name.
    kind, block
        As in :func:`verifier_names`: restrict the names accepted.

    Returns
    -------
    VerifierSpec

    Raises
    ------
    TypeError
        ``name`` is not a string.
    ValueError
        Unknown name (the message, built by :func:`unknown_name_message`,
        lists the accepted ones and suggests the closest, e.g. ``"k-seq"``:
        did you mean ``'kseq'``?; a registered name of another kind is
        explained instead).

    Examples
    --------
    >>> import otspec
    >>> otspec.multidraft.get_verifier("kseq").sequential
    True
    """
    kind = validate_name(kind, "kind", _KINDS, allow_none=True)  # before `name`: kind=3 blamed `name`
    return lookup_verifier(name, "name", kind=kind, block=validate_bool(block, "block"))


def lookup_verifier(name, what: str, *, kind: str | None = None, block: bool = False) -> VerifierSpec:
    """:func:`get_verifier` for a caller whose own parameter holds the name: its messages name ``what`` (the
    parameter as the caller's signature spells it, e.g. ``"verifier"``) instead of ``name``."""
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is not None and (kind is None or spec.kind == kind) and (not block or spec.build_block is not None):
        return spec  # the common case, without listing the accepted names
    allowed = verifier_names(kind=kind, block=block)
    if not isinstance(name, str):
        raise TypeError(unknown_name_message(what, name, allowed))
    if name not in allowed:
        other = ""
        meant = registered_spelling(name)
        if meant is not None and meant not in allowed:
            spec = _REGISTRY[meant]
            other = (f"; {meant!r} is registered but is a token-level verifier that does not run along a block"
                     if spec.kind == "token" and block else
                     f"; {meant!r} is registered but is a {spec.kind}-level verifier not accepted here")
        raise ValueError(unknown_name_message(what, name, allowed, note=other))
    return _REGISTRY[name]
