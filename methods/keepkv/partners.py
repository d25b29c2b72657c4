"""KeepKV's merge partners (Tian et al., Algorithm 1 line 5): each evicted slot's retained slot of
highest key cosine, the candidate ``KeepKV.merge_evicted`` merges it into above the threshold."""

from __future__ import annotations

import torch

from methods.seam.layer import CompressedLayer
from methods.seam.uniform import gather_slots

NEG_INF = float("-inf")


def cosine_partners(
    layer: CompressedLayer,
    evicted: torch.Tensor,
    retained: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1 line 5: each evicted slot's retained slot of highest key cosine.

    ``cos(e, r) = (k_e . k_r) / |k_r| / |k_e|`` (norms clamped at 1e-12, as ``F.normalize``);
    ``|k_e|`` divides only the row's maximum, which it does not move.

    Parameters
    ----------
    layer : CompressedLayer
        Keys ``[batch, kv_heads, slots, head_dim]``.
    evicted : torch.Tensor
        ``[batch, kv_heads, k]`` slots to place.
    retained : torch.Tensor | None
        ``[batch, kv_heads, slots - k]`` the candidate partners (the complement of
        ``evicted``): the cosines are computed against these only (a prefill's ``k x (slots -
        k)`` products). None: every slot but the evicted ones (a decode step's one row).
    keys : torch.Tensor | None
        ``layer.keys`` when the caller has read them already (keys held as codes are decoded once
        per step); None: read here.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        The best cosine ``[batch, kv_heads, k]`` and the partner slot ``[batch, kv_heads, k]``.
    """
    keys = layer.keys if keys is None else keys
    keys = keys if keys.dtype == torch.float32 else keys.float()
    norm = torch.linalg.vector_norm(keys, dim=-1).clamp_(min=1e-12)  # one op: Tensor.norm dispatches to it
    b, h, k = evicted.shape
    if retained is None:
        raw = (gather_slots(keys, evicted) @ keys.mT).div_(norm.unsqueeze(2))
        own = evicted.unsqueeze(2)  # [b, h, 1, k]
        raw.scatter_(3, own if k == 1 else own.expand(b, h, k, k), NEG_INF)  # partners are retained
        best, partner = raw.max(dim=-1)
    else:
        raw = (gather_slots(keys, evicted) @ gather_slots(keys, retained).mT).div_(
            gather_slots(norm, retained)[:, :, None]
        )
        best, column = raw.max(dim=-1)
        partner = retained.gather(2, column)
    return best.div_(norm.gather(2, evicted)), partner
