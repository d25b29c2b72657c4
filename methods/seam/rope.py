"""Re-rotating cached keys: RoPE angles are linear in the position, so rotations compose."""

from __future__ import annotations

import inspect

import torch
from transformers.models.llama.modeling_llama import rotate_half


class LayerRotary:
    """The rotary embedding of one kind of decoder layer, for re-rotating its cached keys.

    Models with per-layer RoPE (Gemma-3: base 10k on sliding layers, 1M on global ones) keep one
    rotary module that takes the layer type (``rotary_emb(x, position_ids, layer_type)``); this
    object binds that type, and caches the angles of the last shift it computed (every layer of
    a decode step shifts by the same delta). One instance serves all layers of one type.

    Parameters
    ----------
    rotary_emb : torch.nn.Module
        The model's rotary embedding (``model.base_model.rotary_emb``), called as
        ``rotary_emb(x, position_ids[, layer_type]) -> (cos, sin)``.
    layer_type : str | None
        The layer type the module is asked for (``config.layer_types[i]``), or None when its
        forward takes no layer type.
    """

    def __init__(self, rotary_emb: torch.nn.Module, layer_type: str | None = None) -> None:
        self.rotary_emb = rotary_emb
        self.layer_type = layer_type
        self._last: tuple | None = None
        self._angles: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def takes_layer_type(rotary_emb: torch.nn.Module) -> bool:
        """Whether ``rotary_emb.forward`` has a ``layer_type`` parameter (per-layer RoPE)."""
        return "layer_type" in inspect.signature(rotary_emb.forward).parameters

    def angles(
        self, delta: int | torch.Tensor, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of a shift by ``delta`` positions (an int, or a ``[]`` int64 device tensor in
        a compiled step), each ``[1, 1, 1, rotary_dim]``; an int's are kept for the next call outside
        compiled steps only (a tensor made inside a step captured as a CUDA graph is overwritten by the
        next replay)."""
        if isinstance(delta, torch.Tensor):
            position = delta.reshape(1, 1)
            key = None
        else:
            key = (delta, dtype, device)
            if self._last == key and self._angles is not None:
                return self._angles
            position = torch.tensor([[delta]], device=device)
        probe = torch.zeros((1,), dtype=dtype, device=device)
        args = (probe, position) if self.layer_type is None else (probe, position, self.layer_type)
        cos, sin = self.rotary_emb(*args)
        angles = (cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype))
        if key is not None and not torch.compiler.is_compiling():
            self._angles, self._last = angles, key
        return angles

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` of RoPE at ``positions`` ``[n]`` int64, each ``[n, rotary_dim]`` (uncached;
        :func:`rotate` applies them). Expected Attention un-rotates the prompt's queries with it."""
        probe = torch.zeros((1,), dtype=dtype, device=positions.device)
        args = (probe, positions[None]) + (() if self.layer_type is None else (self.layer_type,))
        cos, sin = self.rotary_emb(*args)
        return cos[0].to(dtype), sin[0].to(dtype)

    def rerotate(self, keys: torch.Tensor, delta: int | torch.Tensor) -> torch.Tensor:
        """Move post-RoPE keys from position ``p`` to ``p + delta``: ``R(p + delta) k = R(delta) R(p) k``.

        StreamingLLM (Xiao et al. 2023, Sec. 3.2) assigns positions by cache index; this gives the
        same keys without storing them pre-RoPE. Exact for RoPE types whose angles are linear in
        the position with unit attention scaling (default, linear, Llama-3); with a partial rotary
        dimension (``rotary_dim < head_dim``) only the first ``rotary_dim`` channels turn.

        Parameters
        ----------
        keys : torch.Tensor
            ``[batch, kv_heads, slots, head_dim]`` post-RoPE keys.
        delta : int | torch.Tensor
            Position shift (tokens, may be negative); a ``[]`` int64 tensor on the keys' device in a
            compiled step (:meth:`CompressedLayer.tokens_seen`).

        Returns
        -------
        torch.Tensor
            Keys of the same shape and dtype.
        """
        if isinstance(delta, int) and delta == 0:
            return keys
        cos, sin = self.angles(delta, keys.dtype, keys.device)
        rot = cos.shape[-1]
        if rot == keys.shape[-1]:
            return keys * cos + rotate_half(keys) * sin
        head, tail = keys[..., :rot], keys[..., rot:]
        return torch.cat([head * cos + rotate_half(head) * sin, tail], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin`` on the first ``rotary_dim`` channels of ``x`` ``[..., head_dim]``
    (the rest unchanged), with ``cos``, ``sin`` ``[..., rotary_dim]`` broadcast against ``x``: RoPE
    at the angles given; ``-sin`` turns back. Linear in ``(cos, sin)``, so averaged angles give the
    averaged rotation (Expected Attention's ``R_bar``)."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat([head * cos + rotate_half(head) * sin, tail], dim=-1)
