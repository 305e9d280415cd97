"""Audit of the tree package's, the block/lossy/SpecTr packages' and the command line's entry points (task CG).

Each public callable was fed a matrix of odd inputs (ints and floats for ints, ``2**63``, ``0``, negative
sizes, strings, ``None``, NumPy booleans, arrays that are not laws, ragged or deeply nested text, huge grids,
odd tree texts and model names, paths that are missing or files). Every call must end in the reference
answer (an independent route, to 1e-12) or in a ``ValueError`` / ``TypeError`` whose message names the
parameter, without a warning, in bounded time; the command line in one ``error:`` line, exit status 2,
nothing written and no model loaded.

Findings on main a3dbc22 (each test below marked ``regression`` fails there):

* :func:`otspec.block.tau_law_on_path` read its block and conditionals unchecked: a token outside the
  vocabulary was an ``IndexError``, ``0.5`` was token 0, the text ``"01"`` was the block ``(0, 1)``, rows
  that are not laws (summing to 1.5, NaN) gave a law of ``tau`` anyway, laws of two vocabularies were mixed,
  and the empty block gave ``[0, 1]`` (two entries for ``L = 0``);
* ``TreeShape([[2**63]])`` an ``OverflowError``; a ``DraftTree`` token of ``2**63`` a TypeError saying
  "got dtype float64"; ``TreeShape.from_successors([])`` an ``IndexError``, and its messages named
  ``paths`` for ``successors``;
* :func:`parse_tree_spec`: rank paths nested thousands deep a ``RecursionError``; ``limit=None`` a bare
  comparison TypeError, ``limit=0`` / ``1.5`` taken as limits; ``processes="topk"`` read letter by letter;
* the tree verifiers' ``validate=None`` (or ``1``, ``"yes"``) read by truthiness: ``None`` skipped the checks
  of the laws silently;
* ``value(allow_lossy=np.True_)`` refused with "must be a bool, got bool" (``optimum`` takes NumPy bools);
* ``make_tree_verifier("spectr-tree", token_verifier=...)``: its errors named ``verifier``;
* ``compare_schemes(schemes=5)`` a bare "'int' object is not iterable", ``schemes="bound"`` read as the
  schemes ``'b', 'o', ...``; ``resolve_verifier(symmetric=1)``, ``VerifierFactory(None, ...)`` and
  ``block_efficiency_mc(progress="yes")`` accepted;
* ``lenience_curve`` / ``mentored_frontier`` kept every point's verifier (``(V,)`` arrays each) and took any
  grid: a million lenience values ran for four minutes at V = 3 (hours for budgets); now at most
  ``MAX_CURVE_POINTS`` points, O(V) memory, the same values to the bit;
* ``BlockVerifier.sample_tau(n=2**63)`` ran without end (a growing list); now at most ``MAX_SAMPLE_TAU``;
* the verifiers' base ``draft_law_of`` read ``p[-1]`` for the token -1 (a wrong probability) and raised an
  ``IndexError`` for a token outside the vocabulary (every lossy rule and every i.i.d. verifier inherit it);
* ``value`` / ``output_law`` / ``check_lossless`` with a prefix and a shape deeper than a bounded model named a
  ``prefix`` of a leaf path's length, which the caller never gave;
* the command line: ``toy: 6``, ``toy:6_0`` (V = 60) and other scripts' digits read as vocabularies; a
  closeness of ``1e-320`` (an infinite draft logits table); a ``--draft`` / ``--target`` path that does not
  exist or is a file reported by transformers without the flag.
"""

from __future__ import annotations

import math
import re
import time
import warnings

import numpy as np
import pytest

import otspec
import otspec.block as blk
import otspec.lossy as lossy
import otspec.spectr as spt
import otspec.tree as T
from otspec import models

torch = pytest.importorskip("torch")



def regression(f):
    """Marks (for the reader) a test that fails on main a3dbc22."""
    return f


def _named(exc_info, name: str) -> None:
    assert f"`{name}" in str(exc_info.value), str(exc_info.value)


@pytest.fixture(autouse=True)
def _no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


D3 = models.random_table_model(3, 3, rng=1)
T3 = models.random_table_model(3, 3, rng=2)


