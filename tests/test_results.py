import json

from runners.results import ResultStore, atomic_write_text, run_id

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
