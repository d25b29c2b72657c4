"""Models from anywhere (``model=hf`` / ``model=gguf`` / presets), as a user points the CLI at them:
a ``save_pretrained`` folder loads and runs with its context length read from its own config;
unknown keys, missing ids, unsupported architectures and missing chat templates are one
``error:`` line before any weights load."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from runners.models.loading import load_model, resolve_model_config, validate_model_config
from runners.models.paths import safe_name
from tasks.errors import KVBenchError
from tests.architectures import tiny_family
from tests.cli_runs import run_cli
from tests.conftest import REPO


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, tokenizer):
    """A tiny Gemma-3 (interleaved sliding layers) saved with ``save_pretrained``, with the
    embedded model's tokenizer (which has a chat template)."""
    folder = tmp_path_factory.mktemp("models") / "tiny-gemma3"
    # the tokenizer's vocabulary, and room for an XSum article (default RoPE: no other effect)
    model = tiny_family("gemma3", vocab_size=len(tokenizer), max_position_embeddings=4096)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def one_error_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "loading model" not in proc.stdout
    return lines[0]


def hf(folder, **extra) -> OmegaConf:
    cfg = OmegaConf.load(REPO / "configs" / "model" / "hf.yaml")
    cfg.id = str(folder)
    return OmegaConf.merge(cfg, extra)


def test_hf_folder_fills_name_dtype_and_context_from_its_config(hf_folder):
    cfg = hf(hf_folder)
    resolve_model_config(cfg)
    assert cfg.name == "tiny-gemma3" and cfg.max_context == 4096 and cfg.dtype == "float32"
    assert cfg.longbench_max_input_tokens == 4096 - 640
    model = load_model(cfg)
    assert model.config._attn_implementation == "kvbench" and model.dtype == torch.float32
    assert load_model(hf(hf_folder, dtype="bfloat16")).dtype == torch.bfloat16


def test_unknown_or_missing_model_keys_are_refused():
    base = OmegaConf.load(REPO / "configs" / "model" / "hf.yaml")
    with pytest.raises(KVBenchError, match=r"unknown model key\(s\) \['attn_implementation'\]"):
        validate_model_config(OmegaConf.merge(base, {"id": "x", "attn_implementation": "eager"}))
    with pytest.raises(KVBenchError, match=r"needs model\.id"):
        validate_model_config(base)
    with pytest.raises(KVBenchError, match="device_map must be one of"):
        validate_model_config(OmegaConf.merge(base, {"id": "x", "device_map": "everywhere"}))
    assert safe_name("../../x") == "x" and "/" not in safe_name("a/b/../c")


def test_device_map_places_the_model_and_its_cache(hf_folder):
    """accelerate's device map (all on CPU here: the cache follows each layer's keys' device)."""
    from methods import FullKV
    from runners.generation.greedy import greedy_generate

    layers = {f"model.layers.{i}": "cpu" for i in range(3)}
    device_map = {"model.embed_tokens": "cpu", **layers, "model.norm": "cpu", "model.rotary_emb": "cpu"}
    for mapping in ("auto", device_map | {"lm_head": "cpu"}):
        model = load_model(hf(hf_folder, device_map=mapping))
        weights = [layer.self_attn.q_proj.weight.device for layer in model.model.layers]

        def check(cache, weights=weights) -> None:
            assert [layer.keys.device for layer in cache.layers] == weights

        res = greedy_generate(model, torch.randint(3, 100, (1, 30)), FullKV(), None, 4, set(), check)
        assert len(res.tokens) == 4


def test_cli_runs_a_saved_folder_through_model_hf(tmp_path, run_py, hf_folder, data_dir):
    proc = run_py(
        "model=hf", f"model.id={hf_folder}", "method=h2o", "budget=0.2", "task=xsum",
        "task.limit=1", "task.max_new_tokens=4", data_dir=str(data_dir),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (path,) = (tmp_path / "results").rglob("record.json")
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and record["config"]["model"]["name"] == "tiny-gemma3"
    assert record["config"]["model"]["max_context"] == 4096  # read from the folder's config
    protocol = record["protocol"]
    assert protocol["sliding_layers"] == 2 and protocol["sliding_window"] == 16 and "sliding_rule" in protocol
    eff = record["efficiency"]  # FullKV's bytes: window - 1 = 15 tokens on each of the two sliding layers
    seen = eff["prompt_tokens_mean"] + eff["generated_tokens_mean"] - 1
    assert (
        eff["fullkv_bytes_end_mean"] == (seen + 2 * 15) * 1 * 32 * 2 * 4
    )  # kv_heads x head_dim x K,V x fp32


def test_cli_unknown_model_key_is_one_error_line(run_py):
    line = one_error_line(run_py("+model.attn_implementation=eager"))
    assert "unknown model key(s) ['attn_implementation']" in line


def test_cli_unsupported_architecture_is_named_before_weights(tmp_path):
    from transformers import MambaConfig

    folder = tmp_path / "mamba"
    MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1).save_pretrained(folder)
    line = one_error_line(run_cli(tmp_path, "model=hf", f"model.id={folder}"))
    assert "model mamba: layer 0 is a 'linear_attention' layer" in line


def test_cli_missing_chat_template_names_the_fix(tmp_path, hf_folder, data_dir):
    config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    folder = tmp_path / "base-model"
    folder.mkdir()
    for f in hf_folder.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    line = one_error_line(run_cli(tmp_path, "model=hf", f"model.id={folder}", data_dir=str(data_dir)))
    assert "has no chat template" in line and "task.chat_template=none" in line
