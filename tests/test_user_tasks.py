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
# each verifier built in its own test, not at collection (building them all there compiled numba's alpha and key
# kernels in every xdist worker at once, before any test ran)
_VERIFIERS = {
    "maximal_coupling": lambda: otspec.maximal_coupling(P, Q),
    "kseq": lambda: otspec.kseq(P, Q, 2),
    "multiround": lambda: otspec.multiround(P, Q, 2),
    "multiround-wor": lambda: otspec.multiround(P, Q, 2, replacement=False),
    "optimal": lambda: otspec.optimal_verifier(P, Q, 2),
    "lp": lambda: otspec.otm_lp(P, Q, 2).verifier,
    "lenient": lambda: otspec.lenient_verifier(P, Q, 0.5),
    "mentored": lambda: otspec.mentored(P, Q, 0.05).verifier,
}


@pytest.mark.parametrize("name", list(_VERIFIERS))
def test_every_verifier_meets_the_contract(name):
    v = _VERIFIERS[name]()
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


@pytest.mark.parametrize("name", otspec.multidraft.verifier_names(kind="token"))
def test_every_registered_verifier_samples_its_own_drafts(name):
    spec = otspec.get_verifier(name)
    defaults = {"D": 0.05, "w": 0.5}
    if not spec.required <= set(defaults):
        pytest.skip(f"no default for the required options {sorted(spec.required)}")
    v = spec.build(P, Q, 1 if spec.single_draft else 2, **{o: defaults[o] for o in spec.required})
    rng = np.random.default_rng(7)
    ys = np.array([v.sample(v.sample_drafts(rng=rng), rng=rng) for _ in range(3000)])
    assert chi2_gof(np.bincount(ys, minlength=v.n), v.output_law(), alpha_fail=1e-6).passed


def test_sample_drafts_is_on_the_base_class():
    assert "sample_drafts" in otspec.Verifier.__dict__


def test_result_objects_carry_the_verifier_as_an_attribute():
    assert isinstance(otspec.otm_lp(P, Q, 2).verifier, otspec.Verifier)
    assert isinstance(otspec.mentored(P, Q, 0.05).verifier, otspec.Verifier)


# ----------------------------------------------------------------------------- task 4
def _toy(V=6):
    torch = pytest.importorskip("torch")
    import otspec.decoding as D

    g = torch.Generator().manual_seed(0)
    tq = torch.randn(V, V, generator=g, dtype=torch.float64) * 2
    tp = tq + 0.7 * torch.randn(V, V, generator=g, dtype=torch.float64)
    return D, D.CallableLM(lambda ids: tq[ids], V), D.CallableLM(lambda ids: tp[ids], V)


def test_prompts_as_tokenizers_return_them():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    D, target, draft = _toy()
    want = D.speculative_decode([0, 1], draft=draft, target=target, max_new_tokens=6, rng=3).tokens
    enc = transformers.BatchEncoding({"input_ids": [0, 1], "attention_mask": [1, 1]})
    for prompt in (torch.tensor([0, 1]), torch.tensor([[0, 1]]), np.array([0, 1]), (0, 1), {"input_ids": [[0, 1]]},
                   enc, transformers.BatchEncoding({"input_ids": torch.tensor([[0, 1]])})):
        got = D.speculative_decode(prompt, draft=draft, target=target, max_new_tokens=6, rng=3).tokens
        assert np.array_equal(got, want), type(prompt)
    bad = [
        ("Hello", TypeError, "got a str .'Hello'.: tokenize it first"),
        ({"text": "Hello"}, TypeError, "without an 'input_ids' entry .keys: \\['text'\\]."),
        (torch.tensor([[0, 1], [1, 2]]), ValueError, "got a batch of 2 sequences"),
        ([0.5, 1.0], TypeError, "integer token ids, got float 0.5"),
        (3, TypeError, "got a single int: wrap it, \\[3\\]"),
        ({"input_ids": [0, 9]}, ValueError, r"token ids in \[0, 6\), got 9"),
    ]
    for prompt, exc, match in bad:
        with pytest.raises(exc, match=match):
            D.speculative_decode(prompt, draft=draft, target=target, max_new_tokens=2, rng=0)


def test_lp_verifier_without_truncation_at_small_vocabulary():
    D, target, draft = _toy()
    for kw in ({}, {"top_p": 1.0}, {"top_k": 6}):
        res = D.speculative_decode([0], draft=draft, target=target, verifier="lp", k=3, L=3, max_new_tokens=12,
                                   rng=1, **kw)
        assert res.lossless and res.tokens.shape == (12,)


