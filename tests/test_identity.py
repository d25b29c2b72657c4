"""What a run is: its setting (the config) and its inputs (the model's weights, the task's data).

A GGUF is known by its content (header name, quantisation, SHA-256), not its path: a copy is the
same model and reuses its conversion, another file at the same path is another run, and the
converted folder loaded through ``model=hf`` is the same model under the same name. Changed data
is another run, never "already finished". No weights are loaded here.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from runners.models.gguf_sources import embedded_files
from runners.models.loading import resolve_model_config
from runners.models.paths import cache_dir
from runners.models.sources import MODEL_SOURCES, model_identity
from runners.output.record import new_record, run_config, run_inputs, stored_run
from runners.results.lock import run_locks
from runners.results.store import ResultStore, run_id, setting_id
from tests.conftest import REPO

EMBEDDED = OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml")


def gguf_cfg(path) -> OmegaConf:
    return OmegaConf.merge(OmegaConf.load(REPO / "configs" / "model" / "gguf.yaml"), {"path": str(path)})


@pytest.fixture(scope="module")
def embedded_gguf():
    """The embedded model's GGUF file and its converted folder (converted once, or reused)."""
    (gguf,) = embedded_files(EMBEDDED)
    return gguf, MODEL_SOURCES["embedded_gguf"].locate(EMBEDDED)


def test_a_copied_gguf_is_the_same_model_and_reuses_its_conversion(tmp_path, embedded_gguf):
    gguf, folder = embedded_gguf
    identities, names = [], []
    for copy in ("a", "b"):
        (tmp_path / copy).mkdir()
        cfg = gguf_cfg(shutil.copy(gguf, tmp_path / copy / "model.gguf"))
        resolve_model_config(cfg)
        assert MODEL_SOURCES["gguf"].locate(cfg) == folder  # no second conversion
        identities.append(model_identity(cfg))
        names.append(cfg.name)
    identity = model_identity(EMBEDDED)
    assert not list((cache_dir() / "models").glob(f"*-{identity['sha256'][:12]}"))  # no content-keyed copy
    assert identities == [identity, identity] and names == ["smollm2-135m", "smollm2-135m"]
    assert identity["quantization"] == "Q4_1" and identity["name"].startswith("Smollm2 135M")
    assert len(identity["sha256"]) == 64


def test_another_file_at_the_same_path_is_another_run(tmp_path, embedded_gguf):
    gguf, _ = embedded_gguf
    path = tmp_path / "model.gguf"
    cfg = OmegaConf.create({"model": gguf_cfg(path)})
    config = {"model": {"name": "model", "path": str(path)}, "runner": {"name": "quality"}, "budget": 0.1}
    ids = []
    for byte in (None, -1):  # the original, then the same file with its last byte changed
        data = bytearray(gguf.read_bytes())
        if byte is not None:
            data[byte] ^= 0xFF
        path.write_bytes(bytes(data))
        ids.append(run_id(config, run_inputs(cfg)))
    assert ids[0] != ids[1] and ids[0].split("-")[0] == ids[1].split("-")[0] == setting_id(config)


def test_the_converted_folder_through_model_hf_is_the_same_model(embedded_gguf, tmp_path):
    gguf, folder = embedded_gguf
    as_gguf = gguf_cfg(shutil.copy(gguf, tmp_path / "model.gguf"))
    as_hf = OmegaConf.merge(OmegaConf.load(REPO / "configs" / "model" / "hf.yaml"), {"id": str(folder)})
    for cfg in (as_gguf, as_hf):
        resolve_model_config(cfg)
    assert as_hf.name == as_gguf.name == "smollm2-135m"
    assert model_identity(as_hf) == model_identity(as_gguf) == model_identity(EMBEDDED)


def test_a_gguf_is_named_by_its_header_and_an_older_conversion_is_adopted(
    tmp_path, monkeypatch, embedded_gguf
):
    """A GGUF no folder holds yet is named ``<general.name>-<quantization>``; the folder an earlier
    version converted it into (keyed by path, size and mtime) is renamed to its content key."""
    import hashlib

    from runners.models.identity import read_source

    gguf, folder = embedded_gguf
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    shutil.copy(gguf, path)
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    legacy = tmp_path / "cache" / "models" / f"model-{key}"
    shutil.copytree(folder, legacy, ignore=shutil.ignore_patterns("*.safetensors", "kvbench_source.json"))
    cfg = gguf_cfg(path)
    resolve_model_config(cfg)
    assert cfg.name == "Smollm2-135M-8k-Lc100K-Mix1-Ep2-Q4_1"
    target = MODEL_SOURCES["gguf"].locate(cfg)
    assert not legacy.exists() and target.name == f"{cfg.name}-{model_identity(cfg)['sha256'][:12]}"
    assert read_source(target)["identity"] == model_identity(cfg) == model_identity(EMBEDDED)


