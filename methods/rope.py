"""Re-rotating cached keys: RoPE angles are linear in the position, so rotations compose."""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import rotate_half

_LAST_ANGLES: dict = {}  # cos/sin of the last (rotary module, delta, dtype, device) asked for


def rerotate(keys: torch.Tensor, delta: int, rotary_emb: torch.nn.Module) -> torch.Tensor:
    """Move post-RoPE keys from position ``p`` to ``p + delta``: ``R(p + delta) k = R(delta) R(p) k``.

    StreamingLLM (Xiao et al. 2023, Sec. 3.2) assigns positions by cache index; this gives the
    same keys without storing them pre-RoPE. Exact for RoPE types whose angles are linear in the
    position with unit attention scaling (default, linear, Llama-3).

    Parameters
    ----------
    keys : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]`` post-RoPE keys.
    delta : int
        Position shift (tokens, may be negative).
    rotary_emb : torch.nn.Module
        The model's rotary embedding (``model.base_model.rotary_emb``), called as
        ``rotary_emb(x, position_ids) -> (cos, sin)``.

    Returns
    -------
    torch.Tensor
        Keys of the same shape and dtype.
    """
    if delta == 0:
        return keys
    key = (id(rotary_emb), delta, keys.dtype, keys.device)
    if _LAST_ANGLES.get("key") != key:  # every layer of a decode step shifts by the same delta
        position = torch.tensor([[delta]], device=keys.device)
        cos, sin = rotary_emb(keys, position)
        _LAST_ANGLES.update(key=key, cos=cos.unsqueeze(1).to(keys.dtype), sin=sin.unsqueeze(1).to(keys.dtype))
    return keys * _LAST_ANGLES["cos"] + rotate_half(keys) * _LAST_ANGLES["sin"]
