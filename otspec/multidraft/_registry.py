"""The registry moved above the verifier families: :mod:`otspec._registry` (its entries: ``otspec._catalogue``).

Kept so that ``from otspec.multidraft._registry import ...`` inside the package keeps working;
``otspec.multidraft.VERIFIERS``, ``get_verifier``, ``register_verifier``, ``verifier_names`` and
``VerifierSpec`` are the same objects.
"""

from .._registry import VERIFIERS, VerifierSpec, get_verifier, register_verifier, verifier_names

__all__ = ["VERIFIERS", "VerifierSpec", "get_verifier", "register_verifier", "verifier_names"]
