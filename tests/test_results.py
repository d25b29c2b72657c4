import json

from runners.results.store import ResultStore, atomic_write_text, run_id

CONFIG = {
    "model": {"name": "m"},
    "method": {"_target_": "methods.zsmerge.ZSMerge", "alpha": 1.0},
    "task": {"_target_": "tasks.xsum.XSum", "limit": 20, "data_dir": "/a"},
    "runner": {"name": "quality"},
    "budget": 0.05,
    "seed": 0,
    "paths": {"results_dir": "x"},
}


def test_run_id_depends_on_the_run_not_on_paths_or_data_location():
    moved = {**CONFIG, "paths": {"results_dir": "y"}, "task": {**CONFIG["task"], "data_dir": "/b"}}
    assert run_id(CONFIG) == run_id(moved)
    assert run_id(CONFIG) != run_id({**CONFIG, "budget": 0.2})
    assert run_id(CONFIG) != run_id({**CONFIG, "method": {**CONFIG["method"], "alpha": 0.5}})


def test_records_are_written_atomically_and_read_back(tmp_path):
    store = ResultStore(tmp_path)
    rid = run_id(CONFIG)
    record = {"run_id": rid, "status": "ok", "config": CONFIG, "metrics": {"rouge1": 1.0}}
    path = store.write(record, [{"id": "a"}, {"id": "b"}])
    assert json.loads(path.read_text())["metrics"] == {"rouge1": 1.0}
    assert len((path.parent / "predictions.jsonl").read_text().splitlines()) == 2
    assert store.finished(rid)["status"] == "ok"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left
    store.write({**record, "run_id": "failed", "status": "error"}, [])
    assert store.finished("failed") is None
    (tmp_path / "runs" / "broken").mkdir()
    (tmp_path / "runs" / "broken" / "record.json").write_text("{not json")
    assert sorted(r["run_id"] for r in store.records()) == sorted([rid, "failed"])


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"


def test_display_settings_do_not_change_the_run_id():
    from runners.results.store import run_id

    base = {"model": {"name": "m"}, "method": {"alpha": 1.0}, "task": {"limit": 2}, "budget": 0.1,
            "runner": {"name": "quality", "progress": True}}  # fmt: skip
    quiet = base | {"runner": {"name": "quality", "progress": False}}
    assert run_id(base) == run_id(quiet)
    assert run_id(base) != run_id(base | {"runner": {"name": "efficiency", "progress": True}})
    assert run_id(base) == run_id(base | {"kernels": "auto"}) != run_id(base | {"kernels": "torch"})


def test_reindex_moves_records_to_their_current_ids(tmp_path):
    from runners.results.store import ResultStore, run_id

    store = ResultStore(tmp_path)
    config = {"model": {"name": "m"}, "budget": 0.1, "runner": {"name": "quality", "progress": False}}
    store.write({"run_id": "old0000000000000", "status": "ok", "config": config}, [{"id": 1}])
    assert store.reindex() == [("old0000000000000", run_id(config))]
    moved = store.finished(run_id(config))
    assert moved["run_id"] == run_id(config) and not store.run_dir("old0000000000000").exists()
    assert (store.run_dir(run_id(config)) / "predictions.jsonl").read_text() == '{"id": 1}\n'
    assert store.reindex() == []


def test_flat_table_tells_apart_units_seeds_runners_and_failures():
    from runners.results.store import flat_summary

    record = {
        "run_id": "r1", "status": "error", "error": "KVBenchError: x", "git_sha": "abc", "method": "h2o",
        "task": "xsum", "config": {"model": {"name": "m"}, "runner": {"name": "quality"}, "budget": 0.2,
                                   "budget_unit": "context", "seed": 3, "method": {"heavy_ratio": 0.5}},
    }  # fmt: skip
    row = flat_summary(record)
    assert (row["budget_unit"], row["seed"], row["runner"], row["error"], row["git_sha"]) == (
        "context",
        3,
        "quality",
        "KVBenchError: x",
        "abc",
    )


def test_recording_starts_a_new_peak_memory_window(tmp_path):
    """A run's peak is its own: memory touched before the run (a previous job) is not in it."""
    import torch
    from omegaconf import OmegaConf

    from runners.output.environment import peak_rss_bytes
    from runners.output.record import recording

    big = torch.ones(2**27)  # 512 MiB, touched then freed: the "previous job"
    big.add_(1)
    del big
    before = peak_rss_bytes()
    cfg = OmegaConf.create({"logger": {}})
    record = {"run_id": "p", "status": "running", "device": {"type": "cpu"}}
    with recording(cfg, ResultStore(tmp_path), record):
        record.update(status="ok", peak=peak_rss_bytes())
    assert record["peak"] < before - 256 * 2**20


def test_a_failure_never_replaces_a_finished_record(tmp_path):
    store = ResultStore(tmp_path)
    path = store.write({"run_id": "a", "status": "ok"}, [{"x": 1}])
    kept = (path.read_bytes(), (path.parent / "predictions.jsonl").read_bytes())
    for status in ("error", "oom", "interrupted"):
        store.write({"run_id": "a", "status": status, "error": "later"}, [])
        assert (path.read_bytes(), (path.parent / "predictions.jsonl").read_bytes()) == kept
    assert oct(path.stat().st_mode & 0o777) == oct((path.parent / "predictions.jsonl").stat().st_mode & 0o777)


def test_a_setting_finds_its_runs_on_any_inputs(tmp_path):
    """Reports look a run up by its setting (the config alone): a run's id adds its inputs' hash."""
    from runners.results.store import setting_id

    store = ResultStore(tmp_path)
    sid = setting_id(CONFIG)
    runs = [
        (None, "ok"),
        ({"model": {"sha256": "a"}, "data": None}, "ok"),
        ({"model": {"sha256": "b"}}, "error"),
    ]
    for minute, (inputs, status) in enumerate(runs):
        created = f"2026-01-01T00:0{minute}:00+00:00"
        store.write(
            {"run_id": run_id(CONFIG, inputs), "status": status, "config": CONFIG, "created": created}, []
        )
    ids = [run_id(CONFIG, inputs) for inputs, _ in runs]
    assert ids[0] == sid and all(rid.startswith(f"{sid}-") for rid in ids[1:]) and ids[1] != ids[2]
    assert [r["run_id"] for r in store.of_setting(sid)] == ids
    assert store.find(sid)["run_id"] == ids[1]  # the newest finished run
    assert store.find(setting_id({**CONFIG, "budget": 0.2})) is None


def test_a_report_names_the_model_as_its_run_did():
    """A run through ``model=gguf`` shows under its model's name, not the loader's."""
    from omegaconf import OmegaConf

    from reports.frame import key_value
    from runners.results.sweep_jobs import Job

    job = Job(["model=gguf"], OmegaConf.create({"model": {"name": None}}), {}, "r", {})
    record = {"config": {"model": {"name": "Qwen2.5-Coder-0.5B-Instruct-Q8_0", "loader": "gguf"}}}
    assert key_value(job, record, "model") == "Qwen2.5-Coder-0.5B-Instruct-Q8_0"
    assert key_value(job, None, "model") == "gguf"  # not run yet: the choice is all there is
