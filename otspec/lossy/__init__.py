"""Lossy verification: mentored decoding, lenience, and the engines' lossy rules.

Mentored decoding's KL-optimal acceptance frontier (Tran-Thien, 2023),
Leviathan et al.'s lenience (arXiv:2211.17192, Appendix A.5), transformers'
ensemble verification and vLLM's typical acceptance, each as a verifier with
its exact output law. Notation: ``p`` draft, ``q`` target.
"""

from ._ensemble import EnsembleVerifier, ensemble_verifier
from ._lenience import LenienceCurve, LenientVerifier, lenience_curve, lenient_verifier
from ._mentored import (
    MentoredFrontier,
    MentoredResult,
    MentoredVerifier,
    kl_divergence,
    mentored,
    mentored_frontier,
    mentored_verifier,
)
from ._typical import TypicalAcceptanceVerifier, typical_acceptance_verifier

__all__ = [
    "EnsembleVerifier",
    "TypicalAcceptanceVerifier",
    "ensemble_verifier",
    "typical_acceptance_verifier",
    "LenienceCurve",
    "LenientVerifier",
    "MentoredFrontier",
    "MentoredResult",
    "MentoredVerifier",
    "kl_divergence",
    "lenience_curve",
    "lenient_verifier",
    "mentored",
    "mentored_frontier",
    "mentored_verifier",
]