# --------------------------------------------------------------------------------------------------------------
# block: tau_law_on_path
# --------------------------------------------------------------------------------------------------------------
def _path_conditionals(v, block):
    """The draft and target conditionals along ``block`` read from the models (the logged rows)."""
    cs = [v.draft.next_dist(tuple(block[:i])) for i in range(len(block))]
    cb = [v.target.next_dist(tuple(block[:i])) for i in range(len(block))]
    return cs, cb


@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
@pytest.mark.parametrize("block", [(0, 1), (2, 2), (1, 0)])
def test_tau_law_on_path_matches_the_enumeration(name, block):
    v = blk.make_verifier(D3, T3, 2, name)
    cs, cb = _path_conditionals(v, block)
    ref = v.tau_given_block(block)
    for kind in (lambda x: x, lambda x: [r.tolist() for r in x], np.array, lambda x: torch.tensor(np.array(x))):
        got = blk.tau_law_on_path(name, list(block), kind(cs), kind(cb))
        np.testing.assert_allclose(got, ref, atol=1e-12, rtol=0)
    assert np.array_equal(blk.tau_law_on_path(v, block, cs, cb), blk.tau_law_on_path(name, block, cs, cb))


P2 = np.array([0.5, 0.5])
Q2 = np.array([0.25, 0.75])


@regression
@pytest.mark.parametrize(("block", "cs", "cb", "err", "name"), [
    ((5, 0), [P2, P2], [Q2, Q2], ValueError, "block"),            # IndexError on main
    ((-1, 0), [P2, P2], [Q2, Q2], ValueError, "block"),           # read as the last token on main
    ((0.5, 0), [P2, P2], [Q2, Q2], TypeError, "block"),           # token 0 on main
    ("01", [P2, P2], [Q2, Q2], TypeError, "block"),               # the block (0, 1) on main
    (None, [P2, P2], [Q2, Q2], TypeError, "block"),
    ((), [], [], ValueError, "block"),                            # [0, 1] for L = 0 on main
    ((0, 1), [P2, [0.5, 0.5, 0.5]], [Q2, Q2], ValueError, "draft_conditionals"),
    ((0, 1), [P2, P2], [Q2, [0.5, 0.6]], ValueError, "target_conditionals[1]"),
    ((0, 1), [P2, [np.nan, 1.0]], [Q2, Q2], ValueError, "draft_conditionals[1]"),
    ((0, 1), [P2, [-0.5, 1.5]], [Q2, Q2], ValueError, "draft_conditionals[1]"),
    ((0, 1), [P2, P2], [[0.5, 0.3, 0.2]] * 2, ValueError, "draft_conditionals"),
    ((0, 1), [P2], [Q2, Q2], ValueError, "draft_conditionals"),
    ((0, 1), None, [Q2, Q2], TypeError, "draft_conditionals"),
])
def test_tau_law_on_path_refuses(block, cs, cb, err, name):
    before = [np.array(c, copy=True) for c in cs or ()]
    with pytest.raises(err) as e:
        blk.tau_law_on_path("block", block, cs, cb)
    _named(e, name)
    for b, c in zip(before, cs or ()):
        assert np.array_equal(b, np.asarray(c), equal_nan=True)


@regression
def test_tau_law_on_path_vocabulary_of_the_verifier():
    v = blk.make_verifier(D3, T3, 2, "block")
    with pytest.raises(ValueError) as e:
        blk.tau_law_on_path(v, (0, 1), [P2, P2], [Q2, Q2])
    _named(e, "draft_conditionals")


@regression
@pytest.mark.parametrize("name", ["token", "block", "block-onestep"])
def test_sample_tau_is_bounded(name):
    limit = blk._verifiers.MAX_SAMPLE_TAU  # main had no limit: n = 2**63 ran without end, its list growing
    v = blk.make_verifier(D3, T3, 2, name)
    for n in (2**63, limit + 1):
        t0 = time.perf_counter()
        with pytest.raises(ValueError) as e:
            v.sample_tau(n, rng=0)
        _named(e, "n")
        assert time.perf_counter() - t0 < 1.0
    gen = np.random.default_rng(5)
    ref = [v.sample(rng=gen).tau for _ in range(50)]  # the same draws one by one
    got = v.sample_tau(50, rng=5)
    assert got.dtype == np.int64 and got.tolist() == ref