def test_changed_data_is_another_run_and_the_old_record_stays(tmp_path, data_dir):
    """Fixing a data row gives the same command another run id (no "already finished"); a row
    beyond ``task.limit`` changes nothing."""
    (tmp_path / "data" / "xsum").mkdir(parents=True)
    rows = (data_dir / "xsum" / "test.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:3]
    data = tmp_path / "data" / "xsum" / "test.jsonl"
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["task=xsum", "task.limit=2", f"task.data_dir={tmp_path / 'data'}",
                       f"paths.results_dir={tmp_path / 'results'}", "logger=table"],
        )  # fmt: skip
    config = run_config(cfg)

    def stored(text: list[str]) -> tuple[str, dict | None]:
        data.write_text("".join(text), encoding="utf-8")
        with run_locks():
            _, rid, done = stored_run(cfg, config, lambda record: None, instantiate(cfg.task).load())
        return rid, done

    first, done = stored(rows)
    assert done is None
    record = new_record(first, config, "zsmerge", "xsum", torch.device("cpu"), status="ok")
    ResultStore(cfg.paths.results_dir).write(record, [])
    assert record["inputs"]["data"]["samples"] == 2 and record["setting_id"] == setting_id(config)
    assert stored(rows) == (first, record)  # the same data: already finished
    assert stored([*rows[:2], rows[2].replace("a", "b")])[0] == first  # beyond the limit
    fixed, done = stored([rows[0], rows[1].replace("a", "b", 1), rows[2]])
    assert done is None and fixed != first and fixed.split("-")[0] == first.split("-")[0]
    assert ResultStore(cfg.paths.results_dir).finished(first) == record  # the old record stays


def test_query_aware_true_keeps_the_ids_of_runs_stored_before_the_switch():
    """The whole prompt compressed (``query_aware=true``) is what every run did before the switch:
    it leaves the id as it was; the query-agnostic protocol is another run."""
    config = {"model": {"name": "m"}, "method": {"name": "snapkv"}, "task": {"name": "longbench"},
              "runner": {"name": "quality"}, "budget": 0.5, "budget_unit": "prompt", "seed": 0}  # fmt: skip
    aware = config | {"task": {"name": "longbench", "query_aware": True}}
    agnostic = config | {"task": {"name": "longbench", "query_aware": False}}
    assert setting_id(aware) == setting_id(config) != setting_id(agnostic)


def test_batch_size_one_keeps_the_ids_of_runs_stored_before_the_option():
    """One prompt at a time (``runner.batch_size=1``) is what every quality run did before the option:
    the id is unchanged; a batched run (other timings, the same tokens) is another run."""
    config = {"model": {"name": "m"}, "method": {"name": "h2o"}, "task": {"name": "xsum"},
              "runner": {"name": "quality", "progress": True}, "budget": 0.1, "budget_unit": "prompt",
              "seed": 0}  # fmt: skip
    one = config | {"runner": {"name": "quality", "progress": True, "batch_size": 1}}
    eight = config | {"runner": {"name": "quality", "progress": True, "batch_size": 8}}
    assert setting_id(one) == setting_id(config) != setting_id(eight)


def test_runner_batch_size_keeps_the_ids_of_efficiency_and_oom_runs_stored_as_runner_batch(tmp_path, capsys):
    """The efficiency and OOM runners' ``runner.batch_size`` was ``runner.batch``: ``batch_size=n``
    has the setting id the old ``batch=n`` had (1 included: it is not dropped as the quality
    runner's is), another ``n`` is another run. A finished run stored under the old name is found
    by the new command and shown under the new names; its file stays as written, also when
    :meth:`ResultStore.reindex` moves it."""
    config = {"model": {"name": "m"}, "method": {"name": "h2o"}, "task": None, "budget": 0.1,
              "budget_unit": "prompt", "seed": 0}  # fmt: skip
    for name in ("efficiency", "oom"):
        ids = {}
        for n in (1, 8):
            new = config | {"runner": {"name": name, "prompt_len": 64, "batch_size": n, "progress": True}}
            old = config | {"runner": {"name": name, "prompt_len": 64, "batch": n}}
            assert setting_id(new) == setting_id(old)
            ids[n] = setting_id(new)
        assert ids[1] != ids[8]

    from runners.output.summary_table import print_summary

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["runner=efficiency", "runner.batch_size=2", f"paths.results_dir={tmp_path}",
                       "logger=table"],
        )  # fmt: skip
    new = run_config(cfg)
    old = new | {"runner": {("batch" if k == "batch_size" else k): v for k, v in new["runner"].items()}}
    shape = {"prompt_len": cfg.runner.prompt_len, "gen_len": cfg.runner.gen_len, "batch": 2}
    inputs = run_inputs(cfg)
    rid = run_id(old, inputs)
    record = new_record(rid, old, "h2o", "synthetic", torch.device("cpu"), status="ok", shape=shape)
    record["inputs"] = inputs
    path = ResultStore(tmp_path).write(record, [])
    written = path.read_bytes()
    capsys.readouterr()
    with run_locks():
        _, found, done = stored_run(cfg, new, print_summary)
    assert found == rid and done["config"]["runner"] == new["runner"]
    assert done["shape"] == {"prompt_len": shape["prompt_len"], "gen_len": shape["gen_len"], "batch_size": 2}
    assert "tokens x batch 2" in capsys.readouterr().out and path.read_bytes() == written
    other = ResultStore(tmp_path / "other")
    other.write(record | {"run_id": "stale"}, [])
    assert other.reindex() == [("stale", rid)]
    assert json.loads((other.run_dir(rid) / "record.json").read_text()) == json.loads(written)
