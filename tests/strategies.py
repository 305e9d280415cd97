"""Thin re-export: the strategies are public in :mod:`otspec.testing.strategies` (import them from there)."""

from otspec.testing.strategies import SamplingLaw, distributions, pairs, sampling_laws, special_pairs

__all__ = ["SamplingLaw", "distributions", "pairs", "sampling_laws", "special_pairs"]
