r"""The one registry of named verifiers, read by :mod:`otspec.spectr`, :mod:`otspec.block` and :mod:`otspec.decoding`.

Every name a user can pass as ``verifier="..."`` anywhere in otspec is
registered here once, with the properties the exact analyses and the
decoding loop rely on. Notation: ``p`` is the draft law, ``q`` the target
law, ``k`` the number of drafts verified at one position.

A token-level verifier (``kind="token"``) is built by
``spec.build(p, q, k, **options) -> otspec.Verifier``; a block-level one
(``kind="block"``) by ``spec.build_block(draft, target, L, **kw) ->
otspec.block.BlockVerifier``. ``"token"`` has both: the maximal coupling at
one position, and per-token speculative sampling along a block
(Leviathan et al., arXiv:2211.17192, Algorithm 1). :mod:`otspec.block`
registers its block verifiers here when it is imported (``import otspec``
imports it), so the registry is complete once ``otspec`` is imported.

To add a verifier: write it as a :class:`otspec.Verifier` (or a
:class:`otspec.block.BlockVerifier`) in the subpackage of its chapter, then
call :func:`register_verifier` here with its builder and properties.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["VERIFIERS", "VerifierSpec", "get_verifier", "register_verifier", "verifier_names"]

_KINDS = ("token", "block")


@dataclass(frozen=True)
class VerifierSpec:
    """A registered verifier: how to build it and what it guarantees.

    Attributes
    ----------
    name : str
        The name accepted by ``verifier=``.
    kind : {"token", "block"}
        ``"token"``: ``k`` drafts at one position to one token (built by
        ``build``); ``"block"``: one draft block of length ``L`` (built by
        ``build_block`` only).
    build : callable or None
        ``(p, q, k, **options) -> Verifier`` (token-level schemes).
    build_block : callable or None
        ``(draft, target, L, **kw) -> BlockVerifier`` (block-level schemes,
        and ``"token"`` run along a block).
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
        from ``p``).
    summary : str
        One line for tables and error messages.
    reference : str
        The paper (authors, arXiv id, section) that defines it.
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
    if spec.kind not in _KINDS:
        raise ValueError(f"`spec.kind` must be one of {_KINDS}, got {spec.kind!r}")
    if spec.kind == "token" and spec.build is None:
        raise ValueError(f"token-level verifier {spec.name!r} needs `build` (p, q, k, **options) -> Verifier")
    if spec.kind == "block" and spec.build_block is None:
        raise ValueError(f"block-level verifier {spec.name!r} needs `build_block` (draft, target, L) -> BlockVerifier")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"a verifier named {spec.name!r} is already registered (pass replace=True)")
    _REGISTRY[spec.name] = spec
    return spec


