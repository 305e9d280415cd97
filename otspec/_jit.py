"""Optional numba compilation of the package's scalar kernels (the ``fast`` extra), in one place.

A kernel module writes its loops in plain Python on scalars and calls
:func:`compile_in` on its own globals: with numba installed the named
functions are replaced by their ``njit`` versions (rebinding the module
globals, so compiled kernels call compiled helpers); without it nothing
changes and the module runs as CPython (or uses a vectorised fallback).
"""

from __future__ import annotations

try:  # pragma: no cover - exercised when the ``fast`` extra is installed
    import numba as _numba
except ImportError:  # pragma: no cover
    _numba = None

#: Whether numba is installed.
HAVE_NUMBA = _numba is not None


def compile_in(namespace: dict, names) -> bool:
    """Replace ``namespace[name]`` by ``numba.njit(cache=True)`` of it for each name; return whether numba did it."""
    if _numba is None:  # pragma: no cover
        return False
    for name in names:  # pragma: no cover - with numba
        namespace[name] = _numba.njit(cache=True)(namespace[name])
    return True
