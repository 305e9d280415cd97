"""Profiles of a draft/target pair over contexts, and what they estimate about real decoding.

Notation: ``p`` is the draft law, ``q`` the target law. The theory of what a
profile's average estimates is in ``docs/theory/profile.rst``.
"""

from ._renewal import (
    RENEWAL_SCHEMES,
    RenewalEstimate,
    emission_probs,
    emission_probs_along,
    emission_probs_from_token_probs,
    palm_tokens_per_call,
    per_position_tokens_per_call,
    starts_recursion,
    tokens_per_call,
)

__all__ = [
    "RENEWAL_SCHEMES",
    "RenewalEstimate",
    "emission_probs",
    "emission_probs_along",
    "emission_probs_from_token_probs",
    "palm_tokens_per_call",
    "per_position_tokens_per_call",
    "starts_recursion",
    "tokens_per_call",
]
