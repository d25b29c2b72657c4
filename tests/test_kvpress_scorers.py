"""NonCausalAttn, Compactor and CAPKV against references written here from kvpress's rules
(``non_causal_attention_press.py``, ``compactor_press.py``, ``cap_press.py``): loops over chunks and
queries, explicit inverses in float64, rotation matrices, on one layer of tiny random tensors (the
helpers of ``tests/press_fixtures.py``)."""

from __future__ import annotations

import pytest
import torch

from methods import Cap, Compactor, NonCausalAttn
from tests.press_fixtures import GROUP, HKV, D, kept, prefilled, rope, rotary_spec, tensors


def chunk_scores(keys: torch.Tensor, values: torch.Tensor, query: torch.Tensor, chunk: int) -> torch.Tensor:
    """kvpress's non-causal attention score ``[HKV, n]`` (float64): per query head and chunk, every query
    of the chunk attends to every key of the chunk, ``softmax(q k^T)`` unscaled, the last chunk padded
    to ``chunk`` with zero queries and keys (logit 0); column sums over the chunk's queries, averaged
    over the group, times ``||v||``, averaged with the two neighbours (zeros outside), z-scored over
    all heads and tokens."""
    n = keys.shape[2]
    att = torch.zeros(HKV * GROUP, n, dtype=torch.float64)
    for head in range(HKV * GROUP):
        k, q = keys[0, head // GROUP].double(), query[0, head].double()
        for start in range(0, n, chunk):
            idx = list(range(start, min(start + chunk, n)))
            pad = chunk - len(idx)
            for i in idx:
                logits = torch.cat([k[idx] @ q[i], torch.zeros(pad, dtype=torch.float64)])
                att[head, idx] += torch.softmax(logits, 0)[: len(idx)]
            att[head, idx] += pad / chunk  # each padded query: uniform over the chunk
    s = att.view(HKV, GROUP, n).mean(1) * values[0].double().norm(dim=-1)
    padded = torch.nn.functional.pad(s, (1, 1))
    s = (padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]) / 3
    return (s - s.mean()) / s.std()


def top(scores: torch.Tensor, k: int, offset: int = 0) -> list[set[int]]:
    """Per KV head, the positions (plus ``offset``) of the ``k`` highest ``scores`` ``[HKV, n]``."""
    return [{offset + i for i in scores[h].topk(k).indices.tolist()} for h in range(HKV)]


@pytest.mark.parametrize(("n", "chunk"), [(30, 8), (32, 8), (20, 32)])
def test_non_causal_attn_keeps_the_most_attended_in_non_causal_chunks(n, chunk):
    """kvpress ``NonCausalAttnPress``: a partial last chunk (30 = 3 x 8 + 6), whole chunks, one chunk
    larger than the prompt."""
    keys, values, query = tensors(n, seed=5)
    budget = n // 2
    layer = prefilled(NonCausalAttn(chunk_size=chunk), keys, values, query, budget)
    want = top(chunk_scores(keys, values, query, chunk), budget)
    assert kept(layer) == [sorted(w) for w in want]


