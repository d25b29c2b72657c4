"""``runner=train_less``: fit LESS kernels to the frozen model's attention outputs, layer by layer.

Recipe (Dong et al. 2024; docs/methods.md, "LESS"): per layer, teacher = the layer's full-attention
block output; student = the sparse policy's attention + the low-rank term through the frozen
``o_proj``; MSE on positions past heavy + recent; Adam with a step schedule; the best-validation
kernels are kept. Every layer has its own parameters, optimiser and loss, so the layers train
independently: one teacher forward feeds all of them, and ``runner.layers`` splits the layers over
processes or launcher jobs. Windows are cut from documents held out of evaluation (XSum test rows
from ``runner.first_row`` on by default), recorded in the kernel set's metadata.
"""

from __future__ import annotations

import copy
import math
import time

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from methods import METHOD_REGISTRY
from methods.less.activations import stream_activations
from methods.less.checkpoints import assemble_kernel_set, kernel_set_dir, save_layer
from methods.less.kernels import LessKernels
from methods.less.student import h2o_keep_mask, lambda_keep_mask, student_attention
from runners.models.loading import load_model, load_tokenizer, resolve_model_config
from runners.output.record import log_record, presets
from runners.setup.settings import RunSettings
from tasks.data import load_rows
from tasks.errors import KVBenchError


def training_windows(cfg: DictConfig, tokenizer, n: int, offset_docs: int = 0) -> tuple[torch.Tensor, dict]:
    """``[n, length]`` token windows from consecutive held-out documents, and where they came from."""
    run = cfg.runner
    rows, source = load_rows(
        cfg.task.data_dir, run.data_file, run.hub_dataset, run.hub_split, None, run.hub_config
    )
    ids: list[int] = []
    first = run.first_row + offset_docs
    row = first
    while len(ids) < n * run.window_length:
        if row >= len(rows):
            raise KVBenchError(f"not enough held-out text for {n} windows of {run.window_length} tokens")
        ids += tokenizer(rows[row][run.text_field])["input_ids"]
        row += 1
    windows = torch.tensor(ids[: n * run.window_length]).view(n, run.window_length)
    return windows, {"source": source, "rows": [first, row], "windows": n}


class MaskCache:
    """Held-key masks per (split, windows, layer): the frozen model's H2O simulation is the same
    every epoch, so it runs once (about 0.8 MB per window and layer at 512 tokens, 3 KV heads)."""

    def __init__(self, policy: str, heavy: int, recent: int, enabled: bool = True) -> None:
        self.policy, self.heavy, self.recent, self.enabled = policy, heavy, recent, enabled
        self.masks: dict[tuple, torch.Tensor] = {}

    def get(self, key: tuple, acts) -> torch.Tensor:
        """The mask of ``acts`` (computed on first use when caching)."""
        if key not in self.masks:
            mask = keep_mask(self.policy, acts, self.heavy, self.recent)
            if not self.enabled:
                return mask
            self.masks[key] = mask
        return self.masks[key]


def keep_mask(policy: str, acts, heavy: int, recent: int) -> torch.Tensor:
    """Held keys per query ``[batch, kv_heads, length, length]`` under the sparse policy."""
    if policy == "h2o":
        return h2o_keep_mask(acts.query, acts.keys, acts.scaling, heavy, recent)
    b, h, length, _ = acts.keys.shape
    return lambda_keep_mask(length, heavy, recent, acts.keys.device).expand(b, h, length, length)


def _layer_loss(kernels, acts, o_proj, heavy: int, recent: int, keep: torch.Tensor) -> torch.Tensor:
    out = student_attention(acts.query, acts.keys, acts.values, keep, kernels, acts.scaling)
    b, h, length, d = out.shape
    pred = o_proj(out.transpose(1, 2).reshape(b, length, h * d).to(o_proj.weight.dtype))
    start = heavy + recent
    return torch.nn.functional.mse_loss(pred[:, start:].float(), acts.output[:, start:].float())


