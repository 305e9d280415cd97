"""The four user tasks' traps (issue 16), each pinned by a test.

1. analysis scripts: ``import otspec`` reaches every submodule the README lists (``decoding`` and
   ``plotting`` lazily, importing neither torch nor matplotlib until used); ``help(otspec)`` says
   what the package is and where to start.
2. figures: covered by tests/test_plotting_*.py and docs/guide/figures.rst.
3. property-based validity tests: every verifier meets one contract — ``sample_drafts`` (its own
   draft law), ``sample``, ``acceptance``, ``output_law`` — checked here by a chi-square test of
   ``sample(sample_drafts())`` against ``output_law()`` (false-failure rate 1e-6 per verifier)
   and by exact enumeration of the acceptance.
4. small-vocabulary decoding: prompts as tokenizers return them, the LP plan without truncation
   at small V, ``top_p=1.0``, package builders and result-returning callables as ``verifier=``,
   transformers' nucleus rule.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

import otspec
from otspec.testing import chi2_gof

P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.2, 0.6])


# ----------------------------------------------------------------------------- task 1
def test_import_otspec_reaches_every_listed_submodule_lazily():
    code = (
        "import sys, otspec\n"
        "for name in ('block', 'spectr', 'models', 'speculative', 'closed_form', 'testing', 'otm', "
        "'multidraft', 'lossy'):\n"
        "    getattr(otspec, name)\n"
        "assert 'torch' not in sys.modules and 'matplotlib' not in sys.modules, 'eager heavy import'\n"
        "assert 'plotting' in dir(otspec) and 'decoding' in dir(otspec)\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('matplotlib'):\n"
        "    assert otspec.plotting.multidraft.plot_spectr_fig4 is otspec.plotting.plot_spectr_fig4\n"
        "    assert 'matplotlib' not in sys.modules  # imported when a figure is drawn\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_decoding_is_reached_from_otspec():
    pytest.importorskip("torch")
    mod = otspec.__getattr__("decoding")  # what `otspec.decoding` calls before the first import
    assert mod.speculative_decode is otspec.decoding.speculative_decode


def test_unknown_attribute_still_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        otspec.nope  # noqa: B018


def test_help_opens_with_what_and_where_to_start():
    doc = otspec.__doc__
    first = doc.strip().splitlines()[0]
    assert "speculative" in first.lower()
    assert "Where to start" in doc and "alpha_k" in doc and "docs/guide" in doc


# ----------------------------------------------------------------------------- task 3
def _verifiers():
    return {
        "maximal_coupling": otspec.maximal_coupling(P, Q),
        "kseq": otspec.kseq(P, Q, 2),
        "multiround": otspec.multiround(P, Q, 2),
        "multiround-wor": otspec.multiround(P, Q, 2, replacement=False),
        "optimal": otspec.optimal_verifier(P, Q, 2),
        "lp": otspec.otm_lp(P, Q, 2).verifier,
        "lenient": otspec.lenient_verifier(P, Q, 0.5),
        "mentored": otspec.mentored(P, Q, 0.05).verifier,
    }


@pytest.mark.parametrize("name", list(_verifiers()))
def test_every_verifier_meets_the_contract(name):
    v = _verifiers()[name]
    assert isinstance(v, otspec.Verifier)
    rng = np.random.default_rng(2024)
    n = 4000
    drafts = [v.sample_drafts(rng=rng) for _ in range(n)]
    assert all(len(x) == v.k for x in drafts)
    ys = np.array([v.sample(x, rng=rng) for x in drafts])
    gof = chi2_gof(np.bincount(ys, minlength=v.n), v.output_law(), alpha_fail=1e-6)
    assert gof.passed, (name, gof)
    chk = otspec.check_lossless(v)
    assert abs(chk.acceptance - v.acceptance()) <= 1e-9
    assert chk.max_law_error <= 1e-9  # output_law() is the exact output law
    # the drafts follow the verifier's own draft law
    cells = list(itertools.product(range(v.n), repeat=v.k))
    law = np.array([v.draft_law_of(t) for t in cells])
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    index = {t: i for i, t in enumerate(cells)}
    counts = np.bincount([index[tuple(x)] for x in drafts], minlength=len(cells))
    assert chi2_gof(counts, law, alpha_fail=1e-6).passed


def test_sample_drafts_is_on_the_base_class():
    assert "sample_drafts" in otspec.Verifier.__dict__


def test_result_objects_carry_the_verifier_as_an_attribute():
    assert isinstance(otspec.otm_lp(P, Q, 2).verifier, otspec.Verifier)
    assert isinstance(otspec.mentored(P, Q, 0.05).verifier, otspec.Verifier)
