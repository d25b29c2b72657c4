"""The ``random`` model source: named shapes as the papers ran them, the depth override, the
identity a run records, and the runners that refuse random weights (docs/models.md, "Random
weights")."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from runners.models.loading import load_model, resolve_model_config
from runners.models.random_weights import build_random
from runners.models.sources import model_identity
from tests.conftest import REPO

#: The papers' configurations (Llama-2 config.json; ZSMerge Tables 1/4, KeepKV Table 1) and the
#: parameter count of each model (Llama-2-7B 6.74B, Llama-2-13B 13.0B, SmolLM2-135M).
PAPER = {
    "llama2-7b": ((4096, 11008, 32, 32, 32, 32000, 4096), 6_738_415_616),
    "llama2-13b": ((5120, 13824, 40, 40, 40, 32000, 4096), 13_015_864_320),
    "smollm2-135m": ((576, 1536, 30, 9, 3, 49152, 8192), 134_515_008),
}
FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "vocab_size", "max_position_embeddings")  # fmt: skip


def random_cfg(shape: str, **extra) -> OmegaConf:
    return OmegaConf.merge(
        OmegaConf.load(REPO / "configs" / "model" / "random.yaml"), {"shape": shape}, extra
    )


@pytest.mark.parametrize("shape", sorted(PAPER))
def test_named_shapes_are_the_papers_models(shape):
    """The transformers config and the parameter count of each full-depth shape (built on the meta
    device: no memory) are the paper model's; fp32, 'kvbench' attention, max_context from the shape."""
    cfg = random_cfg(shape)
    text = resolve_model_config(cfg)
    sizes, params = PAPER[shape]
    assert tuple(getattr(text, f) for f in FIELDS) == sizes
    assert text.rms_norm_eps == 1e-5 and text.rope_parameters["rope_theta"] == (
        1e5 if "smollm" in shape else 1e4
    )
    assert text.tie_word_embeddings == (shape == "smollm2-135m")
    assert (cfg.name, cfg.dtype, cfg.max_context) == (f"random-{shape}", "float32", sizes[-1])
    kwargs = {"dtype": torch.float32, "attn_implementation": "kvbench"}
    model = build_random(cfg, kwargs, torch.device("meta"))
    assert sum(p.numel() for p in model.parameters()) == params and len(model.model.layers) == sizes[2]


def test_num_layers_truncates_the_depth_and_keeps_the_shape():
    cfg = random_cfg("smollm2-135m", num_layers=2, dtype="bfloat16")
    model = load_model(cfg)
    attn = model.model.layers[0].self_attn
    assert len(model.model.layers) == model.config.num_hidden_layers == 2
    assert tuple(attn.q_proj.weight.shape) == (576, 576) and tuple(attn.k_proj.weight.shape) == (192, 576)
    assert model.model.embed_tokens.weight.shape == (49152, 576) and model.lm_head.weight.shape == (
        49152,
        576,
    )
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and not model.training
    assert model.config._attn_implementation == "kvbench" and cfg.name == "random-smollm2-135m-2layers"
    same = load_model(random_cfg("smollm2-135m", num_layers=2, dtype="bfloat16"))
    other = load_model(random_cfg("smollm2-135m", num_layers=2, dtype="bfloat16", seed=1))
    weight = attn.q_proj.weight
    assert torch.equal(weight, same.model.layers[0].self_attn.q_proj.weight)
    assert not torch.equal(weight, other.model.layers[0].self_attn.q_proj.weight)
    assert model_identity(cfg) == {
        "format": "random", "shape": "smollm2-135m", "num_layers": 2, "seed": 0, "dtype": "bfloat16",
    }  # fmt: skip
    assert model_identity(random_cfg("llama2-7b"))["num_layers"] == 32


def test_efficiency_run_on_a_random_model_records_its_identity(tmp_path, run_py):
    proc = run_py(
        "model=random", "model.shape=tiny", "model.num_layers=1", "runner=efficiency", "method=h2o",
        "budget=0.5", "runner.prompt_len=32", "runner.gen_len=3", "runner.repeats=1", "runner.warmup_steps=0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "loading model random-tiny-1layers" in proc.stdout
    (path,) = (tmp_path / "results").rglob("record.json")
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and record["efficiency"]["tokens_per_s"] > 0
    identity = {"format": "random", "shape": "tiny", "num_layers": 1, "seed": 0, "dtype": "float32"}
    assert record["inputs"]["model"] == identity
    assert record["config"]["model"]["name"] == "random-tiny-1layers"
    assert record["efficiency"]["fullkv_bytes_end"] == 1 * 2 * 2 * (32 + 2) * 32 * 4  # 1 layer, K+V, 2 heads


def one_error_line(proc, tmp_path) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "loading model" not in proc.stdout
    assert not [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
    return lines[0]


@pytest.mark.parametrize("runner", ["quality", "quality_grid", "error", "train_less"])
def test_runners_that_score_outputs_refuse_random_weights(tmp_path, run_py, runner):
    line = one_error_line(run_py("model=random-llama2-7b", f"runner={runner}"), tmp_path)
    assert "model.loader=random serves runner=efficiency, runner=oom only" in line
    assert f"runner={runner} scores" in line


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.num_layers=0"], "model.num_layers must be an integer in [1, 32] (llama2-7b has 32 layers)"),
        (["model.num_layers=33"], "or null, got 33"),
        (["model.num_layers=abc"], "or null, got 'abc'"),
        (
            ["model.shape=gpt9"],
            "shape must be one of ['llama2-13b', 'llama2-7b', 'smollm2-135m', 'tiny']",
        ),
        (["model.device_map=auto"], "built on one device"),
        (["method=kvzip"], "has random weights and no files or tokenizer"),
        (["method=less"], "time untrained ones with method.checkpoint=random (method=less_random)"),
    ],
)
def test_bad_random_options_are_one_error_line(tmp_path, run_py, overrides, message):
    line = one_error_line(run_py("model=random-llama2-7b", "runner=efficiency", *overrides), tmp_path)
    assert message in line
