"""KVgrad (kvpress ``KVgradPress``, ``kvgrad_press.py``; https://openreview.net/forum?id=cg1wTCJjjk):
KVzip's context reconstruction, each pair scored by input-x-gradient attribution.

As KVzip (``methods.kvzip``), the model repeats its context chunk by chunk (``chunk_size`` 512 here)
against the prefilled cache, which these forwards leave unchanged. A pair ``c`` of layer ``l`` scores

    S_{l,c} = max_{p, g} A^g_{p,c} ||v_c W_O^g||_2 ||d Phi / d a_p||_2

with ``A^g_{p,c}`` KVzip's reconstruction attention of query head ``g`` of the pair's KV group at probe
token ``p`` (the softmax over the sinks, the chunk's context and the probe's causal part),
``||v_c W_O^g||_2`` the pair's value through ``g``'s slice of ``o_proj`` (the signal it writes into the
residual stream), ``a_p`` the residual stream after layer ``l``'s attention at ``p`` (its gradient is
the attention output's), and ``Phi = sum_p ||h_p^L||^2`` over the probe's tokens of the last decoder
layer's output (before the final norm). The gradient costs one backward pass through the model per
chunk: the runners run a probe forward with autograd and hand each layer its gradient norms
(``Probing.gradient``, :meth:`KVgrad.attribute`). Then KVzip's selection (``layerwise``,
``keep_head``, ``count_pairs``), in ragged heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from methods.checks import option
from methods.criticalkv import output_norm
from methods.kvzip import KVzip
from methods.probing import Probe
from methods.seam.architecture import UnsupportedArchitectureError
from methods.seam.layer import CompressedLayer


@dataclass
class KVgrad(KVzip):
    """KVgrad with kvpress's defaults (module docstring); the fields are KVzip's.

    Parameters
    ----------
    chunk_size : int
        Context tokens per reconstruction chunk (kvpress: 512; a backward pass each).

    Raises
    ------
    ValueError
        As :class:`~methods.kvzip.KVzip`, and for ``kvzip_plus_normalization`` (KVgrad always weighs
        by ``||v W_O||``; KVzip+'s ``1 / ||h||`` does not apply).
    """

    name: ClassVar[str] = "kvgrad"
    gradient: ClassVar[bool] = True

    chunk_size: int = option(512, low=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kvzip_plus_normalization:
            raise ValueError("kvgrad weighs by ||v W_O|| itself: kvzip_plus_normalization does not apply")
        self._pending: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}  # by id(layer), one probe

    def probe(
        self,
        layer: CompressedLayer,
        query: torch.Tensor,
        keys: torch.Tensor,
        scaling: float,
        probe: Probe,
        hidden_norm: torch.Tensor | None = None,
    ) -> None:
        """Hold ``max_g A^g_{p,c} ||v_c W_O^g||_2`` ``[batch, kv_heads, tokens, span]`` float32 for
        :meth:`attribute` (the gradient norm does not depend on ``g``, so the maximum over the group
        comes first).

        Raises
        ------
        UnsupportedArchitectureError
            When the attention's ``o_proj`` could not be found.
        """
        if layer.spec.out_proj is None:
            raise UnsupportedArchitectureError("kvgrad needs the attention's o_proj")
        start, stop = probe.span
        with torch.no_grad():
            norms = output_norm(layer.values[:, :, start:stop], layer.spec.out_proj, ord=2, per_head=True)
            rows = [
                span.exp_().mul_(norms[:, :, :, None]).amax(dim=2)
                for _, _, span in self.span_log_probs(layer, query.detach(), keys.detach(), scaling, probe)
            ]
        self._pending[id(layer)] = (probe.span, torch.cat(rows, dim=2))

    def attribute(self, layer: CompressedLayer, grad_norm: torch.Tensor) -> None:
        """Scores of the probe's span: the held ``max_g A ||v W_O||`` times ``grad_norm`` ``[batch,
        tokens]`` per probe token, the maximum over the tokens."""
        (start, stop), held = self._pending.pop(id(layer))
        scores = layer.store.state["scores"].clone()
        scores[:, :, start:stop] = (held * grad_norm[:, None, :, None]).amax(dim=2)
        layer.store.write("scores", scores)