# --------------------------------------------------------------------------------------------------------------
# tree types and the tree text
# --------------------------------------------------------------------------------------------------------------
@regression
@pytest.mark.parametrize("make", [T.TreeShape, T.TreeShape.from_paths, T.DraftTree.from_paths])
def test_rank_beyond_int64_is_a_value_error(make):
    with pytest.raises(ValueError) as e:
        make([[2**63]])
    _named(e, "paths[0]")
    assert make([[2**63 - 1]]).n == 1


@regression
def test_draft_tree_token_beyond_int64():
    with pytest.raises(ValueError, match=r"`tokens` must hold integers in the int64 range, got 9223372036854775808"):
        T.DraftTree(None, [-1, 0], [-1, 2**63])
    with pytest.raises(ValueError, match="`tokens`"):
        T.DraftTree(None, [-1, 0], np.array([2**64 - 1, 0], dtype=np.uint64))
    with pytest.raises(TypeError, match="`tokens` must hold integers"):
        T.DraftTree(None, [-1, 0], [-1, 0.5])
    assert T.DraftTree(None, [-1, 0], [-1, 1]).n == 1


@regression
@pytest.mark.parametrize(("succ", "err", "name"), [
    ([], ValueError, "successors"),
    ([[-1]], ValueError, "successors[0]"),
    ([[1.0], []], TypeError, "successors[0]"),
    ([[5]], ValueError, "successors[0]"),
])
def test_from_successors_refuses(succ, err, name):
    with pytest.raises(err) as e:
        T.TreeShape.from_successors(succ)
    _named(e, name)


def test_from_successors_round_trip():
    for shape in (T.TreeShape.branching(2, 3), T.TreeShape.chains(3, 2), T.TreeShape.from_paths([[0], [1], [0, 0]])):
        assert T.TreeShape.from_successors(shape.to_successors()) == shape


@regression
def test_parse_tree_spec_deep_nesting():
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        T.parse_tree_spec("topk:" + "[" * 100_000 + "]" * 100_000)
    _named(e, "tree")
    assert time.perf_counter() - t0 < 5


@regression
@pytest.mark.parametrize(("limit", "err"), [(None, TypeError), (0, ValueError), (-1, ValueError), (1.5, TypeError),
                                            (True, TypeError), ("8", TypeError)])
def test_parse_tree_spec_limit(limit, err):
    with pytest.raises(err) as e:
        T.parse_tree_spec("topk:branching(2)", limit=limit)
    _named(e, "limit")


@regression
@pytest.mark.parametrize("processes", ["topk", None, 5, ("topk", 1)])
def test_parse_tree_spec_processes(processes):
    with pytest.raises(TypeError) as e:
        T.parse_tree_spec("top:branching(2)", processes=processes)
    _named(e, "processes")
    assert T.parse_tree_spec("topk:branching(2)", processes=["topk"]).process == "topk"


@pytest.mark.parametrize("text", ["topk:branching(4,", "iid:branching(0)", "eagle2:4,4,0", "topk:branching(1000000000)",
                                  "foo:branching(2)", "topk:[[0],[0]]", "topk:[[-1]]", "topk:[[1e0]]", "eagle2:3,4",
                                  "topk:branching(2**63)", "topk:branching(9223372036854775808)", "", "topk:",
                                  "topk:[[0]]:,", "eagle2:1e9,1e9,1e9", "topk:chains(2)", "topk:[]"])
def test_parse_tree_spec_bad_text(text):
    with pytest.raises((ValueError, TypeError)) as e:
        T.parse_tree_spec(text)
    _named(e, "tree")


# --------------------------------------------------------------------------------------------------------------
# tree verifiers: flags
# --------------------------------------------------------------------------------------------------------------
SHAPE = T.TreeShape.branching(2, 2)
TREE = T.sample_tree(SHAPE, D3, process="wor", rng=0)
PN, QN = T.tree_laws(TREE, D3, T3)
CHAINS = T.sample_tree(T.TreeShape.chains(2, 2), D3, process="iid", rng=0)  # gbv verifies chains only
PC, QC = T.tree_laws(CHAINS, D3, T3)
CHAIN = T.sample_tree(T.TreeShape.chains(1, 2), D3, process="iid", rng=0)  # hsd: one chain
P1, Q1 = T.tree_laws(CHAIN, D3, T3)
VERIFIERS = ["specinfer", "sequoia", "target-only", "spectr-tree", "traversal", "gbv", "hsd", "spechub", "optimal"]


def _verifier(name):
    if name == "optimal":
        return T.optimum(SHAPE, D3, T3, process="wor").verifier
    return T.make_tree_verifier(name)


