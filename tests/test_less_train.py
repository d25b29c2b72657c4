"""LESS training: the parallel student equals inference step by step, the simulated H2O mask obeys
H2O's rules, and training on the embedded model beats the sparse policy alone on held-out text."""

from __future__ import annotations

import json

import pytest
import torch

from methods import LESS, CompressedLayer
from methods.less.checkpoints import load_kernel_set
from methods.less.student import h2o_keep_mask, lambda_keep_mask, student_attention
from tests.method_settings import HKV, HQ, SCALE, D, tiny_kernels

L = 40


def window(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, HQ, L, D, generator=gen),
        torch.randn(1, HKV, L, D, generator=gen),
        torch.randn(1, HKV, L, D, generator=gen),
    )


def test_h2o_mask_follows_the_decode_rule():
    q, k, _ = window()
    heavy, recent = 6, 4
    mask = h2o_keep_mask(q, k, SCALE, heavy, recent)
    assert not mask.triu(1).any()
    for t in range(L):
        row = mask[0, :, t]
        assert (row.sum(-1) == min(t + 1, heavy + recent + 1)).all()
        assert row[:, max(0, t - recent + 1) : t + 1].all()  # the recent window is always held
        if t:
            assert not (row & ~mask[0, :, t - 1] & (torch.arange(L) < t)).any()  # evicted keys never return


def test_lambda_mask_holds_first_heavy_and_recent():
    mask = lambda_keep_mask(10, 2, 3)
    assert mask[9].nonzero().flatten().tolist() == [0, 1, 7, 8, 9]
    assert mask[3].nonzero().flatten().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("t", [15, 27, 39])
def test_student_row_equals_inference_with_the_same_held_set(t):
    """Training's parallel output at position t == LESS's decode output with the state of the
    keys evicted by then: the objective trains exactly what inference runs."""
    q, k, v = window(1)
    kernels = tiny_kernels(1)[0]
    keep = h2o_keep_mask(q, k, SCALE, 6, 4)
    student = student_attention(q, k, v, keep, kernels, SCALE)
    for h in range(HKV):
        one = LESS(kernels=[_head_kernels(kernels, h)])
        held = keep[0, h, t, : t + 1].nonzero().flatten()
        gone = (~keep[0, h, t, : t + 1]).nonzero().flatten()
        layer = CompressedLayer(one.traits.state_fill, budget=None)
        layer.update(k[:, h : h + 1, held], v[:, h : h + 1, held])
        psi = one.kernels[0].psi(k[:, h : h + 1, gone])
        layer.aux = {"H": torch.einsum("bhnr,bhnd->bhrd", psi, v[:, h : h + 1, gone]), "z": psi.sum(2)}
        group = slice(h * HQ // HKV, (h + 1) * HQ // HKV)
        out, _ = one.decode_attention(layer, q[:, group, t : t + 1], SCALE)
        assert torch.allclose(out[0, :, 0], student[0, group, t], atol=1e-5)


def _head_kernels(kernels, h):
    """The kernels of KV head ``h`` and its query group, as a one-KV-head kernel set."""
    from methods.less.kernels import LessKernels

    g = HQ // HKV
    sub = LessKernels(g, 1, D, rank=kernels.w2q.shape[-1], hidden=kernels.w1q.shape[-1])
    with torch.no_grad():
        for name in ("w1q", "w2q"):
            getattr(sub, name).copy_(getattr(kernels, name)[h * g : (h + 1) * g])
        for name in ("w1k", "w2k", "w3", "d", "d2"):
            getattr(sub, name).copy_(getattr(kernels, name)[h : h + 1])
    return sub


@pytest.mark.integration
def test_training_beats_the_sparse_policy_on_held_out_text(tmp_path, data_dir, monkeypatch):
    from hydra import compose, initialize_config_dir

    from runners.setup.settings import read_settings
    from runners.train_less import run_train_less
    from tests.conftest import REPO

    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):  # wandb's files in tmp_path
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    overrides = [
        "runner=train_less", "method=less", "budget=0.1", f"task.data_dir={data_dir}",
        f"paths.checkpoints_dir={tmp_path}", f"paths.results_dir={tmp_path}", "runner.layers=[0,1]",
        "runner.windows=2", "runner.val_windows=1", "runner.window_length=96", "runner.epochs=2",
        "runner.hidden=64", "runner.progress=false", "logger=wandb",
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    record = run_train_less(read_settings(cfg))
    curve = record["curve"]
    assert record["metrics"]["val_mse"] < curve[0]["val"][0] + curve[0]["val"][1], curve  # training helped
    assert record["metrics"]["val_mse"] < record["metrics"]["sparse_only_val_mse"], record  # beats H2O alone
    part = tmp_path / "less" / "smollm2-135m__h2o__0.1prompt" / "partial"
    assert json.loads((part / "layer_1.json").read_text())["best_val"] > 0
    with pytest.raises(FileNotFoundError):  # two of 30 layers: the set is not finished
        load_kernel_set(part.parent)
    # The loss curves went to W&B (offline run under paths.results_dir), one history row per epoch.
    from tests.wandb_records import history_rows, offline_run

    _, by_type = offline_run(tmp_path, record["run_id"])
    epochs = [row for row in history_rows(by_type) if "train_loss/epoch" in row]
    assert [row["train_loss/epoch"] for row in epochs] == [0, 1, 2]
    assert epochs[-1]["train_loss/val_mse"] == pytest.approx(sum(curve[-1]["val"].values()))
