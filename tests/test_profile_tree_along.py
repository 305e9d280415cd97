"""EAGLE-2's trees and the sampled trees' per-node rules along the text: the emission row of the tree drawn at a
position, against the verifiers' own emission laws and, averaged over the draws, against the process's value."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from otspec.models import MarkovModel  # noqa: E402
from otspec.profile import profile, read_table, summarize, toy_pair  # noqa: E402
from otspec.profile._report import report_markdown  # noqa: E402
from otspec.profile._trees import (  # noqa: E402
    along_text_names,
    compact_tree,
    iid_emission_along,
    parse_family,
    static_along_names,
    topk_emission_along,
    tree_emission_along,
)
from otspec.tree import (  # noqa: E402
    Eagle2Params,
    TargetOnlyVerifier,
    TreeShape,
    enumerate_trees,
    make_tree_verifier,
    sample_tree,
    tree_laws,
    value,
)
from tests.test_profile_tree_palm import renewal_and_palm_from_rows  # noqa: E402

SAMPLED = [("iid", TreeShape.branching(2, 2)), ("wor", TreeShape.branching(3, 1)),
           ("wor", TreeShape.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0)])), ("iid", TreeShape.chains(2, 2)),
           ("iid", TreeShape.branching(3, 1))]
EAGLE = [Eagle2Params(depth=2, top_k=2, total_tokens=4), Eagle2Params(depth=3, top_k=2, total_tokens=6)]


def _softmax(W: np.ndarray) -> np.ndarray:
    e = np.exp(W - W.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _models(seed: int, V: int = 4, closeness: float = 0.8):
    """The toy pair as exact Markov models (numpy softmax of the toy's tables: independent of its torch route)."""
    draft, target = toy_pair(V, seed=seed, closeness=closeness)
    return MarkovModel(_softmax(draft.fn.table)), MarkovModel(_softmax(target.fn.table))


def _laws_along(Md, Mt, ctx, z):
    P = np.array([Md.next_dist(tuple(ctx) + tuple(z[:t])) for t in range(len(z))])
    Q = np.array([Mt.next_dist(tuple(ctx) + tuple(z[:t])) for t in range(len(z))])
    return P, Q


def _reference_row(tree, law, z, D):
    """The row read off a verifier's (accepted node, emitted token) law on the tree."""
    node = {}
    for i in range(tree.n + 1):
        node.setdefault(tree.path(i), []).append(i)
    row = np.zeros(D + 1)
    for j in range(1, min(D + 1, len(z)) + 1):
        row[j - 1] = sum(law[a, z[j - 1]] for a in node.get(tuple(z[:j - 1]), []))
    return row


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", SAMPLED, ids=["iid-b22", "wor-b31", "wor-uneven", "iid-chains", "iid-b31"])
def test_row_is_the_target_only_law_on_the_drawn_tree(seed, case):
    # the target-only rule's own emission law, with the laws at every node of the tree (not only the text's path);
    # i.i.d. trees draw equal siblings, reached through the first
    process, shape = case
    Md, Mt = _models(seed)
    rng = np.random.default_rng(seed)
    ver = TargetOnlyVerifier()
    D, checked = shape.max_depth, 0
    for _ in range(12):
        ctx = tuple(int(x) for x in rng.integers(4, size=2))
        tree = sample_tree(shape, Md, process=process, prefix=ctx, rng=rng)
        law = ver.emission(tree, *tree_laws(tree, Md, Mt, prefix=ctx))
        # texts that follow a root path of the tree, and random ones; some shorter than D + 1 (the text's end)
        leaf = tree.path(int(rng.integers(1, tree.n + 1)))
        for z in (list(leaf) + [int(rng.integers(4))], [int(x) for x in rng.integers(4, size=D + 1)], list(leaf)):
            _, Q = _laws_along(Md, Mt, ctx, z)
            got = tree_emission_along(tree, Q, z, depth=D)
            # what the profile keeps per position: parents and tokens only, the same row
            np.testing.assert_array_equal(tree_emission_along(compact_tree(tree), Q, z, depth=D), got)
            np.testing.assert_allclose(got, _reference_row(tree, law, z, D), rtol=1e-12, atol=1e-15)
            checked += int(np.count_nonzero(got[1:]))
    assert checked > 0  # some rows accept text tokens: the check reaches past the root


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("params", EAGLE, ids=["d2", "d3"])
def test_eagle2_row_is_the_target_only_law(seed, params):
    Md, Mt = _models(seed)
    rng = np.random.default_rng(seed)
    D = params.depth
    for _ in range(10):
        ctx = tuple(int(x) for x in rng.integers(4, size=2))
        tree = sample_tree(params, Md, process="eagle2", prefix=ctx)
        law = TargetOnlyVerifier().emission(tree, *tree_laws(tree, Md, Mt, prefix=ctx))
        leaf = tree.path(int(rng.integers(1, tree.n + 1)))
        for z in (list(leaf) + [int(rng.integers(4))] * (D + 1 - len(leaf)), [int(x) for x in rng.integers(4, size=D)]):
            _, Q = _laws_along(Md, Mt, ctx, z)
            np.testing.assert_allclose(tree_emission_along(tree, Q, z, depth=D), _reference_row(tree, law, z, D),
                                       rtol=1e-12, atol=1e-15)


def test_a_static_topk_tree_drawn_is_the_rank_table():
    # a top-k tree drawn at the context and the rank-path table of topk_emission_along: two routes, one row
    Md, Mt = _models(5, V=5)
    shape = TreeShape.branching(2, 2)
    rng = np.random.default_rng(5)
    for _ in range(10):
        ctx = (int(rng.integers(5)),)
        z = [int(x) for x in rng.integers(5, size=3)]
        P, Q = _laws_along(Md, Mt, ctx, z)
        tree = sample_tree(shape, Md, process="topk", prefix=ctx)
        np.testing.assert_allclose(tree_emission_along(tree, Q, z, depth=2), topk_emission_along(shape, P, Q, z)[0],
                                   rtol=1e-12, atol=1e-15)


AVERAGED = [("iid", TreeShape.branching(2, 1), "specinfer"), ("wor", TreeShape.branching(2, 1), "target-only"),
            ("wor", TreeShape.from_paths([(0,), (1,), (0, 0), (0, 1)]), "target-only"), ("eagle2", EAGLE[1], None)]


@pytest.mark.parametrize("case", AVERAGED, ids=["iid", "wor", "wor-uneven", "eagle2"])
def test_averaged_over_the_draws_the_rows_are_the_iteration_law(case):
    # over every continuation z (and every realised tree T, with its probability, for the drawn-tree walk; the
    # i.i.d. closed form is that average already), the row read along z is the law of the emitted block: it sums
    # to 1 and its mean length is 1 + the process's value (otspec.tree.value, an independent route through the
    # verifier's expected accepted tokens)
    process, shape, vname = case
    Md, Mt = _models(7)
    ctx = (2, 1)
    D = shape.max_depth if isinstance(shape, TreeShape) else shape.depth
    texts = [[(flat // 4 ** i) % 4 for i in range(D + 1)] for flat in range(4 ** (D + 1))]
    laws = [_laws_along(Md, Mt, ctx, z) for z in texts]
    closed = vname == "specinfer"
    law: dict = {}
    for tree, w in [(None, 1.0)] if closed else enumerate_trees(shape, Md, process=process, prefix=ctx):
        seen = {}
        for z, (P, Q) in zip(texts, laws):
            e = iid_emission_along(shape, P, Q, z)[0] if closed else tree_emission_along(tree, Q, z, depth=D)
            for j in range(1, D + 2):
                b = tuple(z[:j])
                if b in seen:  # one number per block, whatever the text after it
                    np.testing.assert_allclose(seen[b], e[j - 1], rtol=0, atol=0)
                else:
                    seen[b] = e[j - 1]
                    law[b] = law.get(b, 0.0) + w * e[j - 1]
    np.testing.assert_allclose(sum(law.values()), 1.0, rtol=1e-12)
    mean = sum(len(b) * v for b, v in law.items())
    want = value(shape, Md, Mt, process=process, verifier=vname or "target-only", prefix=ctx)
    np.testing.assert_allclose(mean, 1.0 + want, rtol=1e-12)
    # and the block law is the target's (every verifier here is lossless): the emitted block's first token
    first = {y: sum(v for b, v in law.items() if b[0] == y) for y in range(4)}
    np.testing.assert_allclose([first[y] for y in range(4)], Mt.next_dist(ctx), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("shape", [TreeShape.branching(2, 1), TreeShape.from_paths([(0,), (1,), (2,), (1, 0)]),
                                   TreeShape.chains(1, 2)], ids=["b21", "uneven", "chain"])
@pytest.mark.parametrize("seed", [1, 6])
def test_iid_closed_form_is_the_mean_over_the_drawn_trees(shape, seed):
    # SpecInfer's rule on i.i.d. children in closed form against the verifier's own emission law on every realised
    # tree (enumerate_trees, the true laws at every node), averaged, on texts that follow and leave the trees
    Md, Mt = _models(seed)
    rng = np.random.default_rng(seed)
    ver = make_tree_verifier("specinfer")
    D = shape.max_depth
    trees = None
    for _ in range(6):
        ctx = tuple(int(x) for x in rng.integers(4, size=2))
        trees = enumerate_trees(shape, Md, process="iid", prefix=ctx)
        z = [int(x) for x in rng.integers(4, size=D + 1 - int(rng.integers(2)))]
        P, Q = _laws_along(Md, Mt, ctx, z)
        want = sum(w * _reference_row(t, ver.emission(t, *tree_laws(t, Md, Mt, prefix=ctx)), z, D)
                   for t, w in trees)
        np.testing.assert_allclose(iid_emission_along(shape, P, Q, z)[0], want, rtol=1e-11, atol=1e-15)
    assert len(trees) == 4 ** shape.n


def test_which_names_have_rows_along_the_text():
    assert along_text_names(parse_family("eagle2:2,2,4")) == ("eagle2:2,2,4",)
    f = parse_family("wor:branching(2,1):sequoia,traversal,target-only")
    assert along_text_names(f) == ("wor:branching(2,1)/target-only",)  # weights e / Q in {0, 1}
    assert along_text_names(parse_family("topk:branching(2,1)")) == ()  # its table needs no drawn tree
    assert along_text_names(parse_family("iid:branching(2,1):specinfer")) == ()  # closed form
    assert static_along_names(parse_family("iid:branching(2,1):specinfer")) == (
        ("iid:branching(2,1)/specinfer", "iid"),)
    assert static_along_names(parse_family("topk:branching(2,1)")) == (("topk:branching(2,1)", "topk"),)


TREES = ["topk:branching(2,2)", "eagle2:2,2,4", "iid:branching(2,1):specinfer",
         "wor:branching(2,1):sequoia,traversal,target-only"]
ALONG = {"eagle2:2,2,4": (3, 2), "iid:branching(2,1)/specinfer": (4, 2), "wor:branching(2,1)/target-only": (4, 2)}


def _profile(d, **kw):
    draft, target = toy_pair(5, seed=4, closeness=0.8)
    profile([[0, 1], [2], [3, 4], [1]], out=d, draft=draft, target=target, trees=TREES, k_max=1, L_max=2,
            max_new_tokens=6, verifiers=["token"], families=["token"], shard_size=2, **kw)
    return d


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _profile(tmp_path_factory.mktemp("talong"))


def test_summary_renewal_and_palm_of_eagle2_and_the_per_node_rules(run):
    s = summarize(run, n_boot=50)
    ts = s.trees
    assert set(ts.renewal) == set(ts.palm) == {"topk:branching(2,2)", *ALONG}
    assert not {"wor:branching(2,1)/traversal", "wor:branching(2,1)/sequoia"} & set(ts.renewal)
    t = read_table(run).to_pandas()
    for name, (n, D) in ALONG.items():
        renewal, palm = renewal_and_palm_from_rows(t, name, n, D)
        np.testing.assert_allclose(ts.renewal[name].value, renewal, rtol=1e-12)
        np.testing.assert_allclose(ts.palm[name].value, palm, rtol=1e-12)
        tpc = ts.renewal[name].value  # tokens per call of a depth-D tree (weights at most 1): in [1, D + 1]
        assert tpc >= 1.0 and tpc <= D + 1
    text = report_markdown(s)
    assert "| eagle2:2,2,4 | 3 | 2 |" in text and "| wor:branching(2,1)/target-only | 4 | 2 |" in text
    assert "wor:branching(2,1)/sequoia ('sequoia' on children drawn without replacement has no closed form" in text


def test_at_a_stride_there_are_no_drawn_trees_between_positions(tmp_path):
    s = summarize(_profile(tmp_path / "s2", stride=2), n_boot=20)
    # the rank table and the i.i.d. closed form need no drawn tree
    assert set(s.trees.renewal) == {"topk:branching(2,2)", "iid:branching(2,1)/specinfer"}
    text = report_markdown(s)
    assert "eagle2:2,2,4 (it reads the tree drawn at every text position, and `stride` > 1" in text
    assert "wor:branching(2,1)/target-only (it reads the tree drawn at every text position" in text
