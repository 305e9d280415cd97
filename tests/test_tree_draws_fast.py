"""The one-cumulative-sum draws without replacement and the shrinking-set rejection scan: the very same tokens
and levels as the one-pass-per-draw (per-rejection) procedures they replace, and the exact law of the draws."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from otspec._verifier import sample_from
from otspec.decoding._sampling import sample_rows
from otspec.profile._trees import _ShapeJob
from otspec.tree import TreeShape, _process, _verifiers
from otspec.tree._process import _draws_without_replacement, _wor_sequences, draw_children


def _sequential(p, need, gen):
    """The reference: draw ``j`` from a copy of ``p`` with the earlier draws set to 0, summed again."""
    w = np.array(p, copy=True)
    seq = []
    for _ in range(need):
        t = sample_from(w, gen)
        seq.append(t)
        w[t] = 0.0
    return seq


def _laws(rng, count):
    """Draft laws of every kind the draws meet: sparse and flat Dirichlet, zeros, heavy tails, ties, tiny V."""
    for trial in range(count):
        V = int(rng.choice([2, 3, 7, 64, 1000, 49_152]))
        kind = trial % 5
        if kind == 0:
            p = rng.dirichlet(np.full(V, 0.1))
        elif kind == 1:
            p = rng.dirichlet(np.ones(V))
        elif kind == 2:  # half the vocabulary at probability 0
            p = rng.dirichlet(np.full(V, 0.05))
            p[rng.random(V) < 0.5] = 0.0
            p[int(rng.integers(V))] += 0.1
            p /= p.sum()
        elif kind == 3:  # log-normal masses over 20 orders of magnitude
            p = np.exp(rng.normal(0.0, 8.0, V))
            p /= p.sum()
        else:  # ties: a few distinct values
            p = rng.integers(0, 4, V).astype(np.float64)
            p[0] += 1.0
            p /= p.sum()
        need = int(min(np.count_nonzero(p > 0), rng.integers(1, 10)))
        yield p, need


def test_draws_without_replacement_are_the_sequential_draws():
    """Same generator, same tokens: 1,500 laws from V = 2 to 49,152, up to 9 draws each, including draws of
    the whole support (the last ones with almost no mass left)."""
    rng = np.random.default_rng(20261127)
    for p, need in _laws(rng, 1500):
        seed = int(rng.integers(2**32))
        got = _draws_without_replacement(p, need, np.random.default_rng(seed))
        assert got == _sequential(p, need, np.random.default_rng(seed))


def test_the_exact_fallback_is_the_sequential_draw(monkeypatch):
    """With every candidate refused, each later draw is made by the sequential procedure itself, with the uniform
    already drawn: still the same tokens (and the refusal is reached: the candidates are checked)."""
    calls = []
    monkeypatch.setattr(_process, "_inside", lambda *a: calls.append(1) and False)
    rng = np.random.default_rng(7)
    for p, need in _laws(rng, 200):
        seed = int(rng.integers(2**32))
        assert _draws_without_replacement(p, need, np.random.default_rng(seed)) == _sequential(
            p, need, np.random.default_rng(seed))
    assert len(calls) > 300


def test_draw_children_keeps_the_draws():
    """``draw_children``: i.i.d. children from one cumulative sum and ranked draws without replacement, the tokens
    of the per-child procedures; the same generator state afterwards."""
    rng = np.random.default_rng(11)
    for p, need in _laws(rng, 300):
        ranks = sorted(rng.choice(need, size=int(rng.integers(1, need + 1)), replace=False).tolist())
        ranks[-1] = need - 1
        for process in ("iid", "wor"):
            g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
            got = draw_children(p, ranks, process, g1)
            if process == "iid":
                ref = [sample_from(p, g2) for _ in ranks]
            else:
                seq = _sequential(p, need, g2)
                ref = [seq[r] for r in ranks]
            assert got == ref
            assert g1.random() == g2.random()


def test_profile_shape_job_keeps_its_draws():
    """The profile's sampled trees without replacement: the tokens its former loop drew (``sample_rows`` on a
    copy of the law, the drawn tokens zeroed), for a shape with a rank gap (rank 1 drawn and discarded)."""
    shape = TreeShape([(0,), (2,), (0, 0), (0, 1)])
    rng = np.random.default_rng(3)
    for _ in range(100):
        p = rng.dirichlet(np.full(5000, 0.1))
        job = _ShapeJob(shape, "wor", np.random.default_rng(9), "wor:test")
        job.expand(0, p)
        gen = np.random.default_rng(9)
        w = p.copy()
        seq = []
        for _ in range(3):
            t = int(sample_rows(w[None], gen)[0])
            seq.append(t)
            w[t] = 0.0
        assert [job.token(1), job.token(2)] == [seq[0], seq[2]]


def test_draws_without_replacement_follow_the_exact_law():
    """Chi-square of 30,000 ordered triples (V = 6, a law with a 0 and a tiny mass) against the exact law of the
    ordered draws (``_wor_sequences``, enumerated); cells of expected count below 5 pooled. False-failure rate
    1e-6."""
    p = np.array([0.4, 0.0, 0.25, 1e-3, 0.2, 0.149])
    exact = dict(_wor_sequences(p, 3))
    rng = np.random.default_rng(2026)
    N = 30_000
    counts: dict = {}
    for _ in range(N):
        key = tuple(_draws_without_replacement(p, 3, rng))
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    big = [k for k, w in exact.items() if N * w >= 5]
    obs = [counts.get(k, 0) for k in big] + [N - sum(counts.get(k, 0) for k in big)]
    exp = [N * exact[k] for k in big] + [N * (1.0 - sum(exact[k] for k in big))]
    assert stats.chisquare(obs, exp).pvalue > 1e-6


def _full_excess(q, p, t, buf, idx, n):
    """The reference level: ``S(t)`` summed over the whole vocabulary in token order (the former one pass)."""
    s = 0.0
    for qi, pi in zip(q.tolist(), p.tolist()):
        d = qi - t * pi
        if d > 0.0:
            s += d
    return s, q.shape[0]


@pytest.mark.parametrize("jit", [True, False])
def test_node_scan_on_the_shrinking_set_keeps_the_levels(monkeypatch, jit):
    """``_NodeScan``'s levels ``(t, S)`` and acceptances along a scan of rejections: with numba, bit for bit those
    of the whole-vocabulary sum in token order; the numpy path to rounding (its sums are pairwise)."""
    if jit and not _verifiers.JIT:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(17)
    for trial in range(60):
        V = int(rng.choice([3, 40, 3000]))
        p, q = rng.dirichlet(np.full(V, 0.3)), rng.dirichlet(np.full(V, 0.3))
        if trial % 2:
            q = 0.8 * p + 0.2 * q
        toks = rng.choice(V, size=min(V, 9), replace=False, p=p).tolist()
        for wor in (False, True):
            runs = []
            for ref in (False, True):
                with monkeypatch.context() as m:
                    m.setattr(_verifiers, "JIT", jit)
                    if ref:
                        m.setattr(_verifiers, "_excess", _full_excess)
                    node = _verifiers._NodeScan(q, p, np.empty(V), wor)
                    out = []
                    for tok in toks:
                        out.append(node.accept(tok, False))
                        node.reject(tok, False)
                        out += [node.t, node.S]
                    runs.append(np.array(out))
            if jit:
                np.testing.assert_array_equal(runs[0], runs[1])
            else:
                np.testing.assert_allclose(runs[0], runs[1], rtol=1e-12, atol=1e-15)
