"""Asymmetric integer quantization and bit packing, shared by the quantized storage kinds.

A group of values ``x`` is stored as ``b``-bit codes ``q = clamp(round((x - z) / s), 0, 2^b - 1)``
with ``s = (max x - min x) / (2^b - 1)`` and ``z = min x``, and read back as ``q s + z`` (KIVI, Liu
et al. ICML 2024, arXiv 2402.02750, Sec. 3.1; the same arithmetic as optimum-quanto's
``MaxOptimizer`` behind transformers' ``QuantizedCache``). Codes of ``8 / b`` values share one byte,
the first value in the low bits.
"""

from __future__ import annotations

import torch

#: Bit widths the packing supports (whole codes per byte).
BITS = (2, 4, 8)


def check_bits(bits: int) -> None:
    """Raise ``ValueError`` for a bit width :data:`BITS` does not list."""
    if bits not in BITS:
        raise ValueError(f"quantized codes take {BITS} bits, got {bits}")


def stats(x: torch.Tensor, dim: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point of the groups of ``x`` reduced over ``dim`` (kept, size 1):
    ``s = (max - min) / (2^bits - 1)``, ``z = min``; in ``x``'s dtype."""
    lo, hi = torch.aminmax(x, dim=dim, keepdim=True)
    return (hi - lo) / (2**bits - 1), lo


def encode(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes ``clamp(round((x - zero) / scale), 0, 2^bits - 1)`` as uint8 (one per value; a
    zero scale, a constant group, gives code 0). ``scale``/``zero`` broadcast against ``x``."""
    tiny = torch.finfo(scale.dtype).tiny  # a constant group: x - zero = 0 over any positive scale
    q = (x - zero).div_(scale.clamp(min=tiny))
    return q.round_().clamp_(0, 2**bits - 1).to(torch.uint8)


def decode(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Values ``codes * scale + zero`` in ``scale``'s dtype (``codes`` of that dtype are overwritten)."""
    return codes.to(scale.dtype).mul_(scale).add_(zero)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``[..., d]`` uint8 codes of ``bits`` bits as ``[..., d * bits / 8]`` bytes.

    Raises
    ------
    ValueError
        If ``d`` is not a multiple of ``8 / bits``.
    """
    per = 8 // bits
    if per == 1:
        return codes
    if codes.shape[-1] % per:
        raise ValueError(f"{codes.shape[-1]} codes do not fill whole bytes of {per}")
    # each code times 2^(its bit offset), summed in uint8: the codes occupy disjoint bits of the byte
    key = (bits, codes.device, None)
    if key not in _TABLES:
        weights = [1 << shift for shift in range(0, 8, bits)]
        _TABLES[key] = torch.tensor(weights, dtype=torch.uint8, device=codes.device)
    return (codes.view(*codes.shape[:-1], -1, per) * _TABLES[key]).sum(-1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, bits: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """The ``[..., d]`` codes of ``[..., d * bits / 8]`` bytes (:func:`pack`'s inverse), as ``dtype``
    (a float dtype saves :func:`decode` a conversion)."""
    if bits == 8:
        return packed.to(dtype)
    # the codes of every byte value, one wide element each, in a 2-byte float (codes < 256 are exact
    # there) when ``dtype`` is wider: a narrower lookup and a conversion cost less than the wide lookup
    narrow = torch.bfloat16 if dtype.is_floating_point and dtype.itemsize > 2 else dtype
    table = _unpacked(bits, packed.device, narrow)
    codes = table.index_select(0, packed.reshape(-1).int()).view(narrow).view(*packed.shape[:-1], -1)
    return codes.to(dtype)


#: :func:`unpack`'s tables by (bits, device, dtype) and :func:`pack`'s bit weights by (bits, device, None).
_TABLES: dict[tuple[int, torch.device, torch.dtype | None], torch.Tensor] = {}
#: A dtype of each byte width: a table entry holding a byte's ``8 / bits`` codes is one element of it,
#: so the lookup is a one-dimensional ``index_select`` (3-4x faster on a CPU than one of short rows).
_WIDE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.complex128}


def _unpacked(bits: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``[256]``: the ``8 / bits`` codes each byte value holds, as ``dtype``, viewed as one element of
    the dtype of their total width; ``[256, 8 / bits]`` where no dtype is that wide (:func:`unpack`'s
    table)."""
    key = (bits, device, dtype)
    if key not in _TABLES:
        shifts = torch.arange(0, 8, bits, dtype=torch.int32, device=device)
        byte = torch.arange(256, dtype=torch.int32, device=device).unsqueeze(-1)
        codes = ((byte >> shifts) & (2**bits - 1)).to(dtype)
        wide = _WIDE.get(codes.shape[-1] * codes.element_size())
        _TABLES[key] = codes if wide is None else codes.view(wide).reshape(256)
    return _TABLES[key]


def per_token(x: torch.Tensor, group: int, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x`` ``[..., d]`` in groups of ``group`` consecutive channels of each token:
    packed codes ``[..., d * bits / 8]`` uint8, scale and zero ``[..., d / group]`` (``x``'s dtype)."""
    g = x.unflatten(-1, (-1, group))
    scale, zero = stats(g, -1, bits)
    codes = pack(encode(g, scale, zero, bits).flatten(-2), bits)
    return codes, scale.squeeze(-1), zero.squeeze(-1)


def per_token_values(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`per_token`'s inverse: ``[..., d]`` in ``scale``'s dtype."""
    q = unpack(codes, bits, scale.dtype).unflatten(-1, (scale.shape[-1], -1))
    return decode(q, scale.unsqueeze(-1), zero.unsqueeze(-1)).flatten(-2)


def group_size(dim: int, group: int) -> int:
    """The group size used for ``dim`` channels: ``group``, or ``dim`` when it is smaller.

    Raises
    ------
    ValueError
        If ``dim`` is not a multiple of the group size.
    """
    size = min(group, dim)
    if dim % size:
        raise ValueError(f"head_dim {dim} is not a multiple of the quantization group size {size}")
    return size


def rows(*tables: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``table[b, h, index[b, h, j]]`` ``[b, h, k, d]`` for each table ``[batch, kv_heads, rows, d]`` (of
    one shape): one ``index_select`` of whole rows each, far cheaper on a CPU than a gather of every
    element, the flat row numbers computed once."""
    b, h, n, d = tables[0].shape
    base = torch.arange(0, b * h * n, n, device=index.device).view(b, h, 1)
    flat = (index.long() + base).reshape(-1)
    return tuple(t.reshape(b * h * n, d).index_select(0, flat).view(*index.shape, d) for t in tables)
