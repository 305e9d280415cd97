"""The distribution's name on the package index and the install hints of every optional dependency.

The import name is ``otspec``; the distribution is published as
:data:`DISTRIBUTION` (the index's ``otspec`` is an unrelated package of
OpenType constants). Every ``ImportError`` of the package that names an
install command builds it here.
"""

from __future__ import annotations

import importlib.util

__all__ = ["DISTRIBUTION", "check_installed", "install_hint"]

#: The name to ``pip install`` (the import name stays ``otspec``).
DISTRIBUTION = "otspec-verifiers"


def install_hint(extra: str) -> str:
    """The command installing the optional dependencies ``extra``: from the index, or from a clone."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (from a clone: pip install -e '.[{extra}]')"


def check_installed(module: str, purpose: str, extra: str) -> None:
    """Raise :class:`ImportError` naming ``purpose`` and :func:`install_hint` of ``extra`` unless ``module`` is installed.

    Nothing is imported (``otspec.plotting`` imports matplotlib only when a figure is drawn).
    """
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{purpose} needs the optional dependency `{module}`: {install_hint(extra)}")
