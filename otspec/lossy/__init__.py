"""Lossy verification: mentored decoding and lenience.

Mentored decoding's KL-optimal acceptance frontier (Tran-Thien, 2023) and
Leviathan et al.'s lenience (arXiv:2211.17192, Appendix A.5), each as a
verifier with its exact output law. Notation: ``p`` draft, ``q`` target.
"""

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

__all__ = [
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
