"""LESS: a sparse eviction policy plus a learned constant-size state for what it evicts (Dong et
al., ICML 2024, "Get More with LESS"; docs/methods.md, "LESS"; hdong920/LESS).

Per KV head the cache keeps what the sparse policy keeps (H2O by default, or "Lambda-mask":
the first ``heavy`` tokens + recent) and a state ``H`` ``[R, head_dim]``, ``z`` ``[R]`` (float32).
Every evicted token adds ``psi(k) v^T`` to ``H`` and ``psi(k)`` to ``z`` before it is freed.
A decode step's output combines the softmax over the kept slots with the low-rank term in log
space (the official code's form):

    lse_S = logsumexp(l_S),  lse = logaddexp(ln(phi(q)^T z), lse_S)
    o = exp(lse_S - lse) softmax(l_S) V + exp(-lse) phi(q)^T H

which equals ``[sum_S e^l v + phi(q)^T H] / [sum_S e^l + phi(q)^T z]``. H2O's scores accumulate
the sparse-only softmax. Prefill output is full attention (no low-rank term). GQA: ``phi`` per
query head, ``psi``, ``H``, ``z`` per KV head, H2O scores the group mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import ClassVar

import torch

from methods.evict import ScoreEvict
from methods.h2o import H2O
from methods.less.checkpoints import kernel_set_dir, load_kernel_set
from methods.less.kernels import LessKernels
from methods.scoring import complement, softcap_logits
from methods.seam.contract import AssetRequest, CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan

RANDOM = "random"  # checkpoint value: untrained kernels (efficiency runs only)


@dataclass
class LambdaMask(H2O):
    """LESS's "Lambda-mask" policy: the first ``heavy`` tokens and the recent window of H2O's split,
    nothing scored (a score-then-evict rule ranked by position)."""

    name: ClassVar[str] = "lambda"
    TRAITS: ClassVar[Traits] = replace(H2O.TRAITS, decode_input="none", score_decay=None, state_fill={})

    def protected(self, bound: int) -> tuple[int, int]:
        """The first ``heavy`` and the last ``recent`` tokens: they fill the budget."""
        return self.split(bound)

    def prefill_scores(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Nothing to score."""
        return None

    def step_scores(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """Nothing to score."""
        return None


#: ``policy`` name -> the sparse policy LESS composes, built from LESS's own fields.
POLICIES = {
    "h2o": lambda m: H2O(
        heavy_ratio=m.heavy_ratio,
        recent_ratio=m.recent_ratio,
        chunk_size=m.chunk_size,
        decode_budget=m.decode_budget,
    ),
    "lambda": lambda m: LambdaMask(
        heavy_ratio=m.heavy_ratio, recent_ratio=m.recent_ratio, decode_budget=m.decode_budget
    ),
}


@dataclass
class LESS(CompressionMethod):
    """LESS on top of a sparse policy: H2O (``policy="h2o"``) or the Lambda mask (``policy="lambda"``).

    Parameters
    ----------
    policy : str
        Sparse policy: ``"h2o"`` or ``"lambda"`` (first ``heavy`` tokens + recent).
    rank : int
        Feature dimension R of the state (8).
    checkpoint : str | None
        Directory of the trained kernel set (``methods.less.checkpoints``); None: looked up by
        model, policy and budget; ``"random"``: untrained random kernels, created at prefill, for
        timing and memory measurements only (LESS's cost does not depend on the kernel values).
    heavy_ratio, recent_ratio, chunk_size
        As :class:`methods.h2o.H2O`.

    Attributes
    ----------
    kernels : list[LessKernels]
        One kernel set per decoder layer; must be assigned before use.
    sparse : ScoreEvict
        The policy (``POLICIES``): it selects, LESS absorbs what it evicts into the state.

    Raises
    ------
    ValueError
        For an unknown policy or a rank below 1 (and as :class:`methods.h2o.H2O`).
    """

    name: ClassVar[str] = "less"
    TRAITS: ClassVar[Traits] = Traits(uses_log_weight=False)

    policy: str = "h2o"
    rank: int = 8
    checkpoint: str | None = None
    heavy_ratio: float = 0.5
    recent_ratio: float = 0.5
    chunk_size: int = 256
    kernels: list[LessKernels] = field(default_factory=list, repr=False, compare=False)
    kernel_meta: dict = field(default_factory=dict, repr=False, compare=False)
    sparse: ScoreEvict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {tuple(POLICIES)}, got {self.policy!r}")
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        self.sparse = POLICIES[self.policy](self)  # checks the shares (H2O.__post_init__)

    @cached_property
    def traits(self) -> Traits:
        """The declared traits with the policy's per-slot state (H2O: ``scores``)."""
        return self.with_decode_budget(replace(self.TRAITS, state_fill=self.sparse.traits.state_fill))

    def split(self, budget: int) -> tuple[int, int]:
        """The policy's ``(heavy, recent)`` split (``H2O.split``)."""
        return self.sparse.split(budget)

    def plan(self, layer: CompressedLayer) -> LayerPlan:
        """The policy's plan."""
        return self.sparse.plan(layer)

    def attach_assets(self, request: AssetRequest) -> None:
        """Load the kernel set trained for (model, policy, budget) of ``request``, or the one in
        ``checkpoint``.

        Raises
        ------
        FileNotFoundError
            If no finished kernel set exists; the message gives the training command, with
            ``<model options>`` where the runner puts those that select this run's model.
        """
        if self.checkpoint == RANDOM:
            return
        budget, budget_unit = request.budget, request.budget_unit
        path = (
            Path(self.checkpoint)
            if self.checkpoint
            else kernel_set_dir(request.checkpoints_dir, request.model, self.policy, budget, budget_unit)
        )
        try:
            self.kernels, self.kernel_meta = load_kernel_set(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no trained LESS kernels at {path}; train them with `python run.py runner=train_less "
                f"method=less method.policy={self.policy} <model options> budget={budget} "
                f"budget_unit={budget_unit}`"
            ) from None

    # ------------------------------------------------------------------ state
    def _kernels(self, layer: CompressedLayer) -> LessKernels:
        if len(self.kernels) <= layer.spec.layer_idx:
            raise RuntimeError(f"LESS has no kernels for layer {layer.spec.layer_idx}: assign method.kernels")
        return self.kernels[layer.spec.layer_idx]

    def absorb(self, layer: CompressedLayer, slots: torch.Tensor) -> None:
        """Add ``psi(k) v^T`` and ``psi(k)`` of the slots ``[batch, kv_heads, n]`` to ``H`` and ``z``."""
        d = layer.keys.shape[-1]
        keys = layer.keys.gather(2, slots.unsqueeze(-1).expand(-1, -1, -1, d)).float()
        values = layer.values.gather(2, slots.unsqueeze(-1).expand(-1, -1, -1, layer.values.shape[-1]))
        psi = self._kernels(layer).psi(keys)  # [b, h, n, R]
        layer.aux["H"] += torch.einsum("bhnr,bhnd->bhrd", psi, values.float())
        layer.aux["z"] += psi.sum(dim=2)

    # ------------------------------------------------------------------ hooks
    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """Empty state, then the policy's selection; what it evicts goes into the state first."""
        b, h, n, _ = layer.keys.shape
        while (
            self.checkpoint == RANDOM and len(self.kernels) <= layer.spec.layer_idx
        ):  # sliding layers skip LESS
            self.kernels.append(LessKernels(query.shape[1], h, layer.keys.shape[-1], self.rank))
        if layer.spec.layer_idx < len(self.kernels):  # loaded on the CPU (load_kernel_set): move once
            self.kernels[layer.spec.layer_idx].to(query.device)
        layer.aux = {
            "H": torch.zeros(
                (b, h, self.rank, layer.values.shape[-1]), dtype=torch.float32, device=layer.keys.device
            ),
            "z": torch.zeros((b, h, self.rank), dtype=torch.float32, device=layer.keys.device),
        }
        index = self.sparse.prefill_keep(layer, query, scaling)
        if index is not None:
            self.absorb(layer, complement(index, n))
            layer.store.keep(index)

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sparse softmax + low-rank term in log space; returns the output and the sparse-only
        group-mean probabilities ``[batch, kv_heads, slots]`` (H2O's scores).

        With ``lse = log(exp(lse_sparse) + denom)`` the output is
        ``exp(lse_sparse - lse) * sparse_out + exp(-lse) * numer`` (LESS Sec. 3.2); the second term
        is computed as ``(numer / denom) * exp(log(denom) - lse)``, which stays finite for any
        logits (``exp(-lse)`` alone overflows when every logit is near -100) and is exactly 0 for
        an empty state (``denom = 0``)."""
        b, hq, _, d = query.shape
        hkv, values = layer.keys.shape[1], layer.values
        q = query.reshape(b, hkv, hq // hkv, d).float()
        logits = softcap_logits(
            torch.einsum("bhgd,bhsd->bhgs", q, layer.keys.float()) * scaling, layer.spec.softcap
        )
        lse_sparse = torch.logsumexp(logits, dim=-1)
        probs = torch.softmax(logits, dim=-1)
        phi = self._kernels(layer).phi(query.float()).view(b, hkv, hq // hkv, -1)
        numer = torch.einsum("bhgr,bhrd->bhgd", phi, layer.aux["H"])
        denom = torch.einsum("bhgr,bhr->bhg", phi, layer.aux["z"])
        live = denom > 0
        denom = torch.where(live, denom.clamp(min=1e-6), torch.ones_like(denom))  # official guard
        log_denom = torch.where(live, denom.log(), torch.full_like(denom, float("-inf")))
        lse = torch.logaddexp(log_denom, lse_sparse)
        sparse_out = torch.einsum("bhgs,bhsd->bhgd", probs, values.float())
        low_rank = torch.where(live.unsqueeze(-1), numer / denom.unsqueeze(-1), torch.zeros_like(numer))
        out = (
            torch.exp(lse_sparse - lse).unsqueeze(-1) * sparse_out
            + torch.exp(log_denom - lse).unsqueeze(-1) * low_rank
        )
        return out.to(values.dtype).view(b, hq, 1, d), probs.mean(dim=2)

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        """The policy's step; the token it evicts goes into the state first."""
        victim = self.sparse.decode_victim(layer, probs)
        if victim is not None:
            self.absorb(layer, victim.unsqueeze(-1))
            layer.store.drop(victim)
