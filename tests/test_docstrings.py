"""Every public function documents itself the same way (numpydoc), with a runnable example.

A public function is one a user reaches through a documented namespace: ``otspec`` and its public
submodules (their ``__all__``). Each must have

* a ``Parameters`` section when it takes parameters,
* a ``Returns`` (or ``Yields``) section unless it returns None,
* a ``Raises`` section (every entry point validates its input),
* a ``References`` section when its text cites a paper (arXiv id, "et al.", SpecTr, Leviathan, ...),
* an ``Examples`` section with at least one ``>>>`` line (run by the doctest collection of the suite).
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

numpydoc_docscrape = pytest.importorskip("numpydoc.docscrape")

#: namespaces whose ``__all__`` is public API (optional ones are skipped when their extra is missing)
NAMESPACES = (
    "otspec",
    "otspec.closed_form",
    "otspec.models",
    "otspec.speculative",
    "otspec.testing",
    "otspec.tree",
    "otspec.block",
    "otspec.spectr",
    "otspec.otm",
    "otspec.multidraft",
    "otspec.lossy",
)
OPTIONAL = {
    "otspec.decoding": "torch",
    "otspec.plotting.multidraft": "matplotlib",
    "otspec.plotting.block": "matplotlib",
    "otspec.plotting.lossy": "matplotlib",
    "otspec.plotting.spectr": "matplotlib",
}
_CITES = re.compile(r"arXiv|et al\.|SpecTr|Leviathan|Algorithm \d|Theorem \d|\bLemma\b|\beq\. ?\(?\d")


def _public_functions():
    seen = {}
    names = list(NAMESPACES)
    for mod, dep in OPTIONAL.items():
        try:
            importlib.import_module(dep)
        except ImportError:
            continue
        names.append(mod)
    for modname in names:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name, None)
            if inspect.isfunction(obj) and not name.startswith("_"):
                seen.setdefault(id(obj), (f"{obj.__module__}.{obj.__qualname__}", obj))
    return sorted(seen.values(), key=lambda t: t[0])


FUNCTIONS = _public_functions()


def _returns_none(fn) -> bool:
    ann = inspect.signature(fn).return_annotation
    return ann is None or ann == "None"


def missing_sections(fn) -> list[str]:
    """The numpydoc sections ``fn``'s docstring lacks (empty when complete)."""
    doc = inspect.getdoc(fn) or ""
    parsed = numpydoc_docscrape.FunctionDoc(fn)
    out = []
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if params and not parsed["Parameters"]:
        out.append("Parameters")
    if not _returns_none(fn) and not (parsed["Returns"] or parsed["Yields"]):
        out.append("Returns")
    if not parsed["Raises"]:
        out.append("Raises")
    body = doc.split("References\n----------")[0]
    if _CITES.search(body) and not parsed["References"]:
        out.append("References")
    if ">>>" not in "\n".join(parsed["Examples"]):
        out.append("Examples")
    return out


def test_there_are_public_functions():
    assert len(FUNCTIONS) > 50


@pytest.mark.parametrize("qualname,fn", FUNCTIONS, ids=[q for q, _ in FUNCTIONS])
def test_public_function_docstring_is_complete(qualname, fn):
    missing = missing_sections(fn)
    assert not missing, f"{qualname} lacks the docstring section(s) {missing}"
