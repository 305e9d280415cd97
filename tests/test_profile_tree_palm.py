"""Static top-k trees along the text: the exact emission table, the renewal estimate and the Palm average."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from otspec.models import MarkovModel  # noqa: E402
from otspec.profile import (  # noqa: E402
    emission_probs_along,
    profile,
    read_table,
    starts_recursion,
    summarize,
    toy_pair,
)
from otspec.profile._report import report_markdown  # noqa: E402
from otspec.profile._trees import text_ranks, topk_emission_along  # noqa: E402
from otspec.tree import TargetOnlyVerifier, TreeShape, sample_tree, tree_laws, value  # noqa: E402

SHAPES = [TreeShape.branching(2, 2), TreeShape.from_paths([(0,), (2,), (0, 1)]), TreeShape.chains(1, 3),
          TreeShape.branching(3, 1, 2)]


def _softmax(W: np.ndarray) -> np.ndarray:
    e = np.exp(W - W.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _text(seed: int, V: int = 5, T: int = 9, closeness: float = 0.8):
    """A target-sampled text after a prompt, and both models' laws at its contexts (numpy softmax of the toy's
    tables: independent of the models' torch route)."""
    draft, target = toy_pair(V, seed=seed, closeness=closeness)
    Md, Mt = MarkovModel(_softmax(draft.fn.table)), MarkovModel(_softmax(target.fn.table))
    rng = np.random.default_rng(seed)
    prompt, y = [int(rng.integers(V))], []
    for _ in range(T):
        y.append(int(rng.choice(V, p=Mt.next_dist(tuple(prompt + y)))))
    P = np.array([Md.next_dist(tuple(prompt + y[:t])) for t in range(T)])
    Q = np.array([Mt.next_dist(tuple(prompt + y[:t])) for t in range(T)])
    return Md, Mt, prompt, np.array(y), P, Q


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=["b22", "gap", "chain3", "b312"])
def test_emission_is_the_target_only_law_on_the_realised_tree(seed, shape):
    Md, Mt, prompt, y, P, Q = _text(seed)
    T, D = len(y), shape.max_depth
    E = topk_emission_along(shape, P, Q, y)
    assert E.shape == (T, D + 1)
    deep = 0
    for s in range(T):
        ctx = tuple(prompt + y[:s].tolist())
        tree = sample_tree(shape, Md, process="topk", prefix=ctx)
        pn, qn = tree_laws(tree, Md, Mt, prefix=ctx)
        law = TargetOnlyVerifier().emission(tree, pn, qn)  # (n + 1, V): accepted node, emitted token
        node = {tree.path(i): i for i in range(tree.n + 1)}
        for j in range(1, D + 2):
            if s + j > T:
                np.testing.assert_array_equal(E[s, j - 1], 0.0)
                continue
            a = node.get(tuple(y[s:s + j - 1].tolist()))
            want = 0.0 if a is None else law[a, y[s + j - 1]]
            np.testing.assert_allclose(E[s, j - 1], want, rtol=1e-12, atol=1e-15)
            deep += j >= 2 and want > 0
    assert deep > 0  # some iterations accept text tokens: the check reaches past the root
    assert np.all(E >= 0) and np.all(E.sum(axis=1) <= 1 + 1e-12)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("L", [1, 2, 4])
def test_a_chain_is_token_verification_of_the_greedy_draft(seed, L):
    # topk:chains(1, L) drafts the draft's argmax (lowest id on ties) at every depth: token verification of a
    # point-mass draft, whose closed-form table (min(p, q) then (q - p)_+) is a second route
    _, _, _, y, P, Q = _text(seed, T=10)
    onehot = np.zeros_like(P)
    onehot[np.arange(len(y)), np.argmax(P, axis=1)] = 1.0
    np.testing.assert_array_equal(text_ranks(P, y) == 0, np.argmax(P, axis=1) == y)
    got = topk_emission_along(TreeShape.chains(1, L), P, Q, y)
    want = emission_probs_along("token", onehot, Q, y, L=L)
    T = len(y)
    inside = np.arange(T)[:, None] + np.arange(1, L + 2)[None, :] <= T
    np.testing.assert_allclose(got[inside], want[inside], rtol=1e-12, atol=1e-15)
    lq = np.log(Q[np.arange(T), y])
    np.testing.assert_allclose(starts_recursion(got, lq), starts_recursion(np.where(inside, want, 0.0), lq),
                               rtol=1e-12, atol=1e-15)


def test_ranks_break_ties_by_the_lower_id():
    p = np.array([[0.3, 0.3, 0.4, 0.0], [0.25, 0.25, 0.25, 0.25]])
    assert text_ranks(p, np.array([1, 0])).tolist() == [2, 0]
    assert text_ranks(p, np.array([3, 3])).tolist() == [-1, 3]  # no mass: never a drafted child