@regression
@pytest.mark.parametrize("name", VERIFIERS)
@pytest.mark.parametrize("flag", [None, 1, "yes", 0.0])
def test_tree_verifier_validate_is_a_bool(name, flag):
    v = _verifier(name)
    for call in (lambda: v.emission(TREE, PN, QN, validate=flag), lambda: v.expected_accepted(TREE, PN, QN, validate=flag),
                 lambda: v.sample(TREE, PN, QN, rng=0, validate=flag)):
        with pytest.raises(TypeError) as e:
            call()
        _named(e, "validate")


@pytest.mark.parametrize("name", VERIFIERS)
def test_tree_verifier_numpy_bool_and_bad_laws(name):
    v = _verifier(name)
    tree, P, Q = {"gbv": (CHAINS, PC, QC), "hsd": (CHAIN, P1, Q1)}.get(name, (TREE, PN, QN))
    ref = v.emission(tree, P, Q)
    assert np.array_equal(v.emission(tree, P, Q, validate=np.True_), ref)
    # the accepted depth's mean read from the (accepted node, emitted token) law
    assert v.expected_accepted(tree, P, Q) == pytest.approx(float(tree.depth @ ref.sum(axis=1)), abs=1e-12)
    bad = np.array(P, copy=True)
    bad[1, 0] = np.nan
    with pytest.raises(ValueError):
        v.emission(tree, bad, Q)


@regression
def test_value_allow_lossy_numpy_bool():
    a = T.value(SHAPE, D3, T3, process="iid", verifier="specinfer", allow_lossy=np.True_)
    assert a == T.value(SHAPE, D3, T3, process="iid", verifier="specinfer", allow_lossy=True)
    with pytest.raises(TypeError, match="`allow_lossy`"):
        T.value(SHAPE, D3, T3, process="iid", verifier="specinfer", allow_lossy=1)


@regression
@pytest.mark.parametrize(("tv", "err"), [("nosuch", ValueError), (None, TypeError), (5, TypeError)])
def test_spectr_tree_token_verifier_named(tv, err):
    with pytest.raises(err) as e:
        T.make_tree_verifier("spectr-tree", token_verifier=tv)
    _named(e, "token_verifier")
    with pytest.raises(err) as e:
        T.SpecTrTreeVerifier(token_verifier=tv)
    _named(e, "token_verifier")


# --------------------------------------------------------------------------------------------------------------
# tree values against independent routes, on odd laws
# --------------------------------------------------------------------------------------------------------------
def _table(V, seed, kind):
    g = np.random.default_rng(seed)
    tabs = []
    for l in range(3):
        a = g.random((V,) * (l + 1))
        if kind == "zeros":
            a[g.random(a.shape) < 0.4] = 0
            a[..., 0] += 1e-3
        elif kind == "ties":
            a = np.round(a * 2) + 1
        elif kind == "subnormal":
            a[..., 0] = 1e-310
        tabs.append(a / a.sum(-1, keepdims=True))
    return models.TableModel(tabs)


PROCESS_VERIFIERS = {"iid": ("specinfer", "spectr-tree", "gbv", "target-only"),
                     "wor": ("sequoia", "traversal", "target-only"), "topk": ("target-only",)}


@pytest.mark.parametrize("V", [1, 2, 3])
@pytest.mark.parametrize("kind", ["plain", "zeros", "ties", "same", "subnormal"])
def test_tree_value_routes_agree(V, kind):
    """``value`` against ``check_lossless``'s completed law (another enumeration), below ``optimum``'s LP."""
    d = _table(V, 0, "plain" if kind == "same" else kind)
    t = d if kind == "same" else _table(V, 7, kind)
    for shape in (T.TreeShape.branching(1), T.TreeShape.branching(2), T.TreeShape.chains(2, 2),
                  T.TreeShape.from_paths([[0], [1], [0, 0]])):
        for process, names in PROCESS_VERIFIERS.items():
            try:
                opt = T.optimum(shape, d, t, process=process).value
            except ValueError as exc:  # wor/topk: fewer positive draft tokens than siblings
                assert "distinct children" in str(exc)
                continue
            for name in names:
                try:
                    v = T.value(shape, d, t, process=process, verifier=name)
                except ValueError as exc:
                    assert "lossless only" in str(exc)
                    continue
                c = T.check_lossless(name, shape, d, t, process=process)
                assert c.passed and c.acceptance_error <= 1e-12 and abs(c.acceptance - v) <= 1e-12
                assert v <= opt + 1e-9
                if kind == "same" and name in ("specinfer", "sequoia", "traversal"):
                    assert v == pytest.approx(shape.max_depth, abs=1e-12)
                if V == 1:
                    assert v == pytest.approx(shape.max_depth, abs=1e-12)


