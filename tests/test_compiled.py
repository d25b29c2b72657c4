"""The compiled decode step (``backend=compiled``): the same tokens as eager for every method on the
embedded model, captured whole (no graph break) with static shapes once the cache is full.

The model is the embedded SmolLM2 cut to its first two decoder layers: Inductor's compile time grows
with the number of layers it unrolls (~1 min per method for two layers on 2 CPU cores), while the
code it compiles (the model's layer, the cache seam, the method) is the same for every layer.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch._dynamo.utils import counters

from methods import METHOD_REGISTRY, SnapKV
from runners.generation.greedy import ModelRun, greedy_generate
from runners.measure.timing import synthetic_prompts
from runners.results.store import run_identity
from runners.setup.budget import resolve_budget
from tests.conftest import REPO
from tests.method_settings import TINY_PROMPT

pytestmark = pytest.mark.integration

KWARGS = {
    "adakv": {"scorer": METHOD_REGISTRY["snapkv"](window_size=8)},
    "duo_attention": {
        "pattern": str(REPO / "tests" / "data" / "duo_pattern_2x3.tsv"),
        "sink_size": 4,
        "recent_size": 28,
    },
    "criticalkv": {"scorer": SnapKV(decode_budget=True)},
    "kvmerger": {"exact_budget": True},
    "kvzip": {"prompt": TINY_PROMPT, "chunk_size": 128},  # a few reconstruction chunks
    "kvgrad": {"prompt": TINY_PROMPT, "chunk_size": 128},  # KVzip's, with a backward per chunk
    "layer_ratios": {"scorer": METHOD_REGISTRY["snapkv"](window_size=8), "ratios": [2, 1]},
    "lagkv": {"lag_size": 32},  # a partition completes during decoding (its scoring path is compiled)
    "less": {"checkpoint": "random"},
    "rkv": {"buffer": 8},
    "pyramidkv": {"scorer": METHOD_REGISTRY["snapkv"](window_size=8), "beta": 4},
}
PROMPTS, NEW, BUDGET = (300, 260), 24, 0.2


@pytest.fixture(scope="module")
def shallow():
    """The embedded model with its first two decoder layers."""
    from runners.models.loading import load_model

    model = load_model(OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml"))
    model.model.layers = model.model.layers[:2]
    model.config.num_hidden_layers = 2
    return model


@pytest.mark.parametrize("name", sorted(METHOD_REGISTRY))
def test_compiled_decode_gives_eager_tokens_without_graph_breaks(shallow, name):
    """Two samples of different lengths (so different budgets and buffer sizes) through one compiled
    step: identical tokens, no graph break, a bounded number of graphs (the shapes and the token
    position become symbolic once they change; no recompilation per step or per sample after that)."""
    tokens: dict[str, list[list[int]]] = {"eager": [], "compiled": []}
    torch._dynamo.reset()
    shallow.__dict__.pop("_kvbench_compiled", None)
    counters.clear()
    for backend in ("eager", "compiled"):
        for seed, prompt in enumerate(PROMPTS):
            ids = synthetic_prompts(shallow.config.vocab_size, 1, prompt, seed)
            budget = None if name == "fullkv" else resolve_budget(BUDGET, prompt)
            method = METHOD_REGISTRY[name](**KWARGS.get(name, {}))
            run = ModelRun(shallow, method, budget, prompt + NEW, backend=backend)
            with torch.inference_mode():
                token = run.prefill(ids).argmax(-1)
                out = [int(token)]
                for _ in range(NEW):
                    token = run.step(token).argmax(-1)
                    out.append(int(token))
            tokens[backend].append(out)
            if budget is not None and method.traits.holds_in_decode:
                assert max(run.cache.n_slots) <= budget
    assert tokens["compiled"] == tokens["eager"]
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] <= 5


HOLDING = sorted(
    name
    for name, cls in METHOD_REGISTRY.items()
    if cls(**KWARGS.get(name, {})).traits.holds_in_decode and name != "rkv"  # R-KV's count cycles
)


@pytest.mark.parametrize("name", HOLDING)
def test_a_full_layers_compiled_step_takes_no_integer_input(shallow, name, monkeypatch):
    """CUDA graph trees record one graph per value of a compiled step's integer inputs: once a layer
    that holds its budget is full, its step must take none (the token count enters as the device
    count of ``CompressedLayer.tokens_seen``, the positions as tensors). Traced by Dynamo alone (no Inductor),
    so the check costs seconds; R-KV is left out, its slot count cycles over its buffer (one graph per
    count)."""
    import runners.generation.model_run

    graphs: list[list[str]] = []

    def record(gm: torch.fx.GraphModule, example_inputs) -> object:
        values = (node.meta.get("example_value") for node in gm.graph.find_nodes(op="placeholder"))
        graphs.append([str(v) for v in values if isinstance(v, torch.SymInt)])
        return gm.forward

    def compiled_forward(model):
        torch._dynamo.reset()
        return torch.compile(model.forward, backend=record, fullgraph=True)

    monkeypatch.setattr(runners.generation.model_run, "compiled_forward", compiled_forward)
    prompt = PROMPTS[0]
    ids = synthetic_prompts(shallow.config.vocab_size, 1, prompt, 0)
    method = METHOD_REGISTRY[name](**KWARGS.get(name, {}))
    run = ModelRun(shallow, method, resolve_budget(BUDGET, prompt), prompt + 8, backend="compiled")
    with torch.inference_mode():
        token = run.prefill(ids).argmax(-1)
        for _ in range(8):
            token = run.step(token).argmax(-1)
    assert graphs and graphs[-1] == []


@pytest.mark.parametrize("name", ["fullkv", "snapkv", "adakv"])
def test_a_growing_layers_compiled_step_compiles_once(tiny_model, name, monkeypatch):
    """FullKV and prompt-only methods (SnapKV; AdaKV's ragged heads) grow their layers at every decode
    step: the compiled step appends at a device count and attends over the buffers' static capacity
    with a validity mask (``SlotStore.count_ahead``; ragged heads count their room ahead), so over 64
    steps Dynamo compiles it once, a graph with no integer input (before: twice, the slot count a
    guarded host integer, then symbolic), and its tokens are eager's (FullKV's: ``model.generate``'s).
    Traced by Dynamo alone (its eager backend, no Inductor): the check costs seconds."""
    import runners.generation.model_run
    from tests.conftest import set_attn

    graphs: list[list[str]] = []

    def record(gm: torch.fx.GraphModule, example_inputs) -> object:
        values = (node.meta.get("example_value") for node in gm.graph.find_nodes(op="placeholder"))
        graphs.append([str(v) for v in values if isinstance(v, torch.SymInt)])
        return gm.forward

    monkeypatch.setattr(
        runners.generation.model_run,
        "compiled_forward",
        lambda model: torch.compile(model.forward, backend=record, fullgraph=True),
    )
    prompt, steps = 40, 64
    ids = synthetic_prompts(tiny_model.config.vocab_size, 1, prompt, 0)
    method = METHOD_REGISTRY[name](**({"window_size": 8} if name == "snapkv" else KWARGS.get(name, {})))
    budget = None if name == "fullkv" else 16
    torch._dynamo.reset()
    counters.clear()
    tokens = {}
    for backend in ("eager", "compiled"):
        run = ModelRun(tiny_model, method, budget, prompt + steps, backend=backend)
        with torch.inference_mode():
            token = run.prefill(ids).argmax(-1)
            tokens[backend] = [int(token)]
            for _ in range(steps):
                token = run.step(token).argmax(-1)
                tokens[backend].append(int(token))
    assert counters["stats"]["unique_graphs"] == 1 and graphs == [[]]
    assert tokens["compiled"] == tokens["eager"]
    if name == "fullkv":
        set_attn(tiny_model, "sdpa")
        try:
            new = {"max_new_tokens": steps + 1, "min_new_tokens": steps + 1}
            out = tiny_model.generate(ids, **new, do_sample=False)
        finally:
            set_attn(tiny_model, "kvbench")
        assert out[0, prompt:].tolist() == tokens["compiled"]


@pytest.mark.parametrize("name", sorted(METHOD_REGISTRY))
def test_a_prepared_decode_step_allocates_no_store_tensor(shallow, name):
    """What a CUDA graph needs of the compiled step (``CompressedCache.prepare_graph_step``): after
    it, a decode step writes every store and ``aux`` tensor in place, so none is born inside a
    captured graph's memory pool; FullKV's first step, with a buffer sized exactly to the prompt,
    grows it in ``prepare_graph_step``, StreamingLLM keeps its sinks' keys there at the first
    eviction. Eager steps: the property is the store's, not the compiler's."""
    prompt = 60
    ids = synthetic_prompts(shallow.config.vocab_size, 1, prompt, 0)
    budget = None if name == "fullkv" else resolve_budget(BUDGET, prompt)
    method = METHOD_REGISTRY[name](**KWARGS.get(name, {}))
    run = ModelRun(shallow, method, budget, prompt + 8, backend="eager")
    with torch.inference_mode():
        token = run.prefill(ids).argmax(-1)
        for _ in range(8):
            run.cache.prepare_graph_step()
            stores = [layer.store for layer in run.cache.layers]
            before = [[t.data_ptr() for t in store.tensors()] for store in stores]
            aux = [{k: t.data_ptr() for k, t in layer.aux.items()} for layer in run.cache.layers]
            token = run.step(token).argmax(-1)
            after = [[t.data_ptr() for t in layer.store.tensors()] for layer in run.cache.layers]
            assert [layer.store for layer in run.cache.layers] == stores and after == before
            assert [{k: t.data_ptr() for k, t in layer.aux.items()} for layer in run.cache.layers] == aux


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a generated Triton kernel: CUDA only")
def test_random_scores_of_a_compiled_kernel_are_eager_scores():
    """Random's hashed scores from an inductor Triton kernel equal the eager ones, bit for bit: its
    multipliers become literals in int32 index arithmetic, which Triton refuses at 2^31 or more (on a
    CPU the compiled decode test above covers them)."""
    from methods.random import hashed_uniform

    positions = torch.arange(4096, device="cuda").view(1, 1, -1).expand(2, 3, -1)
    compiled = torch.compile(hashed_uniform, fullgraph=True)(positions, 7, 5)
    assert torch.equal(compiled, hashed_uniform(positions, 7, 5))


def test_greedy_generate_follows_the_configured_backend(tiny_model, monkeypatch):
    """``greedy_generate`` decodes through :func:`compiled_forward` exactly when the configured
    backend is ``compiled`` (that the compiled step gives eager's tokens is the test above, through
    the same ``ModelRun``); the setting is restored and an unknown backend raises."""
    import runners.generation.model_run
    from runners.generation.model_run import get_decode_backend, set_decode_backend

    compiled: list[torch.nn.Module] = []
    monkeypatch.setattr(
        runners.generation.model_run, "compiled_forward", lambda model: compiled.append(model) or model
    )
    ids = synthetic_prompts(tiny_model.config.vocab_size, 1, 40, 1)
    method = METHOD_REGISTRY["h2o"]()
    eager = greedy_generate(tiny_model, ids, method, 16, 8, set()).tokens
    assert compiled == []
    set_decode_backend("compiled")
    try:
        again = greedy_generate(tiny_model, ids, method, 16, 8, set()).tokens
    finally:
        set_decode_backend("eager")
    assert compiled == [tiny_model] and again == eager and get_decode_backend() == "eager"
    with pytest.raises(ValueError, match="backend must be one of"):
        set_decode_backend("graph")


def test_the_backend_is_part_of_the_run_identity():
    base = {"model": {"name": "m"}, "method": {"name": "h2o"}, "task": {}, "budget": 0.1}
    assert "backend" not in run_identity(base | {"backend": "eager"})
    assert run_identity(base | {"backend": "compiled"})["backend"] == "compiled"
