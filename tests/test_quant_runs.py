"""``quant=`` in runs and reports: every quant config builds its kind; quantized storage is another run
(``quant=none`` keeps the ids of runs stored before the option), named in report labels and never the
FullKV reference; a head-adaptive method over KIVI storage passes the runner's check."""

from __future__ import annotations

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from methods import METHOD_REGISTRY, FullKV
from methods.quant import storage_kind
from methods.quant.kivi import KiviStore
from methods.quant.per_token import PerTokenCodec
from methods.seam.uniform import SlotStore
from reports.pairing import pair
from reports.runs import row
from runners.results.store import setting_id
from runners.setup.quant_kind import storage_of
from runners.setup.settings import read_settings
from tasks.errors import KVBenchError
from tests.conftest import REPO
from tests.method_settings import SETTINGS

QUANTS = sorted(p.stem for p in (REPO / "configs" / "quant").glob("*.yaml"))


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("quant", QUANTS)
def test_every_quant_config_sets_its_kind(quant):
    cfg = config(f"quant={quant}", "method=fullkv")
    store = storage_of(read_settings(cfg), FullKV())({}, lambda n: n)
    assert isinstance(store, KiviStore if "kivi" in quant else SlotStore)
    if quant.startswith("int"):
        assert store.codec == PerTokenCodec(int(quant[-1]), 64)
    elif "kivi" in quant:
        assert store.bits == int(quant[-1])
    elif quant.startswith("quanto"):  # transformers' QuantizedCache defaults: groups of 64, R = 128
        assert (store.codec, store.residual) == (PerTokenCodec(int(quant[-1]), 64), 128)


def test_quant_none_keeps_the_ids_and_a_quantized_run_is_another_setting():
    plain = OmegaConf.to_container(config("method=snapkv"), resolve=True)
    older = {k: v for k, v in plain.items() if k != "quant"}  # a record stored before quant= existed
    assert setting_id(plain) == setting_id(older)
    int8 = OmegaConf.to_container(config("method=snapkv", "quant=int8"), resolve=True)
    int4 = OmegaConf.to_container(config("method=snapkv", "quant=int4"), resolve=True)
    assert len({setting_id(plain), setting_id(int8), setting_id(int4)}) == 3


def record(method: str, quant: str, rid: str) -> dict:
    cfg = OmegaConf.to_container(config(f"method={method}", f"quant={quant}"), resolve=True)
    return {"run_id": rid, "method": method, "task": "xsum", "status": "ok", "config": cfg, "n_samples": 2}


def test_labels_name_the_quantization_and_only_unquantized_fullkv_is_the_reference():
    rows = pd.DataFrame(
        [
            row(record("fullkv", "none", "a")),
            row(record("fullkv", "int8", "b")),
            row(record("snapkv", "int8", "c")),
        ]
    )
    assert [("quant=int8" in label) for label in rows["label"]] == [False, True, True]
    assert rows["reference"].tolist() == [True, False, False]
    paired = pair(rows, dict.fromkeys(rows["run_id"], frozenset({"1", "2"})))
    assert paired.kept == ["a", "b", "c"] and not paired.no_reference
    alone = pair(rows[rows["run_id"] != "a"], dict.fromkeys("bc", frozenset({"1", "2"})))
    assert alone.no_reference == [("smollm2-135m", "xsum")]  # FullKV int8 is no reference


def test_a_ragged_method_over_kivi_is_accepted():
    method = METHOD_REGISTRY["adakv"](**SETTINGS["adakv"][0])
    assert method.traits.ragged_heads
    storage_of(read_settings(config("method=adakv_snapkv", "quant=kivi2")), method)({}, lambda n: n).ragged  # noqa: B018


def test_compiled_decode_steps_are_refused_over_quantized_storage():
    with pytest.raises(KVBenchError, match="backend=compiled"):
        storage_of(read_settings(config("method=snapkv", "quant=int8", "backend=compiled")), FullKV())


def test_kind_parameters_reach_the_store():
    store = storage_kind("int4", {"bits": 4, "group": 32})({}, lambda n: n)
    assert store.codec == PerTokenCodec(4, 32)


def test_the_memory_figure_marks_each_storage_kind_and_stars_only_unquantized_fullkv(tmp_path):
    from reports import pareto
    from reports.runs import Filters
    from runners.results.store import ResultStore
    from tests.report_fixtures import write_run

    store = ResultStore(tmp_path / "results")
    for i, (method, quant, budget) in enumerate(
        [("snapkv", "int4", 0.5), ("fullkv", "int8", "null"), ("fullkv", "none", "null")]
    ):
        cfg = OmegaConf.to_container(
            config(f"method={method}", f"quant={quant}", f"budget={budget}"), resolve=True
        )
        predictions = [
            {"id": str(s), "prediction": "x", "metrics": {"rouge1": 10.0 + s + i}} for s in range(3)
        ]
        write_run(
            store, cfg, method, "xsum", f"2026-11-21T11:0{i}:00+00:00", predictions=predictions,
            metrics={"rouge1": 11.0 + i}, efficiency={"kv_bytes_end_mean": 1e6 * (3 - i)},
        )  # fmt: skip
    (plot,) = pareto.build(store, Filters(task="xsum"))
    markers = {c.get_label().split(" (")[0]: c.lines[0].get_marker() for c in plot.fig.axes[0].containers}
    assert markers == {"FullKV": "*", "FullKV quant=int8": "s", "SnapKV quant=int4": "^"}
    # the legend: the reference first, then by method, its storage kinds in order (not in run order)
    labels = [t.get_text().split(" (")[0] for t in plot.fig.axes[0].get_legend().get_texts()]
    assert labels == ["FullKV", "FullKV quant=int8", "SnapKV quant=int4", "Pareto front"]
    caption = " ".join(t.get_text() for t in plot.fig.texts)
    assert "KV storage (quant=): circle none, square int8, triangle up int4." in " ".join(caption.split())
