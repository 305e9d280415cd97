r"""The package's own token-level and lossy verifiers, registered in :mod:`otspec._registry`.

This module sits above the families it lists (:mod:`otspec.multidraft`,
:mod:`otspec.lossy`, :mod:`otspec.otm`) and below the readers of the
registry (:mod:`otspec.block`, :mod:`otspec.spectr`, :mod:`otspec.decoding`);
``import otspec`` imports it before any of those. Notation: ``p`` draft,
``q`` target, ``k`` drafts per position.
"""

from __future__ import annotations

from ._registry import VerifierSpec, register_verifier
from ._validation import validate_k
from .lossy._ensemble import ensemble_verifier
from .lossy._mentored import mentored, mentored_verifier
from .lossy._typical import typical_acceptance_verifier
from .multidraft._deterministic import top_k_verifier
from .multidraft._greedy_drafts import greedy_draft_verifier
from .multidraft._khisti import khisti_verifier
from .multidraft._kseq import kseq
from .multidraft._maximal_coupling import maximal_coupling
from .multidraft._multiround import multiround
from .multidraft._optimal_verifier import optimal_verifier
from .multidraft._without_replacement import without_replacement_verifier
from .otm._lp import otm_lp

__all__: list[str] = []


def _single(name, k):
    k = validate_k(k)  # a bool, float or array k is a TypeError, as for the multi-draft verifiers
    if k != 1:
        raise ValueError(f"`verifier`={name!r} verifies a single draft, so `k` must be 1, got {k}")


def _token(p, q, k):
    _single("token", k)
    return maximal_coupling(p, q)


def _kseq(p, q, k, **options):
    return kseq(p, q, k, **options)


def _multiround(p, q, k):
    return multiround(p, q, k, replacement=True)  # i.i.d. drafts


def _optimal(p, q, k):
    return optimal_verifier(p, q, k)


def _lp(p, q, k):
    return otm_lp(p, q, k, raise_on_failure=True).verifier


def _mentored(p, q, k, *, D, method="exact"):
    _single("mentored", k)
    return mentored_verifier(p, q, D, method=method)


def _without_replacement(p, q, k):
    return without_replacement_verifier(p, q, k)


def _greedy_drafts(p, q, k):
    return greedy_draft_verifier(p, q, k)


def _top_k(p, q, k):
    return top_k_verifier(p, q, k)


def _khisti(p, q, k):
    return khisti_verifier(p, q, k)


def _ensemble(p, q, k, *, w):
    _single("ensemble", k)
    return ensemble_verifier(p, q, w)


def _typical(p, q, k, **options):
    _single("typical", k)
    return typical_acceptance_verifier(p, q, **options)


_LEVIATHAN = "Leviathan et al., arXiv:2211.17192, Algorithm 1"
_SPECTR = "Sun et al., SpecTr, arXiv:2310.15141"
for _spec in (
    VerifierSpec("token", "token", _token, aliases=(maximal_coupling,), symmetric=True, single_draft=True,
                 summary="speculative sampling (maximal coupling)", reference=_LEVIATHAN),
    VerifierSpec("kseq", "token", _kseq, aliases=(kseq,), symmetric=False, sequential=True, options=frozenset({"rho"}),
                 summary="k-Seq", reference=f"{_SPECTR}, Algorithm 2"),
    VerifierSpec("multiround", "token", _multiround, aliases=(multiround,), symmetric=False, sequential=True,
                 summary="recursive rejection sampling, i.i.d. drafts",
                 reference="Miao et al., SpecInfer, arXiv:2305.09781; Yang et al., arXiv:2402.09221"),
    VerifierSpec("optimal", "token", _optimal, aliases=(optimal_verifier,), symmetric=True,
                 summary="exactly optimal multi-draft verifier (acceptance alpha_k)",
                 reference="otspec docs/theory/optimal_verifier.rst"),
    VerifierSpec("lp", "token", _lp, aliases=(otm_lp,), symmetric=True, summary="OTM-k LP plan",
                 reference=f"{_SPECTR}, eq. (4)"),
    VerifierSpec("mentored", "token", _mentored, aliases=(mentored_verifier, mentored),
                 symmetric=True, single_draft=True, lossless=False,
                 options=frozenset({"D", "method"}), required=frozenset({"D"}),
                 summary="mentored decoding at KL budget D (lossy)",
                 reference="Tran-Thien, mentored decoding (2023), eqs. (26)-(28)"),
):
    register_verifier(_spec)
del _spec

_HU = "Hu et al., arXiv:2502.18779 (ICLR 2025)"
for _spec in (
    VerifierSpec("without-replacement", "token", _without_replacement, aliases=(without_replacement_verifier,), symmetric=True,
                 draft_process="without_replacement",
                 summary="optimal verifier for k distinct drafts drawn without replacement (LP plan over sets)",
                 reference=_HU),
    VerifierSpec("greedy-drafts", "token", _greedy_drafts, aliases=(greedy_draft_verifier,), draft_process="greedy",
                 summary="top k-1 drafts fixed, the last sampled off them, optimal verifier", reference=_HU),
    VerifierSpec("top-k", "token", _top_k, aliases=(top_k_verifier,), draft_process="deterministic",
                 summary="top-k candidate set, recursive rejection with draft probability 1",
                 reference="Miao et al., SpecInfer, arXiv:2305.09781; Li et al., EAGLE, arXiv:2401.15077"),
    VerifierSpec("khisti", "token", _khisti, aliases=(khisti_verifier,), symmetric=True,
                 summary="importance-sampling selection then single-draft speculative sampling (optimal selection)",
                 reference="Khisti et al., arXiv:2410.18234 (ICLR 2025), canonical decomposition"),
    VerifierSpec("ensemble", "token", _ensemble, aliases=(ensemble_verifier,), symmetric=True, single_draft=True, lossless=False,
                 options=frozenset({"w"}), required=frozenset({"w"}),
                 summary="transformers' ensemble verification (assistant_ensemble_weight, lossy)",
                 reference="DIVERSED, arXiv:2604.07622; transformers _speculative_sampling"),
    VerifierSpec("typical", "token", _typical, aliases=(typical_acceptance_verifier,),
                 symmetric=True, single_draft=True, lossless=False,
                 options=frozenset({"epsilon", "delta", "guard"}),
                 summary="typical acceptance with vLLM's defaults (lossy)",
                 reference="Cai et al., Medusa, arXiv:2401.10774, §3.3.1; vLLM TypicalAcceptanceSampler"),
):
    register_verifier(_spec)
del _spec
