"""Whole walks of the chains on the device route (torch CPU tensors) agree with the numpy route, row for row.

The chains' quantities of a position -- alpha_k per depth, k-Seq, multi-round, the maximal coupling, greedy and top-k
draft sets, typical acceptance, token and block E[tau | X], the optimal verifier's reach, the renewal tables along the
text -- are computed on the device route in a few batched passes (every depth, node and prompt of a position at once;
k-Seq's rho* of a position in one bisection), on the numpy route by the same formulas row by row where the host does
so. Every row of both routes is recorded with the same keys and values within 1e-12 relative (float64 sums over the
vocabulary in another order; torch's vectorised ``pow``), at cheap and subsampled positions, one to four prompts walked
together, ``k_max`` and ``L_max`` from 1 to 4.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

V = 64
PROMPTS = [[3, 7, 1], [5, 2, 9, 4], [1, 1], [8, 3, 6]]


@pytest.fixture(scope="module")
def pair():
    from tests.toy_lm import tiny_llama

    return tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)


def _rows(pair, monkeypatch, device, k_max, L_max, subsample, B) -> dict:
    """``{(prompt, pos, kind, name, k, j, m): value}`` of one walk (renewal tables along the text included; the timing
    rows left out)."""
    import otspec.profile._collect as C
    from otspec.profile import ProfileSettings
    from otspec.profile._renewal_hook import emission_rows

    draft, target = pair
    s = ProfileSettings(k_max=k_max, L_max=L_max, max_new_tokens=2, subsample=subsample,
                        batch_size=B).for_vocabulary(V)
    monkeypatch.setattr(C, "analysis_device", lambda lm: device)
    if B == 1:
        got = [C.profile_prompt(draft, target, PROMPTS[0], None, s, 0, renewal=emission_rows)]
    else:
        got = C.profile_bucket(draft, target, PROMPTS[:B], [None] * B, s, list(range(B)), renewal=emission_rows)
    out = {}
    for r in got:
        for i in range(len(r["kind"])):
            if r["kind"][i] in C.TIMING_KINDS:
                continue
            out[tuple(r[c][i] for c in ("prompt", "pos", "kind", "name", "k", "j", "m"))] = r["value"][i]
    return out


def _agree(pair, monkeypatch, k_max, L_max, subsample, B):
    host = _rows(pair, monkeypatch, None, k_max, L_max, subsample, B)
    dev = _rows(pair, monkeypatch, torch.device("cpu"), k_max, L_max, subsample, B)
    assert dev.keys() == host.keys()
    names = {key[3] for key in host}
    assert {"token", "optimal", "block", "block-onestep"} <= names
    if subsample:
        assert {"kseq", "multiround", "typical"} <= names
    keys = sorted(host, key=str)
    a = np.array([dev[k] for k in keys], dtype=np.float64)
    b = np.array([host[k] for k in keys], dtype=np.float64)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-300, equal_nan=True)


@pytest.mark.parametrize("k_max,L_max,subsample,B", [(4, 4, 1, 1), (2, 2, 1, 2), (3, 2, 0, 2)])
def test_whole_walks_of_the_chains_agree_on_both_routes(pair, monkeypatch, k_max, L_max, subsample, B):
    _agree(pair, monkeypatch, k_max, L_max, subsample, B)


@pytest.mark.slow
@pytest.mark.parametrize("B", [1, 2, 4])
@pytest.mark.parametrize("subsample", [0, 1])
@pytest.mark.parametrize("k_max,L_max", [(k, L) for k in range(1, 5) for L in range(1, 5)])
def test_whole_walks_of_the_chains_agree_on_both_routes_every_shape(pair, monkeypatch, k_max, L_max, subsample, B):
    _agree(pair, monkeypatch, k_max, L_max, subsample, B)


@pytest.mark.parametrize("route", ["numpy", "torch"])
def test_whole_walks_with_the_full_bisection_are_the_same_bits(pair, monkeypatch, route):
    # k-Seq's rho* by 80 bisection steps (before) and by the grid on the floats' bits (now): every row of a subsampled
    # walk of two prompts the same, bit for bit, on either route
    import otspec.multidraft._batched as MB

    dev = None if route == "numpy" else torch.device("cpu")
    now = _rows(pair, monkeypatch, dev, 4, 3, 1, 2)
    monkeypatch.setattr(MB, "_bisect_steps", lambda k: MB._BISECT)
    monkeypatch.setattr(MB, "_BISECT_ONLY", True)
    full = _rows(pair, monkeypatch, dev, 4, 3, 1, 2)
    assert any(key[3] == "kseq" for key in now)
    assert now.keys() == full.keys()
    assert all(now[k] == full[k] or (now[k] != now[k] and full[k] != full[k]) for k in now)