def run_train_less(settings: RunSettings) -> dict:
    """Train (or reuse) the kernel set of (model, policy, budget) of ``settings``; returns a result
    record. The runner reads its composed config (``settings.config``) once the model's config has
    filled it: its options may name the model's context (``runner=train_less_paper``).

    Raises
    ------
    KVBenchError
        For a method other than LESS, a budget that is not a fraction, or too little data.
    """
    cfg = settings.config
    resolve_model_config(cfg.model)
    if cfg.method._target_ != "methods.less.LESS":
        raise KVBenchError("runner=train_less trains LESS kernels: use method=less")
    method = METHOD_REGISTRY["less"](**{k: v for k, v in cfg.method.items() if k != "_target_"})
    if not 0 < cfg.budget < 1:
        raise KVBenchError(f"train_less needs a fractional budget (share of each window), got {cfg.budget}")
    run = cfg.runner
    out_dir = kernel_set_dir(
        cfg.paths.checkpoints_dir, cfg.model.name, method.policy, cfg.budget, cfg.budget_unit
    )
    heavy, recent = method.split(max(2, round(cfg.budget * run.window_length)))
    tokenizer = load_tokenizer(cfg.model)
    train, data_meta = training_windows(cfg, tokenizer, run.windows)
    val, val_meta = training_windows(
        cfg, tokenizer, run.val_windows, offset_docs=data_meta["rows"][1] - run.first_row
    )
    model = load_model(cfg.model).requires_grad_(False)
    mc = model.config
    head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
    layers = list(run.layers) if run.layers else list(range(mc.num_hidden_layers))
    torch.manual_seed(cfg.seed)
    kernels = {
        i: LessKernels(
            mc.num_attention_heads, mc.num_key_value_heads, head_dim, method.rank, run.hidden, run.dropout
        )
        for i in layers
    }
    optims = {i: torch.optim.Adam(kernels[i].parameters(), lr=run.lr) for i in layers}
    scheds = {i: torch.optim.lr_scheduler.StepLR(optims[i], run.step_size, run.gamma) for i in layers}
    best = {i: (math.inf, None) for i in layers}
    start = time.perf_counter()
    masks = MaskCache(method.policy, heavy, recent, run.cache_masks)
    zero = {i: _zero_state_kernels(kernels[i]) for i in layers}  # psi = 0: plain H2O / Lambda output
    sparse_only = _validate(model, zero, val, layers, masks, run.batch_size)
    untrained = _validate(model, kernels, val, layers, masks, run.batch_size)
    curve: list[dict] = [
        {"epoch": 0, "train": None, "val": untrained, "seconds": time.perf_counter() - start}
    ]
    for epoch in range(run.epochs):
        train_loss = {i: 0.0 for i in layers}
        for ks in kernels.values():
            ks.train()
        order = torch.randperm(len(train))
        batches = stream_activations(model, train, layers, run.batch_size, order)
        total = math.ceil(len(train) / run.batch_size)
        for index, acts in tqdm(batches, total=total, desc=f"epoch {epoch + 1}", disable=not run.progress):
            for i in layers:
                keep = masks.get(("train", index, i), acts[i])
                loss = _layer_loss(
                    kernels[i], acts[i], model.model.layers[i].self_attn.o_proj, heavy, recent, keep
                )
                optims[i].zero_grad()
                loss.backward()
                optims[i].step()
                train_loss[i] += float(loss.detach()) / math.ceil(len(train) / run.batch_size)
        val_loss = _validate(model, kernels, val, layers, masks, run.batch_size)
        for i in layers:
            scheds[i].step()
            if val_loss[i] < best[i][0]:
                best[i] = (val_loss[i], {k: v.clone() for k, v in kernels[i].state_dict().items()})
        curve.append(
            {"epoch": epoch + 1, "train": train_loss, "val": val_loss, "seconds": time.perf_counter() - start}
        )
        train_sum, val_sum = sum(train_loss.values()), sum(val_loss.values())
        print(f"epoch {epoch + 1}: train MSE {train_sum:.4g}, val MSE {val_sum:.4g} (sum over layers)")
    for i in layers:
        kernels[i].load_state_dict(best[i][1])
    geometry = {
        "num_layers": mc.num_hidden_layers,
        "q_heads": mc.num_attention_heads,
        "kv_heads": mc.num_key_value_heads,
        "head_dim": head_dim,
        "rank": method.rank,
        "hidden": run.hidden,
    }
    for i in layers:
        info = {
            "best_val": best[i][0],
            "sparse_only_val": sparse_only[i],
            "train": [c["train"][i] for c in curve[1:]],
            "val": [c["val"][i] for c in curve],
        }
        save_layer(out_dir, i, kernels[i], info)
    meta = {
        "model": cfg.model.name,
        "policy": method.policy,
        "budget": cfg.budget,
        "budget_unit": cfg.budget_unit,
        "heavy": heavy,
        "recent": recent,
        "window_length": run.window_length,
        "train_data": data_meta,
        "val_data": val_meta,
        "epochs": run.epochs,
        "lr": run.lr,
        "step_size": run.step_size,
        "gamma": run.gamma,
        "batch_size": run.batch_size,
        "dropout": run.dropout,
        "seed": cfg.seed,
        "wall_seconds": time.perf_counter() - start,
    }
    done = assemble_kernel_set(out_dir, geometry, meta)
    print(
        f"layers {layers[0]}..{layers[-1]} trained in {meta['wall_seconds']:.0f} s; "
        + (f"kernel set written to {out_dir}" if done else f"partial layers in {out_dir / 'partial'}")
    )
    val_mse = sum(best[i][0] for i in layers)
    metrics = {"val_mse": val_mse, "sparse_only_val_mse": sum(sparse_only.values())}
    print(f"val MSE: LESS {val_mse:.4g} vs {method.policy} alone {metrics['sparse_only_val_mse']:.4g}")
    record = {
        "status": "ok",
        "run_id": out_dir.name,
        "method": "less",
        "task": None,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "presets": presets(),
        "metrics": metrics,
        "curve": curve,
        "out_dir": str(out_dir),
    }
    log_record(cfg, record)  # W&B: the loss curves (runners.output.wandb_series.training_loss)
    return record


def _zero_state_kernels(kernels: LessKernels) -> LessKernels:
    """A copy whose key features are 0 (``D = 0``): the low-rank state stays empty."""
    zero = copy.deepcopy(kernels)
    with torch.no_grad():
        zero.d.zero_()
    return zero


@torch.no_grad()
def _validate(model, kernels, windows, layers, masks: MaskCache, batch_size: int) -> dict[int, float]:
    total = {i: 0.0 for i in layers}
    for ks in kernels.values():
        ks.eval()
    for index, acts in stream_activations(model, windows, layers, batch_size):
        for i in layers:
            keep = masks.get(("val", index, i), acts[i])
            o_proj = model.model.layers[i].self_attn.o_proj
            loss = _layer_loss(kernels[i], acts[i], o_proj, masks.heavy, masks.recent, keep)
            total[i] += float(loss) / math.ceil(len(windows) / batch_size)
    return total