def verifier_names(*, kind: str | None = None, block: bool = False) -> tuple[str, ...]:
    """Registered names, in registration order.

    Parameters
    ----------
    kind : {"token", "block"} or None, keyword-only
        Only verifiers of this kind.
    block : bool, keyword-only
        Only verifiers that can run along a draft block (``build_block``).

    Returns
    -------
    tuple of str

    Raises
    ------
    Nothing
        Any ``kind`` is accepted (an unknown one matches no verifier).

    Examples
    --------
    >>> from otspec.multidraft import verifier_names
    >>> "kseq" in verifier_names(kind="token"), "block" in verifier_names(kind="token")
    (True, False)
    """
    return tuple(
        name
        for name, s in _REGISTRY.items()
        if (kind is None or s.kind == kind) and (not block or s.build_block is not None)
    )


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
        Unknown name (the message lists the accepted ones).

    Examples
    --------
    >>> import otspec
    >>> otspec.multidraft.get_verifier("kseq").sequential
    True
    """
    allowed = verifier_names(kind=kind, block=block)
    if not isinstance(name, str):
        raise TypeError(f"`verifier` must be one of {allowed}, got {type(name).__name__}")
    if name not in allowed:
        raise ValueError(f"`verifier` must be one of {allowed}, got {name!r}")
    return _REGISTRY[name]


# ----------------------------------------------------------------------------- builders
def _token(p, q, k):
    from ._maximal_coupling import maximal_coupling

    if k != 1:
        raise ValueError(f"`verifier`='token' verifies a single draft, so `k` must be 1, got {k}")
    return maximal_coupling(p, q)


def _kseq(p, q, k, **options):
    from ._kseq import kseq

    return kseq(p, q, k, **options)


def _multiround(p, q, k):
    from ._multiround import multiround

    return multiround(p, q, k, replacement=True)  # i.i.d. drafts


def _optimal(p, q, k):
    from ._optimal_verifier import optimal_verifier

    return optimal_verifier(p, q, k)


def _lp(p, q, k):
    from ..otm._lp import otm_lp

    return otm_lp(p, q, k, raise_on_failure=True).verifier


def _mentored(p, q, k, *, D, method="exact"):
    from ..lossy._mentored import mentored_verifier

    if k != 1:
        raise ValueError(f"`verifier`='mentored' verifies a single draft, so `k` must be 1, got {k}")
    return mentored_verifier(p, q, D, method=method)


_LEVIATHAN = "Leviathan et al., arXiv:2211.17192, Algorithm 1"
_SPECTR = "Sun et al., SpecTr, arXiv:2310.15141"
for _spec in (
    VerifierSpec("token", "token", _token, symmetric=True, single_draft=True,
                 summary="speculative sampling (maximal coupling)", reference=_LEVIATHAN),
    VerifierSpec("kseq", "token", _kseq, symmetric=False, sequential=True, options=frozenset({"rho"}),
                 summary="k-Seq", reference=f"{_SPECTR}, Algorithm 2"),
    VerifierSpec("multiround", "token", _multiround, symmetric=False, sequential=True,
                 summary="recursive rejection sampling, i.i.d. drafts",
                 reference="Miao et al., SpecInfer, arXiv:2305.09781; Yang et al., arXiv:2402.09221"),
    VerifierSpec("optimal", "token", _optimal, symmetric=True,
                 summary="exactly optimal multi-draft verifier (acceptance alpha_k)",
                 reference="otspec docs/theory/optimal_verifier.rst"),
    VerifierSpec("lp", "token", _lp, symmetric=True, summary="OTM-k LP plan",
                 reference=f"{_SPECTR}, eq. (4)"),
    VerifierSpec("mentored", "token", _mentored, symmetric=True, single_draft=True, lossless=False,
                 options=frozenset({"D", "method"}), required=frozenset({"D"}),
                 summary="mentored decoding at KL budget D (lossy)",
                 reference="Tran-Thien, mentored decoding (2023), eqs. (26)-(28)"),
):
    register_verifier(_spec)
del _spec


# ------------------------------------------------- draft processes beyond i.i.d. and the engines' lossy rules
def _single(name, k):
    if k != 1:
        raise ValueError(f"`verifier`={name!r} verifies a single draft, so `k` must be 1, got {k}")


def _without_replacement(p, q, k):
    from ._without_replacement import without_replacement_verifier

    return without_replacement_verifier(p, q, k)


def _greedy_drafts(p, q, k):
    from ._greedy_drafts import greedy_draft_verifier

    return greedy_draft_verifier(p, q, k)


def _top_k(p, q, k):
    from ._deterministic import top_k_verifier

    return top_k_verifier(p, q, k)


def _khisti(p, q, k):
    from ._khisti import khisti_verifier

    return khisti_verifier(p, q, k)


def _ensemble(p, q, k, *, w):
    from ..lossy._ensemble import ensemble_verifier

    _single("ensemble", k)
    return ensemble_verifier(p, q, w)


def _typical(p, q, k, **options):
    from ..lossy._typical import typical_acceptance_verifier

    _single("typical", k)
    return typical_acceptance_verifier(p, q, **options)


_HU = "Hu et al., arXiv:2502.18779 (ICLR 2025)"
for _spec in (
    VerifierSpec("without-replacement", "token", _without_replacement, symmetric=True,
                 draft_process="without_replacement",
                 summary="optimal verifier for k distinct drafts drawn without replacement (LP plan over sets)",
                 reference=_HU),
    VerifierSpec("greedy-drafts", "token", _greedy_drafts, draft_process="greedy",
                 summary="top k-1 drafts fixed, the last sampled off them, optimal verifier", reference=_HU),
    VerifierSpec("top-k", "token", _top_k, draft_process="deterministic",
                 summary="top-k candidate set, recursive rejection with draft probability 1",
                 reference="Miao et al., SpecInfer, arXiv:2305.09781; Li et al., EAGLE, arXiv:2401.15077"),
    VerifierSpec("khisti", "token", _khisti, symmetric=True,
                 summary="importance-sampling selection then single-draft speculative sampling (optimal selection)",
                 reference="Khisti et al., arXiv:2410.18234 (ICLR 2025), canonical decomposition"),
    VerifierSpec("ensemble", "token", _ensemble, symmetric=True, single_draft=True, lossless=False,
                 options=frozenset({"w"}), required=frozenset({"w"}),
                 summary="transformers' ensemble verification (assistant_ensemble_weight, lossy)",
                 reference="DIVERSED, arXiv:2604.07622; transformers _speculative_sampling"),
    VerifierSpec("typical", "token", _typical, symmetric=True, single_draft=True, lossless=False,
                 options=frozenset({"epsilon", "delta", "guard"}),
                 summary="typical acceptance with vLLM's defaults (lossy)",
                 reference="Cai et al., Medusa, arXiv:2401.10774, §3.3.1; vLLM TypicalAcceptanceSampler"),
):
    register_verifier(_spec)
del _spec
