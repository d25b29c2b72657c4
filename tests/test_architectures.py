"""The architecture matrix: every supported family (tests/architectures.py) through the cache seam. For
each family: FullKV's logits at every position equal the model's own eager forward and its greedy tokens
equal ``model.generate`` (eager attention) on a prompt longer than the sliding window with decoding past
it; every method (on Llama; a method of each kind on the others: ``KINDS``) runs, never holds more than
its slot bound on any layer at any step (``min(budget, window - 1)`` on sliding layers), and at a
covering budget equals FullKV; StreamingLLM's re-rotation gives the keys RoPE computes at the shifted
positions with each layer type's own rotary embedding.
"""

from __future__ import annotations

import pytest
import torch

from methods import METHOD_REGISTRY, FullKV
from methods.seam.architecture import UnsupportedArchitectureError, check_supported, layer_specs
from methods.seam.cache import CompressedCache
from methods.seam.sliding import sliding_bound
from runners.generation.greedy import greedy_generate
from runners.generation.model_run import cache_arguments
from tests.architectures import FAMILIES, VOCAB, WINDOW, tiny_family
from tests.method_settings import SETTINGS

PROMPT, NEW = 40, 24  # PROMPT > WINDOW; decoding runs far past the window
#: Every method runs on Llama; the other families run the methods whose code reads what differs between
#: families (attention scores under soft-capping and MQA groups, RoPE re-rotation and un-rotation, ragged
#: heads, merging with a bias, learned state, per-layer and per-head budgets, probe forwards).
KINDS = {
    "snapkv", "h2o", "tova", "adakv", "pyramidkv", "zsmerge", "kvmerger", "keepkv", "less", "streamingllm",
    "expected_attention", "key_rerotation", "leverage_score", "kvzip", "kvgrad", "simlayerkv",
    "duo_attention", "cap", "kvcompose", "think",
}  # fmt: skip
PAIRS = [(f, n) for f in FAMILIES for n in sorted(SETTINGS) if f == "llama" or n in KINDS]


def prompt(seed: int, length: int = PROMPT) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, tiny_family(request.param), tiny_family(request.param, "eager")


def method_for(name: str, model: torch.nn.Module, tmp_path) -> object:
    kwargs = dict(SETTINGS[name][1])
    if name == "less":  # kernels of this family's geometry (random: LESS's cost, not its quality)
        kwargs = {"policy": "lambda", "checkpoint": "random"}
    layers = model.config.num_hidden_layers
    if name == "layer_ratios":  # one weight per layer of this family
        kwargs["ratios"] = [3, 1, 2, 1][:layers]
    if name == "duo_attention":  # a pattern of this family's shape: streaming and retrieval heads
        heads = model.config.num_key_value_heads
        gates = (torch.arange(layers * heads).reshape(layers, heads) + 1) % 2
        kwargs["pattern"] = str(tmp_path / "pattern.tsv")
        (tmp_path / "pattern.tsv").write_text("\n".join("\t".join(map(str, row.tolist())) for row in gates))
    return METHOD_REGISTRY[name](**kwargs)