@pytest.mark.parametrize("blending", [0.3, None])
def test_compactor_blends_leverage_and_non_causal_attention_between_its_sinks(blending):
    """kvpress ``CompactorPress``: the first 3 and last 2 tokens kept; between them ``blending x
    leverage + attention``, each z-scored over the span (the leverage of the span's pre-RoPE keys,
    centred over the span, explicit inverse); None blends by the evicted share ``1 - budget / n``."""
    n, budget, chunk, sketch = 40, 17, 8, 4
    pre, values, query = tensors(n, seed=4)
    spec, emb = rotary_spec()
    method = Compactor(
        sink_size_start=3, sink_size_end=2, chunk_size=chunk, sketch_dimension=sketch, blending=blending
    )
    keys = rope(pre, torch.arange(n), emb)
    layer = prefilled(method, keys, values, rope(query, torch.arange(n), emb), budget, spec)
    phi = method.leverage.sketch(layer, HKV, D, pre.device).double()
    span = slice(3, n - 2)
    lev = []
    for h in range(HKV):
        x = (pre[0, h, span] - pre[0, h, span].mean(0)).double() @ phi[h]
        lev.append(torch.diag(x @ torch.linalg.inv(x.T @ x + 1e-2 * torch.eye(sketch)) @ x.T))
    lev = torch.stack(lev)
    lev = (lev - lev.mean()) / lev.std()
    att = chunk_scores(
        keys[:, :, span], values[:, :, span], rope(query, torch.arange(n), emb)[:, :, span], chunk
    )
    weight = 1 - budget / n if blending is None else blending
    want = top(weight * lev + att, budget - 5, offset=3)
    assert kept(layer) == [sorted(w | {0, 1, 2, n - 2, n - 1}) for w in want]


def rotation(emb, positions: torch.Tensor) -> torch.Tensor:
    """The mean ``[D, D]`` over ``positions`` of RoPE's rotation matrices ``cos_p I + R sin_p`` (``R``:
    rotate_half as a matrix), as kvpress's ``_avg_rope_matrix``."""
    cos, sin = emb(torch.zeros(1, D), positions[None])
    half = torch.zeros(D, D, dtype=torch.float64)
    half[D // 2 :, : D // 2] = torch.eye(D // 2)
    half[: D // 2, D // 2 :] = -torch.eye(D // 2)
    mats = [
        torch.diag(c.double()) + half @ torch.diag(s.double()) for c, s in zip(cos[0], sin[0], strict=True)
    ]
    return torch.stack(mats).mean(0)


def test_cap_keeps_the_sinks_and_the_largest_weighted_value_leverage():
    """kvpress ``CapPress``: the anchor, the mean pre-RoPE query after the sinks turned by the mean
    rotation over the next 16 positions; weights ``exp(tau (cos(anchor, k) - max))``; scores
    ``w_i v_i^T A^{-1} v_i``, ``A = I + sum (w + eps) v v^T`` (an explicit inverse), averaged over the group;
    the sinks kept."""
    n, budget, sinks, future, tau, eps = 30, 12, 3, 16, 5.0, 1e-6
    pre, values, qpre = tensors(n, seed=6)
    spec, emb = rotary_spec()
    keys = rope(pre, torch.arange(n), emb)
    method = Cap(n_sink=sinks, n_future_positions=future, tau=tau, epsilon=eps)
    layer = prefilled(method, keys, values, rope(qpre, torch.arange(n), emb), budget, spec)
    turn = rotation(emb, torch.arange(n, n + future))
    scores = torch.zeros(HKV, GROUP, n - sinks, dtype=torch.float64)
    for head in range(HKV * GROUP):
        h, g = divmod(head, GROUP)
        anchor = (qpre[0, head, sinks:].double() @ turn.T).mean(0)
        k, v = keys[0, h, sinks:].double(), values[0, h, sinks:].double()
        cos = (k @ anchor) / (k.norm(dim=-1) * anchor.norm())
        w = torch.exp(tau * cos - (tau * cos).max())
        a = torch.eye(D, dtype=torch.float64) + sum(
            (w[t] + eps) * torch.outer(v[t], v[t]) for t in range(len(v))
        )
        scores[h, g] = w * torch.einsum("td,de,te->t", v, torch.linalg.inv(a), v)
    want = top(scores.mean(1), budget - sinks, offset=sinks)
    assert kept(layer) == [sorted(w | set(range(sinks))) for w in want]


def test_options_are_checked_before_any_model_loads():
    for bad in (
        lambda: NonCausalAttn(chunk_size=0),
        lambda: Compactor(sink_size_end=-1),
        lambda: Compactor(blending=-0.1),
        lambda: Cap(n_future_positions=0),
        lambda: Cap(tau=-1.0),
    ):
        with pytest.raises(ValueError):
            bad()
