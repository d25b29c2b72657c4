"""Hostile inputs through ``run.py``: damaged data rows and RULER files, a truncated safetensors
file; each is one ``error:`` line naming the file (and line and field), exit code 2, before any
model loads. Plus the hub rows' check (``tasks.data.load_rows``)."""

from __future__ import annotations

import json

import pytest

from tasks.data import load_rows
from tasks.errors import KVBenchError
from tests.architectures import tiny_family

XSUM = {"document": "An article about rain.", "summary": "Rain.", "id": "1"}
LONGBENCH = {"_id": "q0", "dataset": "qasper", "context": "ctx", "input": "why?", "answers": ["because"]}
INFINITEBENCH = {"id": 0, "context": "the key is 1", "input": "What is the key?", "answer": ["1"]}
GSM = {"problem": "x is 2.", "question": "What is x?", "solution": "Answer: 2.", "op": 14, "id": 0,
       "template": "crazy_zootopia", "mode": "normalforward"}  # fmt: skip
WORDS = {f"ruler/wonderwords_2.2.0/{n}list.txt": "red\nblue\ngreen\n" for n in ("noun", "adjective", "verb")}
RULER = ["task=ruler", "task.tasks=[niah_single_2]", "task.lengths=[512]", "task.limit=1"]


def lines(*rows: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


#: (files under the data dir, overrides, the error line's text after the data dir)
BAD_DATA = [
    ({"xsum/test.jsonl": lines(XSUM, XSUM | {"document": None})}, [],
     "xsum/test.jsonl:2: field 'document' must be a non-empty string, got null"),
    ({"xsum/test.jsonl": lines(XSUM | {"summary": 5})}, [],
     "xsum/test.jsonl:1: field 'summary' must be a non-empty string, got a number (5)"),
    ({"xsum/test.jsonl": lines(XSUM | {"document": "  "})}, [],
     "xsum/test.jsonl:1: field 'document' must be a non-empty string, got an empty string"),
    ({"xsum/test.jsonl": lines(XSUM | {"id": None})}, [],
     "xsum/test.jsonl:1: field 'id' must be a string or an integer, got null"),
    ({"longbench/mixed.jsonl": lines(LONGBENCH, LONGBENCH | {"answers": "because"})}, ["task=longbench"],
     "longbench/mixed.jsonl:2: field 'answers' must be a non-empty list of strings, got a string"),
    ({"longbench/mixed.jsonl": lines(LONGBENCH | {"answers": [None]})}, ["task=longbench"],
     "longbench/mixed.jsonl:1: field 'answers' must be a non-empty list of strings, got a list holding null"),
    ({"infinitebench/passkey.jsonl": lines(INFINITEBENCH | {"context": None})},
     ["task=infinitebench", "task.tasks=[passkey]"],
     "infinitebench/passkey.jsonl:1: field 'context' must be a non-empty string, got null"),
    ({"gsm_infinite/8k/hard/14/igsm_0.jsonl": lines(GSM | {"solution": None})},
     ["task=gsm_infinite", "task.ops=[14]"],
     "gsm_infinite/8k/hard/14/igsm_0.jsonl:1: field 'solution' must be a non-empty string, got null"),
    ({"gsm_infinite/8k/hard/14/igsm_0.jsonl": lines(GSM | {"messages": [{"role": "user"}]})},
     ["task=gsm_infinite", "task.ops=[14]"],
     "igsm_0.jsonl:1: field 'messages' must be a non-empty list of"),
    ({**WORDS, "ruler/PaulGrahamEssays.json": '{"text": 12345}'}, RULER,
     "ruler/PaulGrahamEssays.json: field 'text' must be a non-empty string, got a number (12345)"),
    ({**WORDS, "ruler/PaulGrahamEssays.json": "[1, 2, 3]"}, RULER,
     "ruler/PaulGrahamEssays.json: expected a JSON object, got a list holding a number (1)"),
    ({**WORDS, "ruler/wonderwords_2.2.0/nounlist.txt": "", "ruler/PaulGrahamEssays.json": '{"text": "a b"}'},
     RULER, "ruler/wonderwords_2.2.0/nounlist.txt: holds no word"),
]  # fmt: skip


@pytest.mark.parametrize(("files", "overrides", "message"), BAD_DATA, ids=[m for *_, m in BAD_DATA])
def test_bad_data_is_one_error_line_naming_file_line_and_field(tmp_path, run_py, files, overrides, message):
    data = tmp_path / "data"
    for name, text in files.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text(text)
    proc = run_py("task.limit=2", *overrides, data_dir=str(data))
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith(f"error: {data}/") and message in err[0], err[0]
    assert "loading model" not in proc.stdout and not (tmp_path / "results" / "runs").exists()


def test_hub_rows_are_checked_and_named(monkeypatch):
    import datasets

    rows = [XSUM, XSUM | {"document": None}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    schema = {"document": "text", "summary": "text", "id": "id"}
    assert load_rows(None, "", "org/xsum", "test", 1, schema=schema)[0] == [XSUM]
    with pytest.raises(KVBenchError, match=r"^hf://org/xsum/test row 2: field 'document' must be a non-"):
        load_rows(None, "", "org/xsum", "test", 2, schema=schema)


@pytest.mark.parametrize("cut", ["half", "header", "padded"])
def test_a_damaged_safetensors_file_is_one_error_line_naming_it(tmp_path, run_py, tokenizer, cut):
    """Truncated (half the file, or inside its header) or with bytes appended: named before any
    weights load (today transformers' 50-line traceback after "loading model")."""
    folder = tmp_path / "tiny"
    tiny_family("llama", vocab_size=len(tokenizer), max_position_embeddings=4096).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    damaged = {"half": data[: len(data) // 2], "header": data[:20], "padded": data + b"\0" * 8}
    weights.write_bytes(damaged[cut])
    proc = run_py("model=hf", f"model.id={folder}", "method=fullkv", "task.limit=1")
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith(f"error: model tiny: {weights} is not a complete safetensors file"), err[0]
    assert "loading model" not in proc.stdout
