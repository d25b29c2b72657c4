"""A GGUF's identity from its header (``runners.models.identity``), read with the ``gguf`` package's
reader: the packaged model keeps the identity its runs are stored under, a big-endian file is read
as well as a little-endian one, and a file that is no GGUF is one error line."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFWriter
from hydra import compose, initialize_config_dir

from runners.models.gguf_sources import embedded_files
from runners.models.identity import gguf_identity, gguf_metadata
from tasks.errors import KVBenchError
from tests.conftest import REPO


def write_gguf(path, endian: GGUFEndian = GGUFEndian.LITTLE) -> None:
    """A one-tensor GGUF named ``Tiny``, file type 3 (Q4_1), with a string array and a float."""
    writer = GGUFWriter(str(path), "llama", endianess=endian)
    writer.add_name("Tiny")
    writer.add_file_type(3)
    writer.add_array("general.tags", ["a", "b"])
    writer.add_float32("general.x", 1.5)
    writer.add_tensor("t", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_packaged_model_keeps_its_identity(tmp_path):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["model=smollm2-135m"])
    identity = gguf_identity(embedded_files(cfg.model), tmp_path)
    assert identity | {"sha256": None} == {
        "format": "gguf",
        "name": "Smollm2 135M 8k Lc100K Mix1 Ep2",
        "quantization": "Q4_1",
        "sha256": None,
    }


@pytest.mark.parametrize("endian", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["little", "big"])
def test_the_general_scalars_are_read_in_either_byte_order(tmp_path, endian):
    write_gguf(tmp_path / "tiny.gguf", endian)
    meta = gguf_metadata(tmp_path / "tiny.gguf")
    assert meta == {
        "general.architecture": "llama",
        "general.name": "Tiny",
        "general.file_type": 3,
        "general.x": 1.5,
    }
    assert gguf_identity([tmp_path / "tiny.gguf"], tmp_path)["quantization"] == "Q4_1"


@pytest.mark.parametrize("cut", [0, 3, 20, 60])
def test_a_file_that_is_no_gguf_is_one_error(tmp_path, cut):
    write_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "bad.gguf").write_bytes(data[:cut] if cut else b"not a gguf at all, only text")
    with pytest.raises(KVBenchError, match=r"cannot read the GGUF header of .*bad\.gguf"):
        gguf_metadata(tmp_path / "bad.gguf")


def test_the_identity_cache_follows_a_file_changed_in_place(tmp_path):
    """The header is parsed once per (path, size, mtime): a rewritten file is read again."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path)
    first = gguf_identity([path], tmp_path / "cache")
    assert gguf_identity([path], tmp_path / "cache") == first and first["name"] == "Tiny"
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("Other")
    writer.add_tensor("t", np.ones((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.utime(path, ns=(1, 1))  # another mtime, whatever the clock's resolution
    second = gguf_identity([path], tmp_path / "cache")
    assert (second["name"], second["quantization"]) == ("Other", None)
    assert second["sha256"] != first["sha256"]