TREES = ["topk:chains(1,2)", "topk:branching(2,2)", "iid:branching(2,1):specinfer"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("tpalm")
    draft, target = toy_pair(5, seed=4, closeness=0.8)
    profile([[0, 1], [2], [3, 4], [1]], out=d, draft=draft, target=target, trees=TREES, k_max=1, L_max=2,
            max_new_tokens=6, verifiers=["token"], families=["token"], shard_size=2)
    return d


def renewal_and_palm_from_rows(t, name: str, n: int, D: int) -> tuple[float, float]:
    """The renewal estimate and the Palm average of one tree row name, recomputed from a run's stored rows (a
    pandas frame): the start recursion on its ``kind="e"`` rows per prompt, weighted by its ``kind="tree"`` rows."""
    starts, Tn, num, den = 0.0, 0, 0.0, 0.0
    for p in sorted(t.prompt.unique()):
        lq = t[(t.kind == "logq") & (t.prompt == p)].sort_values("pos").value.to_numpy()
        e = t[(t.kind == "e") & (t.prompt == p) & (t.name == name)]
        assert (e.k == n).all() and (e.m == D).all() and len(set(e.pos)) == len(lq)
        E = np.zeros((len(lq), D + 1))
        E[e.pos.to_numpy(), e.j.to_numpy() - 1] = e.value.to_numpy()
        assert np.all(E.sum(axis=1) <= 1 + 1e-12)
        r = starts_recursion(E, lq)
        starts, Tn = starts + r.sum(), Tn + len(lq)
        tr = t[(t.kind == "tree") & (t.prompt == p) & (t.name == name)]
        num += float(r[tr.pos.to_numpy()] @ (1.0 + tr.value.to_numpy()))
        den += float(r[tr.pos.to_numpy()].sum())
    return Tn / starts, num / den


def test_summary_renewal_and_palm_of_the_deterministic_trees(run):
    s = summarize(run, n_boot=50)
    ts = s.trees
    assert set(ts.renewal) == set(ts.palm) == set(ts.position_bias) == {
        "topk:chains(1,2)", "topk:branching(2,2)", "iid:branching(2,1)/specinfer"}  # the last: closed form
    assert not any(f.startswith("topk:") for f, _, _ in s.renewal)  # the (k, L) table keeps its own schemes
    t = read_table(run).to_pandas()
    for name, n, D in (("topk:chains(1,2)", 2, 2), ("topk:branching(2,2)", 6, 2)):
        renewal, palm = renewal_and_palm_from_rows(t, name, n, D)
        np.testing.assert_allclose(ts.renewal[name].value, renewal, rtol=1e-12)
        np.testing.assert_allclose(ts.palm[name].value, palm, rtol=1e-12)
        np.testing.assert_allclose(ts.position_bias[name].value,
                                   ts.tokens_per_call[name].value / ts.palm[name].value - 1.0, rtol=1e-12)
        assert ts.renewal[name].value >= 1.0 and ts.renewal[name].value <= D + 1  # tokens per call in [1, D + 1]


def test_report_has_the_trees_renewal_table(run):
    text = report_markdown(summarize(run, n_boot=50))
    assert "| tree | nodes | depth | renewal | Palm | per-position bias | emission along the text |" in text
    assert "| topk:branching(2,2) | 6 | 2 |" in text


@pytest.mark.parametrize("shape", SHAPES[:3], ids=["b22", "gap", "chain3"])
def test_summed_over_continuations_the_table_is_the_iteration_law(shape):
    # over every continuation z of the context, e(0, j) read along z is the law of the emitted block: it sums to 1
    # and its mean length is 1 + the tree's value, as otspec.tree.value computes it
    draft, target = toy_pair(4, seed=7, closeness=0.8)
    Md, Mt = MarkovModel(_softmax(draft.fn.table)), MarkovModel(_softmax(target.fn.table))
    ctx, D = (2, 1), shape.max_depth
    law = {}
    for flat in range(4 ** (D + 1)):
        z = [(flat // 4 ** i) % 4 for i in range(D + 1)]
        P = np.array([Md.next_dist(ctx + tuple(z[:t])) for t in range(D + 1)])
        Q = np.array([Mt.next_dist(ctx + tuple(z[:t])) for t in range(D + 1)])
        e = topk_emission_along(shape, P, Q, np.array(z))[0]
        for j in range(1, D + 2):
            law[tuple(z[:j])] = law.get(tuple(z[:j]), e[j - 1])
            np.testing.assert_allclose(law[tuple(z[:j])], e[j - 1], rtol=0, atol=0)  # one number per block
    total = sum(law.values())
    mean = sum(len(b) * v for b, v in law.items())
    np.testing.assert_allclose(total, 1.0, rtol=1e-12)
    want = value(shape, Md, Mt, process="topk", verifier="target-only", prefix=ctx)
    np.testing.assert_allclose(mean, 1.0 + want, rtol=1e-12)