def test_lp_size_error_suggests_a_valid_top_k():
    from otspec.decoding._verifiers import lp_columns, lp_max_support, resolve_scheme

    for k in (2, 3, 4):
        bound = lp_max_support(k)
        assert lp_columns(bound, k) <= 16_384 < lp_columns(bound + 1, k)
        with pytest.raises(ValueError, match=f"pass top_k between 1 and {bound} "):
            resolve_scheme("lp", k=k, options=None, vocab_size=bound + 1)
        assert resolve_scheme("lp", k=k, options=None, vocab_size=bound).name == "lp"
        assert resolve_scheme("lp", k=k, options=None, vocab_size=50_000, top_k=bound).name == "lp"


@pytest.mark.parametrize("builder,k,options", [
    ("otm_lp", 2, None),                 # returns an OTMResult carrying .verifier
    ("kseq", 2, None),
    ("optimal_verifier", 2, None),
    ("maximal_coupling", 1, None),       # (p, q): single draft
    ("mentored", 1, {"D": 0.05}),        # returns a MentoredResult carrying .verifier
    ("lenient_verifier", 1, {"l": 0.5}),  # not registered: called as fn(p, q, **options)
    ("block.BlockVerify", 1, None),      # block verifier classes run as their registered names
    ("block.BlockVerifyOneStep", 1, None),
])
def test_package_builders_are_accepted_as_verifier(builder, k, options):
    D, target, draft = _toy()
    fn = otspec
    for part in builder.split("."):
        fn = getattr(fn, part)
    res = D.speculative_decode([0], draft=draft, target=target, verifier=fn, k=k, L=2, max_new_tokens=8, rng=2,
                               verifier_options=options)
    assert res.tokens.shape == (8,)
    assert res.lossless == (builder not in ("mentored", "lenient_verifier"))


def test_user_callable_returning_a_result_object_and_bad_returns():
    D, target, draft = _toy()

    def my_lp(p, q, k):
        return otspec.otm_lp(p, q, k)

    res = D.speculative_decode([0], draft=draft, target=target, verifier=my_lp, k=2, L=2, max_new_tokens=6, rng=0)
    assert res.lossless
    with pytest.raises(TypeError, match="must return an otspec.Verifier or a result with a `.verifier`"):
        D.speculative_decode([0], draft=draft, target=target, verifier=lambda p, q, k: q, k=2, max_new_tokens=4,
                             rng=0)
    with pytest.raises(TypeError, match="instance, built for one fixed"):
        D.speculative_decode([0], draft=draft, target=target, verifier=otspec.kseq(P, Q, 2), k=2)
    with pytest.raises(ValueError, match="takes no `k` parameter"):
        D.speculative_decode([0], draft=draft, target=target, verifier=otspec.lenient_verifier, k=2,
                             verifier_options={"l": 0.5})
    with pytest.raises(ValueError, match="verifies a single draft"):
        D.speculative_decode([0], draft=draft, target=target, verifier=otspec.maximal_coupling, k=2)


def test_transformers_nucleus_rule_matches_the_warpers():
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    from otspec.decoding import Sampling, transformers_keep_mask

    g = torch.Generator().manual_seed(0)
    logits = torch.randint(-6, 6, (2000, 40), generator=g).float() / 2   # half-integers: many exact ties
    differs = 0
    for T, top_k, top_p in [(1.0, None, 0.9), (0.7, 20, 0.8), (1.3, 50, 0.5)]:
        s = lp.TemperatureLogitsWarper(T)(None, logits.clone())
        if top_k:
            s = lp.TopKLogitsWarper(top_k)(None, s)
        hf = torch.isfinite(lp.TopPLogitsWarper(top_p)(None, s))
        assert torch.equal(transformers_keep_mask(logits, T, top_k, top_p), hf)
        law = Sampling(temperature=T, top_k=top_k, top_p=top_p, top_p_rule="transformers").probs(logits)
        assert torch.equal(law > 0, hf)
        differs += int(((Sampling(temperature=T, top_k=top_k, top_p=top_p).probs(logits) > 0) != hf).any(-1).sum())
    assert differs > 0  # the default rule keeps every tied token: a different law on these rows


def test_decoding_with_the_transformers_rule_is_lossless():
    D, target, draft = _toy()
    res = D.speculative_decode([0], draft=draft, target=target, verifier="kseq", k=2, L=2, max_new_tokens=6,
                               top_p=0.8, top_p_rule="transformers", rng=0)
    assert res.sampling.top_p_rule == "transformers" and res.lossless


def test_record_keys_are_attribute_names():
    D, target, draft = _toy()
    S = D.summarize([D.speculative_decode([0], draft=draft, target=target, L=2, max_new_tokens=8, rng=0)])
    rec = S.as_record()
    for key, value in rec.items():
        attr = getattr(S, key)
        assert value == (attr.tolist() if isinstance(attr, np.ndarray) else list(attr) if isinstance(attr, tuple)
                         else attr), key
    import json

    json.dumps(rec)
