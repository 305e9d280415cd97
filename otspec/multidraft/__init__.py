"""Token-level verifiers: ``k`` drafts at one position to one output token.

The maximal coupling (``k = 1``, Leviathan et al., arXiv:2211.17192), SpecTr's
k-Seq (Sun et al., arXiv:2310.15141, Algorithm 2), recursive rejection
sampling (multi-round), the exactly optimal multi-draft verifier and its
submodular machinery, and (re-exported from :mod:`otspec._registry`) the one
registry of verifier names (:data:`VERIFIERS`) that :mod:`otspec.spectr`, :mod:`otspec.block` and
:mod:`otspec.decoding` read. Notation: ``p`` draft, ``q`` target.
"""

from .._registry import VERIFIERS, VerifierSpec, get_verifier, register_verifier, verifier_names
from ._batched import batched_kseq_acceptance, batched_kseq_rho_star, batched_maximal_coupling_acceptance
from ._deterministic import TopKVerifier, top_k_verifier
from ._greedy_drafts import GreedyDraftVerifier, greedy_draft_verifier
from ._khisti import KhistiVerifier, khisti_acceptance_one, khisti_alpha2, khisti_verifier
from ._kseq import KSeq, kseq, kseq_beta, kseq_p_acc, kseq_residual, kseq_rho_star
from ._maximal_coupling import MaximalCoupling, RatioTestVerifier, maximal_coupling
from ._multiround import MultiRound, multiround
from ._optimal_verifier import OptimalVerifier, optimal_verifier
from ._priority_keys import PriorityKeyVerifier
from ._without_replacement import DraftProcessVerifier, WithoutReplacementVerifier, without_replacement_verifier

__all__ = [
    "DraftProcessVerifier",
    "WithoutReplacementVerifier",
    "without_replacement_verifier",
    "GreedyDraftVerifier",
    "greedy_draft_verifier",
    "TopKVerifier",
    "top_k_verifier",
    "KhistiVerifier",
    "khisti_acceptance_one",
    "khisti_alpha2",
    "khisti_verifier",
    "VERIFIERS",
    "KSeq",
    "MaximalCoupling",
    "MultiRound",
    "OptimalVerifier",
    "PriorityKeyVerifier",
    "RatioTestVerifier",
    "VerifierSpec",
    "batched_kseq_acceptance",
    "batched_kseq_rho_star",
    "batched_maximal_coupling_acceptance",
    "get_verifier",
    "kseq",
    "kseq_beta",
    "kseq_p_acc",
    "kseq_residual",
    "kseq_rho_star",
    "maximal_coupling",
    "multiround",
    "optimal_verifier",
    "register_verifier",
    "verifier_names",
]
