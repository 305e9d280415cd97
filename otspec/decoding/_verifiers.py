r"""Which package verifier runs at each verification step, resolved lazily by name.

Token-level schemes (SpecTr's DraftSelection over ``k`` i.i.d. draft
sequences; ``k = 1`` is Leviathan's speculative sampling) call a builder
``(p, q, k) -> otspec.Verifier`` at every depth, with ``k`` the number of
drafts still alive. Block schemes (``k = 1``) hand the whole draft block to
:mod:`otspec.block`. Names, builders and properties come from the one
registry, :data:`otspec.multidraft.VERIFIERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..multidraft._registry import get_verifier, verifier_names

__all__ = [
    "VERIFIER_NAMES",
    "decoding_names",
    "resolve_scheme",
    "Scheme",
]


def decoding_names() -> tuple[str, ...]:
    """Registered verifiers the decoding loop runs: i.i.d.-draft token-level schemes and block schemes."""
    return tuple(
        n for n in verifier_names() if get_verifier(n).kind == "block" or get_verifier(n).draft_process == "iid"
    )


#: Names accepted by ``verifier=`` at import (the registry, :data:`otspec.multidraft.VERIFIERS`, is
#: read again at every call, so verifiers registered later are accepted too).
VERIFIER_NAMES = decoding_names()
#: largest support (|supp p ∪ supp q|) the LP plan is built on
LP_MAX_SUPPORT = 64


@dataclass(frozen=True)
class Scheme:
    """A resolved verification scheme.

    Attributes
    ----------
    name : str
        The verifier's name (or the callable's ``__name__``).
    kind : {"token", "block"}
        Token-level DraftSelection or whole-block verification.
    build : callable or None
        ``(p, q, k) -> Verifier`` for token-level schemes.
    lossless : bool or None
        Known losslessness (None for a user callable: asked from the verifier).
    """

    name: str
    kind: str
    build: Callable | None
    lossless: bool | None


def resolve_scheme(verifier, *, k: int, truncated: bool, options: dict | None) -> Scheme:
    """Validate ``verifier`` against ``k`` and the sampling; return its :class:`Scheme`.

    Raises
    ------
    ValueError
        Unknown name, a single-draft scheme with ``k > 1``, ``"lp"``
        without top-k / top-p truncation, options for a scheme that takes none.
    TypeError
        ``verifier`` neither a name nor a callable; ``options`` not a dict.
    """
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(f"`verifier_options` must be a dict or None, got {type(options).__name__}")
    if callable(verifier) and not isinstance(verifier, str):
        opts = dict(options)

        def build_callable(p, q, k):
            return verifier(p, q, k, **opts)

        return Scheme(getattr(verifier, "__name__", "custom"), "token", build_callable, None)
    names = decoding_names()
    if not isinstance(verifier, str):
        raise TypeError(
            f"`verifier` must be one of {names} or a callable (p, q, k) -> Verifier, "
            f"got {type(verifier).__name__}"
        )
    if verifier not in names:
        raise ValueError(f"`verifier` must be one of {names} or a callable, got {verifier!r}")
    spec = get_verifier(verifier)
    if spec.single_draft and k != 1:
        raise ValueError(
            f"`verifier`={verifier!r} verifies a single draft sequence, so `k` must be 1, "
            f"got {k}"
        )
    if verifier == "lp" and not truncated:
        raise ValueError(
            "`verifier`='lp' solves an LP over the draft sets of the support, which needs a truncated "
            "vocabulary: pass `top_k` (e.g. 8-32) or `top_p`"
        )
    extra = set(options) - spec.options
    if extra:
        raise ValueError(
            f"`verifier_options` for {verifier!r} accepts {sorted(spec.options)}, got unknown keys {sorted(extra)}"
        )
    missing = spec.required - set(options)
    if missing:
        raise ValueError(
            f"`verifier`={verifier!r} needs options {sorted(missing)}: pass verifier_options={{...}}"
            + (" (the KL budget)" if verifier == "mentored" else "")
        )
    if spec.kind == "block":
        return Scheme(verifier, "block", None, spec.lossless)
    opts = dict(options)
    if verifier == "lp":

        def build(p, q, k):
            if p.shape[0] > LP_MAX_SUPPORT:
                raise ValueError(
                    f"`verifier`='lp' met a support of {p.shape[0]} tokens (above {LP_MAX_SUPPORT}); "
                    "lower `top_k` / `top_p`"
                )
            return spec.build(p, q, k)

    else:

        def build(p, q, k):
            return spec.build(p, q, k, **opts)

    return Scheme(verifier, "token", build, spec.lossless)