@torch.no_grad()
def seam_logits(model: torch.nn.Module, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Logits ``[positions, vocab]`` of a FullKV prefill of ``prompt_len`` tokens, then one decode
    step per remaining token (teacher-forced)."""
    cache = CompressedCache.for_model(model, FullKV(), None)
    kw = {"use_cache": True, **cache_arguments(model, cache)}
    out = [model(input_ids=ids[:, :prompt_len], position_ids=torch.arange(prompt_len)[None], **kw).logits[0]]
    for t in range(prompt_len, ids.shape[1]):
        step = model(input_ids=ids[:, t : t + 1], position_ids=torch.tensor([[t]]), **kw)
        out.append(step.logits[0])
    return torch.cat(out)


def test_family_configs_have_what_they_test():
    assert KINDS <= set(SETTINGS)  # every kind is still a method
    specs = {name: layer_specs(tiny_family(name)) for name in FAMILIES}
    assert all(s.window == WINDOW for s in specs["mistral"]) and all(
        s.window == WINDOW for s in specs["phi3"]
    )
    assert [s.window for s in specs["gemma3"]] == [WINDOW, None, WINDOW]
    assert [s.window for s in specs["gemma2"]] == [WINDOW, None, WINDOW]
    assert all(s.softcap == 5.0 for s in specs["gemma2"])
    assert all(
        s.window is None and s.softcap is None for s in specs["llama"] + specs["qwen2"] + specs["qwen3"]
    )
    local, global_ = specs["gemma3"][0].rotary, specs["gemma3"][1].rotary
    assert local is specs["gemma3"][2].rotary and local is not global_  # cached per layer type
    cpu = torch.device("cpu")
    assert not torch.allclose(
        local.angles(5, torch.float32, cpu)[0], global_.angles(5, torch.float32, cpu)[0]
    )


def test_fullkv_logits_equal_the_eager_model_at_every_position(family):
    _, ours, eager = family
    ids = prompt(1, PROMPT + NEW)
    with torch.no_grad():
        reference = eager(ids).logits[0]
    torch.testing.assert_close(seam_logits(ours, ids, PROMPT), reference, atol=1e-4, rtol=1e-4)


def test_fullkv_tokens_equal_generate(family):
    _, ours, eager = family
    ids = prompt(2)
    with torch.no_grad():
        expected = eager.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False
        )[0, PROMPT:].tolist()
    res = greedy_generate(ours, ids, FullKV(), None, NEW, set())
    assert res.tokens == expected
    specs = layer_specs(ours)
    per_token = res.kv_bytes / sum(res.slots)  # one layer's K+V bytes per token (same geometry per layer)
    seen = PROMPT + NEW - 1  # the last generated token is never fed back
    own_cache = sum(seen if s.window is None else s.window - 1 for s in specs) * per_token
    assert res.fullkv_bytes == res.kv_bytes == own_cache  # FullKV holds what the model's own cache holds


@pytest.mark.parametrize(("family", "name"), PAIRS, indirect=["family"])
def test_every_method_runs_within_its_slot_bound(family, name, tmp_path):
    _, ours, _ = family
    method = method_for(name, ours, tmp_path)
    budget = 10 if method.traits.budget_applies else None  # as the runners pass it
    specs = layer_specs(ours)
    steps = []

    def check(cache) -> None:
        steps.append(1)
        for layer, spec in zip(cache.layers, specs, strict=True):
            if spec.window is not None:
                bound = sliding_bound(budget, spec.window)
            elif budget is None:
                bound = PROMPT + len(steps) - 1
            elif method.traits.holds_in_decode:
                bound = layer.budget  # the layer's own (layer allocators), else the run's
            else:  # prompt-only methods (SnapKV, KVMerger) append decoded tokens
                bound = layer.budget + len(steps) - 1
            held = layer.store.head_slots().float().mean()  # ragged heads (AdaKV) share the layer's bound
            pooled = getattr(method, "layerwise", True) is False  # KVCompose: the layers share the budget
            assert held <= bound or pooled, (layer.spec.layer_idx, held, bound)
            keys = layer.keys if layer.store.kind == "uniform" else layer.store.buffers["keys"]
            assert torch.isfinite(keys).all()

    res = greedy_generate(ours, prompt(3), method, budget, NEW, set(), check)
    assert len(steps) == NEW
    # a method with no budget (DuoAttention) acts on full-attention layers only: none on Mistral/Phi-3
    compressed = method.traits.compresses and (budget is not None or any(s.window is None for s in specs))
    assert res.kv_bytes < res.fullkv_bytes if compressed else res.kv_bytes == res.fullkv_bytes


@pytest.fixture(scope="module")
def fullkv_tokens(family) -> list[int]:
    """FullKV's greedy tokens on ``prompt(4)``: what every method must give at a covering budget."""
    _, ours, _ = family
    return greedy_generate(ours, prompt(4), FullKV(), None, NEW, set()).tokens


@pytest.mark.parametrize(("family", "name"), PAIRS, indirect=["family"])
def test_covering_budget_gives_fullkv_output(family, fullkv_tokens, name, tmp_path):
    _, ours, _ = family
    method = method_for(name, ours, tmp_path)
    if not method.traits.budget_applies:
        pytest.skip("the budget does not drive it (DuoAttention: tests/test_allocators.py, sparsity 0)")
    if getattr(method, "key_channel_compression_ratio", 0):
        pytest.skip("ThinK prunes key channels at any token budget (tests/test_think.py)")
    covering = PROMPT + NEW if method.traits.holds_in_decode else PROMPT
    ratios = getattr(method, "ratios", None)
    if ratios:  # every layer's share must cover the prompt
        covering = int(-(-covering * sum(ratios) // (len(ratios) * min(ratios))))
    assert greedy_generate(ours, prompt(4), method, covering, NEW, set()).tokens == fullkv_tokens


def test_streamingllm_rerotation_matches_rope_at_cache_index_positions(family):
    """Paper Sec. 3.2: positions by cache index. Re-rotating a key stored at position p by d must
    give RoPE(k, p + d) with the layer's own rotary embedding (Gemma-3: local vs global base)."""
    _, ours, _ = family
    import importlib

    modeling = importlib.import_module(type(ours).__module__)
    specs = layer_specs(ours)
    raw = torch.randn(1, 2, 5, _head_dim(ours))
    for spec in {id(s.rotary): s for s in specs}.values():
        turn = spec.rotary

        def rope(x, positions, turn=turn):
            args = (x, torch.tensor([positions]))
            cos, sin = (
                turn.rotary_emb(*args) if turn.layer_type is None else turn.rotary_emb(*args, turn.layer_type)
            )
            return modeling.apply_rotary_pos_emb(x, x, cos, sin)[1]

        at_p = rope(raw, [0, 1, 2, 3, 9])
        torch.testing.assert_close(
            turn.rerotate(at_p, 17), rope(raw, [17, 18, 19, 20, 26]), atol=1e-5, rtol=1e-5
        )
    # and the method runs on every family with re-rotation on, evicting past the window
    res = greedy_generate(ours, prompt(5), METHOD_REGISTRY["streamingllm"](n_sink=2), 8, NEW, set())
    assert len(res.tokens) == NEW


def _head_dim(model) -> int:
    config = model.config
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def test_unsupported_architectures_are_named_before_loading():
    from transformers import DeepseekV3Config, MambaConfig, T5Config

    for config, feature in ((T5Config(), "cross-attention"), (MambaConfig(), "linear_attention"),
                            (DeepseekV3Config(), "latent (MLA)")):  # fmt: skip
        with pytest.raises(
            UnsupportedArchitectureError, match=feature.replace("(", r"\(").replace(")", r"\)")
        ):
            check_supported(config)
    for name in FAMILIES:
        check_supported(tiny_family(name).config)