@regression
@pytest.mark.parametrize(("shape", "prefix", "model"), [(T.TreeShape.branching(2, 2), (0,), "target"),
                                                       (T.TreeShape.chains(2, 4), (), "draft")])
def test_tree_deeper_than_the_models(shape, prefix, model):
    """A prefix and a shape deeper than a bounded model: the message gives both (main named a `prefix` of the
    length of a leaf's path, which the caller never gave)."""
    for call in (lambda: T.value(shape, D3, T3, process="iid", verifier="specinfer", prefix=prefix),
                 lambda: T.output_law(shape, D3, T3, process="iid", verifier="specinfer", prefix=prefix),
                 lambda: T.check_lossless("specinfer", shape, D3, T3, process="iid", prefix=prefix)):
        with pytest.raises(ValueError, match=rf"`{model}` generates sequences of at most max_len=3 tokens, but "
                                             rf"`prefix` \(length {len(prefix)}\) and `shape` \(depth"):
            call()
    # the deepest that fits: one level under a prefix of one token
    one = T.TreeShape.branching(2)
    c = T.check_lossless("specinfer", one, D3, T3, process="iid", prefix=(0,))
    assert c.passed and T.value(one, D3, T3, process="iid", verifier="specinfer", prefix=(0,)) == pytest.approx(
        c.acceptance, abs=1e-12)


# --------------------------------------------------------------------------------------------------------------
# block / SpecTr flags and names
# --------------------------------------------------------------------------------------------------------------
@regression
@pytest.mark.parametrize(("schemes", "name"), [(5, "schemes"), ("bound", "schemes"), (["bound", 5], "schemes")])
def test_compare_schemes_schemes(schemes, name):
    with pytest.raises(TypeError) as e:
        blk.compare_schemes(D3, T3, 2, 2, schemes=schemes, check=False)
    _named(e, name)


def test_compare_schemes_one_scheme():
    c = blk.compare_schemes(D3, T3, 2, 2, schemes=["bound"], check=False)
    assert [r.name for r in c.rows] == ["bound"] and c.rows[0].length == pytest.approx(blk.level_bound(D3, T3, 2, 2))


@regression
@pytest.mark.parametrize("flag", [1, "yes", 0.5])
def test_spectr_flags_are_bools(flag):
    with pytest.raises(TypeError) as e:
        spt.resolve_verifier("lp", symmetric=flag)
    _named(e, "symmetric")
    with pytest.raises(TypeError) as e:
        spt.block_efficiency_mc(D3, T3, 2, 2, n_samples=10, rng=0, progress=flag)
    _named(e, "progress")
    with pytest.raises(TypeError) as e:
        spt.VerifierFactory(otspec.otm_lp, name="lp", symmetric=flag)
    _named(e, "symmetric")


@regression
@pytest.mark.parametrize("build", [None, "lp", 5])
def test_verifier_factory_build_is_callable(build):
    with pytest.raises(TypeError) as e:
        spt.VerifierFactory(build, name="x", symmetric=True)
    _named(e, "build")


def test_spectr_numpy_bools_accepted():
    f = spt.resolve_verifier("lp", symmetric=np.False_)
    assert f.symmetric is False
    a = spt.block_efficiency_mc(D3, T3, 2, 2, n_samples=10, rng=0, progress=np.False_)
    b = spt.block_efficiency_mc(D3, T3, 2, 2, n_samples=10, rng=0)
    assert a.mean == b.mean


# --------------------------------------------------------------------------------------------------------------
# lossy curves
# --------------------------------------------------------------------------------------------------------------
P3 = np.array([0.5, 0.25, 0.25])
Q3 = np.array([0.25, 0.25, 0.5])


@regression
@pytest.mark.parametrize("curve", ["ls", "Ds"])
def test_curves_are_bounded(curve):
    n = lossy._mentored.MAX_CURVE_POINTS + 1
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        if curve == "ls":
            lossy.lenience_curve(P3, Q3, np.linspace(0.01, 1.0, n))
        else:
            lossy.mentored_frontier(P3, Q3, np.linspace(0.0, 1.0, n))
    _named(e, curve)
    assert time.perf_counter() - t0 < 1.0


