"""Methods that score the prompt from forwards of their own after the prefill (KVzip's context
reconstruction): the :class:`Probing` mixin and the :class:`Probe` chunks it asks for.

A probing method leaves each layer uncompressed in :meth:`CompressionMethod.prefill` (the default
no-op). Once the prompt is prefilled, the runner (``runners.generation.model_run.probe_caches``) feeds its
:meth:`Probing.probe_prompts` against the prefilled cache without changing it (``runners.generation.probe``),
hands each layer's chunk to :meth:`Probing.probe`, then calls :meth:`Probing.compress` on every layer
the method rules, all at once (a budget shared across layers needs them together). A method with
:attr:`Probing.gradient` (KVgrad) has each probe forward run with autograd, and after its backward
each layer's gradient norms handed to :meth:`Probing.attribute`. The cache seam knows nothing of
this: only the runners do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from methods.seam.layer import CompressedLayer


@dataclass(frozen=True)
class Probe:
    """One forward a probing method asks for after the prefill.

    Attributes
    ----------
    ids : torch.Tensor
        ``[batch, tokens]`` token ids, fed at the positions that follow the prompt.
    span : tuple[int, int]
        ``(start, stop)``: the prompt positions the chunk is about (KVzip: the context it repeats).
    """

    ids: torch.Tensor
    span: tuple[int, int]


class Probing:
    """Mixin of a :class:`~methods.seam.contract.CompressionMethod` that probes (module docstring):
    ``class KVzip(Probing, CompressionMethod)``, whose traits declare ``probes=True``
    (``Traits.probes``: what the runners read)."""

    #: Whether each probe forward needs the gradient of ``Phi = sum_p ||h_p^L||^2`` (the last decoder
    #: layer's outputs over the probe's tokens) with respect to every layer's attention output (KVgrad).
    gradient: ClassVar[bool] = False

    def attach_tokenizer(self, tokenizer, template_kwargs: dict) -> None:
        """Read what the method needs of the model's tokenizer and chat template (rendered with
        ``template_kwargs``), once per run before the model loads (KVzip's reconstruction prompt).
        No-op by default."""

    def probe_prompts(self, input_ids: torch.Tensor) -> list[Probe]:
        """The forwards to run after the prefill of ``input_ids`` ``[batch, prompt]``."""
        raise NotImplementedError

    def probe(
        self,
        layer: CompressedLayer,
        query: torch.Tensor,
        keys: torch.Tensor,
        scaling: float,
        probe: Probe,
        hidden_norm: torch.Tensor | None = None,
    ) -> None:
        """Read one probe forward on one layer: ``query`` ``[batch, q_heads, tokens, head_dim]`` and
        ``keys`` ``[batch, kv_heads, tokens, head_dim]`` (post-RoPE) of ``probe.ids``, and
        ``hidden_norm`` ``[batch, tokens]`` float32, the L2 norm of each token's input to the layer's
        attention (None where the runner could not hook the attention module); the layer holds the
        uncompressed prompt and is left unchanged by the forward."""
        raise NotImplementedError

    def attribute(self, layer: CompressedLayer, grad_norm: torch.Tensor) -> None:
        """With :attr:`gradient`, after a probe forward's backward: ``grad_norm`` ``[batch, tokens]``
        float32, the L2 norm of ``d Phi / d o_p`` for the layer's attention output ``o_p`` at each probe
        token (the residual stream after the attention has the same gradient)."""
        raise NotImplementedError

    def compress(self, layers: list[CompressedLayer]) -> None:
        """Compress the layers this method rules (each holding the whole prompt), all at once, after
        the probe forwards."""
        raise NotImplementedError
