"""The options of the ``quant`` and ``runner`` config groups, as dataclasses that ``runners.setup.schema``
checks the nodes against (the methods and tasks are their own schema). A key a runner's dataclass
does not declare is refused: shard keys given to a runner that does not shard, for one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from methods.checks import option
from tasks.errors import KVBenchError

#: Bit widths of the quantized codes (``methods.quant.codes.BITS``).
Bits = Literal[2, 4, 8]


@dataclass
class QuantOptions:
    """``quant=<name>`` (configs/quant): ``bits`` of the codes, ``group`` (channels per group of a
    token; tokens per key group in KIVI) and ``residual`` (KIVI's full-precision recent tokens). Each
    kind takes the ones its config sets; that ``group`` divides the model's ``head_dim`` is checked
    once its config is read (``runners.setup.build.check_quant_group``)."""

    name: str = "none"
    bits: Bits = 8
    group: int = option(64, low=1)
    residual: int = option(128, low=0)


@dataclass
class Progress:
    """Every runner: ``runner.name`` and a progress bar."""

    name: str = ""
    progress: bool = True


@dataclass
class Shards(Progress):
    """Runners whose samples split over shards (docs/runners.md), decoded ``batch_size`` at a time."""

    batch_size: int = option(1, low=1)
    num_shards: int = option(1, low=1)
    shard_index: int = option(0, low=0)


@dataclass
class GridOptions(Shards):
    """``runner=quality_grid`` (``runners.sweeps.quality_grid``; the lists are checked there)."""

    methods: list[str] | None = None
    compression_ratios: list[float] | None = None
    budgets: list[float] | None = None
    quants: list[str] | None = None
    extra_grids: list | None = None


@dataclass
class EfficiencyOptions(Progress):
    """``runner=efficiency`` (``runners.measure.efficiency``)."""

    prompt_len: int = option(1024, low=1)
    gen_len: int = option(128, low=1)
    batch_size: int = option(1, low=1)
    warmup_steps: int = option(8, low=0)
    repeats: int = option(3, low=1)
    curve_every: int = option(0, low=0)


@dataclass
class ErrorOptions(Progress):
    """``runner=error`` (``runners.measure.attention_error``)."""

    budgets: list[float] | None = None
    decode_tokens: int = option(64, low=1)


@dataclass
class OomOptions(Progress):
    """``runner=oom`` (``runners.measure.oom``; the search's range and device are checked there)."""

    search: str = "batch"
    low: int = option(1, low=1)
    high: int = option(64, low=1)
    prompt_len: int = option(1024, low=1)
    batch_size: int = option(1, low=1)
    gen_len: int = option(64, low=1)
    probe_steps: int | None = option(None, low=0)
    device: str = "cpu"
    memory_cap_gb: float | None = option(4.0, low=0)
    cuda_memory_fraction: float | None = option(None, low=0, high=1)
    probe_timeout_s: float = option(1800, low=0)
    #: Timed repeats at the threshold found (the efficiency runner's measurement, same prompt and
    #: gen_len); 0: none. Not in configs/runner/oom.yaml, so the OOM runs stored before keep their ids.
    measure_repeats: int = option(0, low=0)
    measure_warmup_steps: int = option(8, low=0)


@dataclass
class TrainLessOptions(Progress):
    """``runner=train_less`` (``runners.train_less``)."""

    data_file: str = ""
    hub_dataset: str | None = None
    hub_config: str | None = None
    hub_split: str = "test"
    text_field: str = "text"
    first_row: int = option(0, low=0)
    windows: int = option(16, low=1)
    val_windows: int = option(4, low=0)
    window_length: int = option(512, low=1)
    epochs: int = option(4, low=1)
    batch_size: int = option(1, low=1)
    lr: float = option(1e-3, low=0)
    step_size: int = option(10, low=1)
    gamma: float = option(0.5, low=0)
    hidden: int = option(512, low=1)
    dropout: float = option(0.3, low=0, high=1)
    layers: list[int] | None = None
    cache_masks: bool = True


#: ``runner.name`` -> the dataclass of its options.
RUNNER_OPTIONS: dict[str, type] = {
    "efficiency": EfficiencyOptions,
    "error": ErrorOptions,
    "oom": OomOptions,
    "quality": Shards,
    "quality_grid": GridOptions,
    "train_less": TrainLessOptions,
}


def check_quant_group(group: int | None, head_dim: int | None, per_token: bool = False) -> None:
    """A quantization group holds ``group`` consecutive channels of a head (all of them when the head
    is narrower): it must divide ``head_dim``; ``per_token`` (the quanto kinds, whose wider groups
    would span tokens): it must not be wider.

    Raises
    ------
    KVBenchError
        For a group that leaves a remainder of the model's ``head_dim``, or a wider one ``per_token``.
    """
    if per_token and group and head_dim and group > head_dim:
        raise KVBenchError(
            f"quant.group={group} is wider than the model's head_dim {head_dim} (quanto groups per token)"
        )
    if group and head_dim and head_dim % min(group, head_dim):
        raise KVBenchError(
            f"quant.group={group} does not divide the model's head_dim {head_dim} (a group holds consecutive "
            "channels of a head)"
        )