def test_curves_equal_their_points():
    """Each point of a curve is the verifier of that point, to the bit (the curves no longer keep them)."""
    g = np.random.default_rng(3)
    p, q = g.dirichlet(np.ones(40)), g.dirichlet(np.ones(40))
    ls = [0.05, 0.3, 0.9, 1.0]
    c = lossy.lenience_curve(p, q, ls)
    for j, l in enumerate(ls):
        v = lossy.lenient_verifier(p, q, l)
        assert (c.acceptance[j], c.kl[j], c.tv[j]) == (v.acceptance(), v.kl(), v.tv())
    Ds = [0.0, 0.01, 0.2, math.inf]
    fr = lossy.mentored_frontier(p, q, Ds)
    for j, D in enumerate(Ds):
        r = lossy.mentored(p, q, D)
        assert (fr.acceptance[j], fr.kl[j], fr.alpha[j], fr.beta[j]) == (r.acceptance, r.kl, r.alpha, r.beta)
    assert not fr.acceptance.flags.writeable and not c.kl.flags.writeable


LOSSY = {"ensemble": lambda: lossy.ensemble_verifier(P3, Q3, 0.5), "lenient": lambda: lossy.lenient_verifier(P3, Q3, 0.5),
         "mentored": lambda: lossy.mentored_verifier(P3, Q3, 0.1), "typical": lambda: lossy.typical_acceptance_verifier(P3, Q3),
         "lp": lambda: otspec.get_verifier("lp").build(P3, Q3, 2)}


@regression
@pytest.mark.parametrize("name", list(LOSSY))
@pytest.mark.parametrize(("drafts", "err"), [((-1,), ValueError), ((3,), ValueError), ((0.5,), TypeError),
                                             ("0", TypeError), (None, TypeError)])
def test_draft_law_of_checks_its_drafts(name, drafts, err):
    """The base class's i.i.d. product read ``p[-1]`` for the token -1 (0.25 here) and raised IndexError for 3."""
    v = LOSSY[name]()
    k = v.k
    with pytest.raises(err):
        v.draft_law_of(drafts * k if isinstance(drafts, tuple) else drafts)
    assert v.draft_law_of((1,) * k) == pytest.approx(float(P3[1]) ** k, abs=1e-15)


# --------------------------------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------------------------------
pytest.importorskip("pyarrow")
import otspec.__main__ as cli  # noqa: E402


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"input_ids": [0, 1]}\n')
    return f


# no_loading: the shared fixture of tests/conftest.py (any model loading fails the test)


def _refused(argv, out, capsys, match=None):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    assert rc == 2, (rc, cap.err)
    assert cap.err.startswith("error: ") and cap.err.count("\n") == 1, cap.err
    assert "Traceback" not in cap.err and cap.out == ""
    assert not out.exists()
    if match is not None:
        assert re.search(match, cap.err), cap.err
    return cap.err


BAD_OPTIONS = [
    *[(flag, v) for flag in ("--k-max", "--L-max", "--max-new-tokens", "--stride", "--shard-size", "--batch-size")
      for v in ("-1", "0", "1e3", "1.5", "", "nan")],
    *[(flag, "99999999999999999999") for flag in ("--k-max", "--L-max", "--max-new-tokens", "--shard-size",
                                                   "--batch-size", "--bound-budget")],
    *[(flag, v) for flag in ("--subsample", "--bound-budget", "--seed") for v in ("-1", "1e3", "1.5", "", "nan")],
    *[("--top-k", v) for v in ("-1", "0", "1.5", "")],
    *[("--temperature", v) for v in ("-1", "nan", "inf", "1e400", "")],
    *[("--top-p", v) for v in ("-1", "0", "nan", "inf", "2", "-0.0", "")],
    *[("--calibration-s", v) for v in ("-1", "nan", "inf", "1e400", "")],
    *[("--trees", t) for t in ("topk:branching(4,", "iid:branching(0)", "eagle2:4,4,0", "topk:branching(1000000000)",
                               "foo:branching(2)", "topk:chains(2,3):nosuch", "", "topk:", "topk:[[0],[0]]",
                               "eagle2:-1,2,3", "topk:branching(4,2):traversal", "topk:" + "[" * 5000 + "]" * 5000)],
    *[("--verifiers", v) for v in ("nosuch", "token,nosuch")],
    *[("--families", v) for v in ("nosuch",)],
    *[("--verifier-options", v) for v in ("[]", "null", "1", '{"mentored": 1}', '{"mentored": {"D": -1}}',
                                          '{"nosuch": {}}', '{"mentored": {"E": 1}}', "{")],
    *[(flag, d) for flag in ("--device", "--draft-device") for d in ("", "cuda:99", "nosuch", "meta", "-1", "cpu:-1")],
    ("--dtype", "float8"), ("--context", "x"), ("--top-p-rule", "x"),
]


