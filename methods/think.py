"""ThinK (Xu et al. 2025, "ThinK: Thinner Key Cache by Query-Driven Pruning", ICLR; kvpress's
``ThinKPress``): key *channels* pruned per KV head, with their memory freed.

Per layer and KV head, channel ``c`` scores ``mean_window(q_c^2) x mean_tokens(k_c^2)``: the squared
query over the last ``window_size`` prompt queries, averaged over the head's query group, times the
squared key over the held tokens (kvpress 0.5.5 ``think_press.py``; the paper's Eq. 6-7 ranks channels
by ``||Q[:, c]|| ||K[:, c]||``, whose order these squares give for one query). The
``int(head_dim x key_channel_compression_ratio)`` lowest-scored channels are pruned (kvpress's
``topk(largest=False)``), the rest kept. Post-RoPE queries and keys, as kvpress.

ThinK is a wrapper: the inner method (``press``: FullKV, i.e. ThinK alone, or any sequence method;
kvpress's ``ComposedPress([SnapKVPress(0.5), ThinKPress(0.5)])`` is ``press=snapkv``) compresses the
layer's tokens first, then the channels are ranked over the tokens it kept (kvpress's order). Where
kvpress zeroes the pruned channels and keeps ``head_dim`` (no memory saved), the layer's store then holds
the keys with their kept channels only (:class:`KeptChannels`, a codec over the run's own ``quant=``
codec, either layout); values keep ``head_dim``. A decode query is projected onto its KV head's kept
channels (:func:`project`): ``q . k`` over the kept channels is ``q . k`` with the pruned ones zeroed.
Keys appended after the compression (the question, generated tokens) are held with the same channels
(kvpress keeps them whole: a store holds one key width per layer; docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import ClassVar

import torch

from methods.checks import check_range
from methods.fullkv import FullKV
from methods.seam.contract import AssetRequest, CompressionMethod, Traits
from methods.seam.layer import CompressedLayer
from methods.seam.plan import LayerPlan
from methods.seam.ragged import RaggedStore
from methods.seam.storage import Codec, SlotStorage
from methods.seam.uniform import SlotStore


def kept_channels(
    query: torch.Tensor, keys: torch.Tensor, tokens: torch.Tensor, window_size: int, n_pruned: int
) -> torch.Tensor:
    """The channels ThinK keeps per KV head (module docstring; kvpress's ``ThinKPress.compress``).

    Parameters
    ----------
    query : torch.Tensor
        ``[batch, q_heads, prompt, head_dim]`` post-RoPE prompt queries (the last ``window_size`` used).
    keys : torch.Tensor
        ``[batch, kv_heads, slots, head_dim]`` post-RoPE held keys (zeros past a head's count).
    tokens : torch.Tensor
        ``[batch, kv_heads]`` int64 held slots per head (the mean's denominator).
    window_size : int
        Observation window (queries).
    n_pruned : int
        Channels pruned per head (``0 < n_pruned < head_dim``).

    Returns
    -------
    torch.Tensor
        ``[batch, kv_heads, head_dim - n_pruned]`` int64, ascending.
    """
    b, hq, _, d = query.shape
    h = keys.shape[1]
    q_norm = query[:, :, -window_size:].pow(2).mean(dim=2).view(b, h, hq // h, d).mean(2)
    k_norm = keys.pow(2).sum(dim=2) / tokens.unsqueeze(-1).to(keys.dtype)
    pruned = (q_norm * k_norm).topk(n_pruned, dim=-1, largest=False).indices
    keep = torch.ones(b, h, d, dtype=torch.bool, device=keys.device).scatter_(-1, pruned, False)
    return keep.nonzero()[:, 2].view(b, h, d - n_pruned)


def project(query: torch.Tensor, channels: torch.Tensor) -> torch.Tensor:
    """Query ``[batch, q_heads, q_len, head_dim]`` on its KV head's kept ``channels`` ``[batch,
    kv_heads, kept]`` (query head ``j`` reads KV head ``j // group``, transformers' ``repeat_kv``):
    ``[batch, q_heads, q_len, kept]``."""
    b, hq, n, _ = query.shape
    h, t = channels.shape[1:]
    index = channels.unsqueeze(2).expand(b, h, hq // h, t).reshape(b, hq, 1, t)
    return query.gather(-1, index.expand(b, hq, n, t))


@dataclass(frozen=True, eq=False)
class KeptChannels:
    """A codec (``methods.seam.storage.Codec``) holding keys on their kept channels through ``inner``
    (the run's ``quant=`` codec); values as ``inner`` holds them. Keys are read back at the kept width
    ``[..., kept]`` (what decode attention takes with a :func:`project`-ed query).

    Attributes
    ----------
    inner : Codec
        The codec the store held before (``PLAIN`` or a per-token ``quant=`` codec).
    channels : torch.Tensor
        ``[batch, kv_heads, kept]`` int64 kept channels per head (:func:`kept_channels`).
    """

    inner: Codec
    channels: torch.Tensor

    def select(self, x: torch.Tensor) -> torch.Tensor:
        """Keys ``x`` on the kept channels: ``[batch, kv_heads, k, head_dim]`` (uniform layout) or
        ``[batch * kv_heads, head_dim]`` (one token per ragged segment) -> ``[..., kept]``; keys at the
        kept width already (held keys rewritten: merges) as they are.

        Raises
        ------
        ValueError
            For another shape.
        """
        b, h, t = self.channels.shape
        if x.shape[-1] == t:
            return x
        if x.dim() == 4 and x.shape[:2] == (b, h):
            return x.gather(-1, self.channels.unsqueeze(2).expand(b, h, x.shape[2], t))
        if x.dim() == 2 and x.shape[0] == b * h:
            return x.gather(-1, self.channels.reshape(b * h, t))
        raise ValueError(f"keys of shape {tuple(x.shape)} do not map onto {b} x {h} KV heads")

    def encode(self, name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``inner``'s fields of ``x`` (keys: on the kept channels, :meth:`select`)."""
        return self.inner.encode(name, self.select(x) if name == "keys" else x)

    def decode(self, name: str, fields: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``inner``'s decode: keys ``[..., kept]``, values ``[..., head_dim]``."""
        return self.inner.decode(name, fields)


def refusal(inner: CompressionMethod) -> str | None:
    """Why ThinK cannot wrap ``inner`` (:class:`ThinK`'s Raises), or None."""
    if isinstance(inner, ThinK):
        return "it is ThinK"
    if inner.traits.probes:
        return "it compresses after the prefill"
    if inner.name == "less":
        return "its kernels take whole keys"
    if getattr(inner, "rerotate", None) is True:  # StreamingLLM's field (KeyRerotation's turns before)
        return "it re-rotates held keys while decoding (rerotate=false composes)"
    if inner.name == "expected_attention":
        return "its query statistics are whole-width"
    return None


@dataclass
class ThinK(CompressionMethod):
    """ThinK over an inner method (module docstring).

    Parameters
    ----------
    press : CompressionMethod
        The sequence method run first (a nested ``_target_``; default FullKV: ThinK alone). Its traits,
        plan, budget and decode rule are ThinK's.
    key_channel_compression_ratio : float
        Share of each head's key channels pruned, in ``[0, 1)`` (kvpress's name; 0: nothing pruned).
    window_size : int
        Prompt queries that score the channels (kvpress: 32).

    Raises
    ------
    ValueError
        For a ratio outside ``[0, 1)``, ``window_size < 1``, or an inner method whose keys cannot be
        held on fewer channels: ThinK itself, a probing method (KVzip compresses after the prefill),
        LESS (kernels trained on whole keys), StreamingLLM with ``rerotate`` (RoPE turns pairs of
        channels, ``c`` and ``c + head_dim / 2``: a kept channel's pair may be gone), Expected
        Attention (its query statistics are whole-width).
    """

    name: ClassVar[str] = "think"

    press: CompressionMethod = field(default_factory=FullKV)
    key_channel_compression_ratio: float = 0.5
    window_size: int = 32

    def __post_init__(self) -> None:
        check_range(self, "key_channel_compression_ratio")
        if self.key_channel_compression_ratio >= 1:
            raise ValueError("key_channel_compression_ratio must be below 1 (a head keeps a channel)")
        window = self.window_size
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window_size must be an integer >= 1, got {window!r}")
        reason = refusal(self.press)
        if reason:
            raise ValueError(f"ThinK cannot wrap {self.press.label}: {reason}")
        if self.decode_budget is not None:  # one switch, passed on as the allocators do
            self.press = replace(self.press, decode_budget=self.decode_budget)

    @cached_property
    def traits(self) -> Traits:
        """The inner method's."""
        return self.press.traits

    @property
    def label(self) -> str:
        """``think`` alone (over FullKV), else ``think_<inner>`` (``think_snapkv``)."""
        return self.name if isinstance(self.press, FullKV) else f"{self.name}_{self.press.label}"

    def paper(self) -> ThinK:
        """ThinK over its inner method under that method's paper rule."""
        return replace(self, press=self.press.paper(), decode_budget=None)

    def n_pruned(self, head_dim: int) -> int:
        """Channels pruned per head: ``int(head_dim x ratio)`` (kvpress)."""
        return int(head_dim * self.key_channel_compression_ratio)

    # ------------------------------------------------------------------ the inner method's rule
    def plan(self, layer: CompressedLayer) -> LayerPlan:
        return self.press.plan(layer)

    def check_budget(self, budget: int, tokens: int) -> None:
        self.press.check_budget(budget, tokens)

    def attach_assets(self, request: AssetRequest) -> None:
        self.press.attach_assets(request)

    def check_model(self, config) -> None:
        super().check_model(config)
        self.press.check_model(config)

    def check_storage(self, store: SlotStorage) -> None:
        """The uniform store of ``quant=none`` or a per-token codec (int8, int4): a stateful store (KIVI)
        quantizes keys per channel over groups of tokens, which :class:`KeptChannels` cannot re-key.

        Raises
        ------
        ValueError
            For another store.
        """
        if type(store) not in (SlotStore, RaggedStore):
            raise ValueError(f"keys on fewer channels need a per-token codec, not {type(store).__name__}")

    def prepare_graph_step(self, layer: CompressedLayer, k: int) -> None:
        self.press.prepare_graph_step(layer, k)

    def decode_step(self, layer: CompressedLayer, probs: torch.Tensor | None) -> None:
        self.press.decode_step(layer, probs)

    # ------------------------------------------------------------------ ThinK's own
    def prefill(self, layer: CompressedLayer, query: torch.Tensor, scaling: float) -> None:
        """The inner method compresses the tokens, then each head's keys keep their top channels
        (:func:`kept_channels` over the held tokens), held by :class:`KeptChannels` at that width."""
        self.press.prefill(layer, query, scaling)
        store = layer.store
        n_pruned = self.n_pruned(query.shape[-1])
        if n_pruned == 0:
            return
        keys = store.keys
        channels = kept_channels(query, keys, store.head_slots().to(keys.device), self.window_size, n_pruned)
        store.codec = KeptChannels(store.codec, channels)
        store.write("keys", keys.gather(-1, channels.unsqueeze(2).expand(*keys.shape[:3], -1)))

    def decode_attention(
        self, layer: CompressedLayer, query: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The inner method's attention with the query on the kept channels (:func:`project`); the
        softmax scale stays ``head_dim ** -0.5`` (kvpress's zeroed channels)."""
        codec = layer.store.codec
        if isinstance(codec, KeptChannels):
            query = project(query, codec.channels)
        return self.press.decode_attention(layer, query, scaling)
