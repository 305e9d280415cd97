r"""The boundary-coin generator: a numpy Generator whose ``random()`` sometimes returns the ends of [0, 1).

A correct acceptance test ``u * p(x) < q(x)`` with ``u`` uniform on
:math:`[0, 1)` never accepts a draft with ``q(x) = 0``; the non-strict
``u * p(x) <= q(x)`` accepts it when ``u == 0.0`` exactly -- an event of
probability :math:`2^{-53}` per float64 coin (:math:`2^{-24}` per float32
coin), invisible to frequencies (SGLang issue #35771). The boundary-coin phase
of :func:`~otspec.testing.check_sampler` hands ``step`` a
:class:`BoundaryCoins` generator so that such a coin happens often.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BoundaryCoins", "BOUNDARY_FRACTION", "LARGEST_BELOW_ONE"]

#: Fraction of the uniforms returned by :meth:`BoundaryCoins.random` that are
#: boundary values (half of them 0.0, half the largest value below 1).
BOUNDARY_FRACTION = 0.5
#: The largest float64 and float32 below 1 (the top of [0, 1) in each precision).
LARGEST_BELOW_ONE = {
    np.dtype(np.float64): np.nextafter(np.float64(1.0), np.float64(0.0)),
    np.dtype(np.float32): np.nextafter(np.float32(1.0), np.float32(0.0)),
}


class BoundaryCoins(np.random.Generator):
    r"""A :class:`numpy.random.Generator` whose :meth:`random` returns exact boundary uniforms.

    Each value returned by :meth:`random` is, independently, ``0.0`` with
    probability ``BOUNDARY_FRACTION / 2``, the largest value below 1 in the
    requested dtype (``1 - 2**-53`` for float64, ``1 - 2**-24`` for float32)
    with probability ``BOUNDARY_FRACTION / 2``, and an honest uniform
    otherwise. Every other method (``integers``, ``choice``, ``uniform``,
    ``gumbel``, ...) is the parent class's, unchanged. It passes
    ``isinstance(rng, np.random.Generator)`` and ``np.random.default_rng(rng)``
    returns it unaltered, so code that routes ``rng`` through
    ``default_rng`` receives it.

    Parameters
    ----------
    bit_generator : numpy.random.BitGenerator
        The source of both the honest uniforms and the boundary decisions.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.testing import BoundaryCoins
    >>> coins = BoundaryCoins(np.random.PCG64(0))
    >>> u = coins.random(10_000)
    >>> bool((u == 0.0).any() and (u == np.nextafter(1.0, 0.0)).any() and (u < 1).all())
    True
    """

    def random(self, size=None, dtype=np.float64, out=None):
        """Uniforms on [0, 1) with boundary values mixed in (see the class docstring)."""
        u = super().random(size=size, dtype=dtype, out=out)
        dt = np.dtype(dtype)
        which = super().random(size=np.shape(u))
        lo = which < BOUNDARY_FRACTION / 2
        hi = (which >= BOUNDARY_FRACTION / 2) & (which < BOUNDARY_FRACTION)
        if np.ndim(u) == 0:
            if lo:
                return dt.type(0.0) if dt != np.float64 else 0.0
            if hi:
                top = LARGEST_BELOW_ONE[dt]
                return top if dt != np.float64 else float(top)
            return u
        u[lo] = 0.0
        u[hi] = LARGEST_BELOW_ONE[dt]
        return u