@pytest.mark.parametrize(("flag", "value"), BAD_OPTIONS)
def test_cli_bad_option(flag, value, tmp_path, prompts, no_loading, capsys):
    out = tmp_path / "out"
    _refused(["profile", "--draft", "toy:4", "--target", "toy:4", "--prompts", str(prompts), "--out", str(out),
              flag, value], out, capsys)


@regression
@pytest.mark.parametrize("spec", ["toy: 6", "toy:6_0", "toy:\u0666", "toy:6:\u0660", "toy:6:0:1e-320",
                                  "toy:6:0:0_5", "toy:6:0: 0.5", "toy:+6", "toy:6:+0"])
def test_cli_toy_names_in_ascii_digits(spec, tmp_path, prompts, no_loading, capsys):
    out = tmp_path / "out"
    _refused(["profile", "--draft", spec, "--target", spec, "--prompts", str(prompts), "--out", str(out)], out, capsys,
             r"`--draft` must be toy:V")


@pytest.mark.parametrize("spec", ["toy:0", "toy:1", "toy:-6", "toy:6.5", "toy:6:-1", "toy:6:0:0", "toy:6:0:nan",
                                  "toy:6:0:inf", "toy:6:0:2", "toy:99999999999", "toy:", "toy:6:", "toy:6:0:1:2"])
def test_cli_bad_toy_names(spec, tmp_path, prompts, no_loading, capsys):
    out = tmp_path / "out"
    _refused(["profile", "--draft", spec, "--target", spec, "--prompts", str(prompts), "--out", str(out)], out, capsys,
             r"`--draft` must be toy:V")


def test_cli_toy_closeness_forms():
    for text, c in (("toy:6:0:0.25", 0.25), ("toy:6:0:1", 1.0), ("toy:6:0:.5", 0.5), ("toy:6:0:1e-3", 1e-3),
                    ("toy:6:0:1e-300", 1e-300)):
        assert cli._parse_model(text, "--draft").closeness == c


@regression
@pytest.mark.parametrize("which", ["--draft", "--target"])
@pytest.mark.parametrize("kind", ["missing", "file"])
def test_cli_model_path(which, kind, tmp_path, prompts, no_loading, capsys):
    path = tmp_path / "model"
    if kind == "file":
        path.write_text("{}")
    out = tmp_path / "out"
    models_ = {"--draft": "gpt2", "--target": "gpt2", which: str(path)}
    err = _refused(["profile", "--draft", models_["--draft"], "--target", models_["--target"], "--prompts",
                    str(prompts), "--out", str(out)], out, capsys)
    assert f"`{which}`" in err and ("no such model folder" in err if kind == "missing" else "is a file" in err)


@pytest.mark.parametrize("path", ["/nonexistent-otspec-cg", "", "{tmp}/file"])
def test_cli_bad_prompts(path, tmp_path, no_loading, capsys):
    f = tmp_path / "file"
    f.write_text("not json\n")
    out = tmp_path / "out"
    _refused(["profile", "--draft", "toy:4", "--target", "toy:4", "--prompts", path.format(tmp=tmp_path),
              "--out", str(out)], out, capsys, r"`--prompts`")


@pytest.mark.parametrize("argv", [["report", "/nonexistent-otspec-cg"], ["report", ""],
                                  ["report", "{tmp}", "--draft-cost", "-1"], ["report", "{tmp}", "--score-cost", "nan"],
                                  ["report", "{tmp}", "--draft-cost", "x"]])
def test_cli_report_refuses(argv, tmp_path, capsys):
    out = tmp_path / "never"
    _refused([a.format(tmp=tmp_path) for a in argv], out, capsys)
