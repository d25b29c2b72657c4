"""The one model call of every generation (:class:`ModelRun`): prefill, a question chunk, and decode
steps, eager (the reference) or compiled (config ``backend=compiled``: ``torch.compile`` of the
model's one-token forward, cache seam and method included; CUDA graphs on CUDA via
``mode="reduce-overhead"``); and the forward of several rows' decode steps, one cache per row
(:func:`forward_rows`). The prefill always runs eagerly.
"""

from __future__ import annotations

import functools
import inspect

import torch

from kernels.switch import RAN, Switch
from methods.seam.architecture import UnsupportedArchitectureError, attention_modules
from methods.seam.cache import CompressedCache
from methods.seam.contract import CompressionMethod
from methods.seam.storage import StorageKind
from methods.seam.uniform import SlotStore
from runners.generation.probe import ProbeCache
from runners.generation.rows import RowsCache
from runners.setup.kernel_proof import prove_for_model

__all__ = [
    "BACKENDS",
    "ModelRun",
    "cache_arguments",
    "compiled_forward",
    "forward_rows",
    "get_decode_backend",
    "model_forward",
    "probe_caches",
    "probe_gradients",
    "set_decode_backend",
]


BACKENDS = ("eager", "compiled")
#: How decode steps run: ``eager`` (the reference) or ``compiled`` (:func:`compiled_forward`).
DECODE_BACKEND = Switch("backend", BACKENDS, "eager")
set_decode_backend, get_decode_backend = DECODE_BACKEND.set, DECODE_BACKEND.get


def compiled_forward(model: torch.nn.Module):
    """``torch.compile`` of ``model``'s forward, made once per model and kept on the model object
    (not as a submodule). Inductor on every device; on CUDA ``mode="reduce-overhead"`` (CUDA graphs
    over the whole step), the whole step as one graph (``fullgraph``: a method that breaks the graph
    raises instead of running partly eager). The step takes no integer that changes per step
    (``CompressedCache.prepare_graph_step`` counts its tokens and slots ahead; positions and counts
    are device tensors): a growing layer attends over its buffers' static capacity with a validity
    mask, a compressing one has the same shapes once full, so a sample's steps compile once (another
    sample's buffer sizes once more, then symbolic: Dynamo's automatic dynamic shapes)."""
    fn = model.__dict__.get("_kvbench_compiled")
    if fn is None:
        torch._dynamo.reset()  # one model per run: earlier models' graphs would count towards the limit
        # a graph break or a recompilation past the limit raises instead of falling back to eager
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        mode = "reduce-overhead" if next(model.parameters()).is_cuda else None
        fn = torch.compile(model.forward, mode=mode, fullgraph=True)
        model.__dict__["_kvbench_compiled"] = fn
    return fn


class ModelRun:
    """One model over one compressed cache (prefill, then one token per row and decode step), used
    by :func:`greedy_generate` and by the timing loop (``runners.measure.timing.Decoder``); every model call
    goes through :func:`model_forward` (this class's, and :func:`forward_rows`' batched rows).
    Positions are the true token indices; the cache is handed to
    the attention function explicitly (``kvbench_cache``), since ``model.generate`` rejects
    unknown keyword arguments.

    Parameters
    ----------
    model : torch.nn.Module
        A causal LM loaded with ``attn_implementation="kvbench"``.
    method : CompressionMethod
        Compression rules.
    budget : int | None
        Slots per (layer, KV head); None for no compression.
    max_tokens : int | None
        Tokens the run appends at most (caps the cache's buffers; ``CompressedCache``).
    observer : callable, optional
        Handed to the attention function as ``kvbench_observer`` (``methods.seam.attention``).
    backend : str | None
        ``eager`` or ``compiled`` decode steps (:func:`compiled_forward`); None: the configured
        one (:func:`set_decode_backend`). An observer forces eager steps (it is Python called per layer).
    cache : CompressedCache | None
        A cache that already holds a prefilled prompt (a shared prefill,
        ``runners.generation.shared_prefill``); ``method``, ``budget`` and ``max_tokens`` are then its own.

    Raises
    ------
    ValueError
        For an unknown backend.

    Attributes
    ----------
    cache : CompressedCache
    seen : int
        Tokens fed so far (the position of the next one).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        method: CompressionMethod,
        budget: int | None,
        max_tokens: int | None = None,
        observer=None,
        backend: str | None = None,
        cache: CompressedCache | None = None,
        storage: StorageKind = SlotStore,
    ) -> None:
        self.model, self.observer = model, observer
        if cache is None:
            cache = CompressedCache.for_model(model, method, budget, max_tokens, storage)
        self.cache = cache
        self.seen = self.cache.get_seq_length()
        self.backend = get_decode_backend() if backend is None else backend
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        compiled = self.backend == "compiled" and observer is None
        if compiled:  # a traced step cannot prove a kernel: prove them all now (kernels.proof)
            prove_for_model(model)
        self._decode = compiled_forward(model) if compiled else model
        self._steps = "compiled" if compiled else "eager"

    def _forward(self, forward, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        batch, new = input_ids.shape
        positions = torch.arange(self.seen, self.seen + new, device=input_ids.device).expand(batch, new)
        logits = model_forward(forward, input_ids, positions, self.cache, self.observer, **kwargs)
        self.seen += new
        return logits

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Feed the prompts ``[batch, prompt]`` (equal length, no padding), then a probing method's
        forwards (:meth:`probe`); returns the last position's logits ``[batch, vocab]``."""
        logits = self._forward(self.model, input_ids, logits_to_keep=1)
        self.probe(input_ids)
        return logits

    def probe(self, input_ids: torch.Tensor) -> None:
        """After the prefill of ``input_ids`` ``[batch, prompt]``: the probe forwards of a probing method
        (``methods.probing``; KVzip's reconstruction chunks) over the uncompressed cache, which they leave
        unchanged (``runners.generation.probe``), then the method compresses its layers. Nothing for
        other methods."""
        if self.cache.method.traits.probes:
            probe_caches(self.model, [self.cache], input_ids)

    def append(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Feed a chunk ``[batch, chunk]`` after the prefill (a question appended to the compressed
        context: ``methods.seam.step.layer_step``), eagerly; returns the last position's logits
        ``[batch, vocab]``."""
        return self._forward(self.model, input_ids, logits_to_keep=1)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``[batch]``); returns the logits ``[batch, vocab]``."""
        RAN.note("backend", self._steps)
        if self._steps == "eager":
            return self._forward(self._decode, tokens[:, None])
        self.cache.prepare_graph_step()
        torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are not read again
        return self._forward(self._decode, tokens[:, None]).clone()  # kept past the next replay


def probe_caches(model: torch.nn.Module, caches: list[CompressedCache], input_ids: torch.Tensor) -> None:
    """The probe forwards of the first cache's probing method (``methods.probing``; KVzip's
    reconstruction chunks) after the prefill of ``input_ids`` ``[batch, prompt]``, run once over the
    first cache, left unchanged (``runners.generation.probe.ProbeCache``), each chunk read by every cache's
    probing rules; then each cache's method compresses the layers it rules. ``caches``: prefilled
    caches of one prompt and one storage kind whose methods ask for the same probe forwards (one
    run's cache, or a grid's settings: ``runners.generation.shared_prefill``).

    Raises
    ------
    ValueError
        As the method's ``probe_prompts`` (KVzip without its reconstruction prompt).
    """
    seen = caches[0].get_seq_length()
    gradient = any(getattr(rule, "gradient", False) for each in caches for rule in each.rules)
    with ProbeCache(caches).hooked(model) as cache:
        for probe in caches[0].method.probe_prompts(input_ids):
            cache.probe, ids = probe, probe.ids.to(input_ids.device)
            positions = torch.arange(seen, seen + ids.shape[1], device=ids.device).expand_as(ids)
            if gradient:
                probe_gradients(model, cache, ids, positions)
            else:
                model_forward(model, ids, positions, cache, logits_to_keep=1)
    for each in caches:
        ruled = zip(each.layers, each.rules, strict=True)
        each.method.compress([layer for layer, rule in ruled if rule is each.method])


def probe_gradients(
    model: torch.nn.Module, cache: ProbeCache, ids: torch.Tensor, positions: torch.Tensor
) -> None:
    """One probe forward of ``ids`` ``[batch, tokens]`` at ``positions`` with autograd (KVgrad,
    ``methods.probing.Probing.gradient``), even under inference mode: the token embeddings are the
    leaves (the parameters need no gradient), ``Phi = sum_p ||h_p^L||^2`` over the last decoder layer's
    outputs (before the final norm), one backward to every attention module's output, then each
    cache's gradient rule of each layer gets the norms ``[batch, tokens]`` (``attribute``).

    Raises
    ------
    UnsupportedArchitectureError
        When the decoder's layers or their attention modules cannot be found.
    """
    attention = attention_modules(model)
    if not attention or any(module is None for module in attention):
        raise UnsupportedArchitectureError("kvgrad needs every decoder layer's self_attn")
    outputs: dict[int, torch.Tensor] = {}
    last: list[torch.Tensor] = []

    def keep_output(i: int):
        return lambda module, args, out: outputs.__setitem__(i, out[0] if isinstance(out, tuple) else out)

    hooks = [module.register_forward_hook(keep_output(i)) for i, module in enumerate(attention)]
    layers = model.get_decoder().layers
    hooks.append(
        layers[-1].register_forward_hook(
            lambda m, a, out: last.append(out[0] if isinstance(out, tuple) else out)
        )
    )
    try:
        with torch.inference_mode(False), torch.enable_grad():
            embeds = model.get_input_embeddings()(ids.clone()).detach().requires_grad_(True)
            model(
                inputs_embeds=embeds, position_ids=positions.clone(), use_cache=True,
                **cache_arguments(model, cache), logits_to_keep=1,
            )  # fmt: skip
            phi = last[-1].float().square().sum()
            grads = torch.autograd.grad(phi, [outputs[i] for i in range(len(attention))])
    finally:
        for hook in hooks:
            hook.remove()
    for each in cache.caches:
        for i, rule in enumerate(each.rules):
            if getattr(rule, "gradient", False):
                rule.attribute(
                    each.layers[i], torch.linalg.vector_norm(grads[i].detach(), dim=-1, dtype=torch.float32)
                )


@functools.cache
def _cache_keyword(function) -> str:
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


def cache_keyword(forward) -> str:
    """The keyword under which ``forward`` (a model, or its compiled forward) takes its cache: ``cache``
    in current transformers (where ``past_key_values`` is deprecated), ``past_key_values`` in earlier
    5.x releases; looked up once per forward function."""
    function = inspect.unwrap(forward.forward if isinstance(forward, torch.nn.Module) else forward)
    return _cache_keyword(getattr(function, "__func__", function))


def cache_arguments(forward, cache: CompressedCache | RowsCache) -> dict:
    """The keyword arguments that hand ``cache`` to ``forward`` (a model, or its compiled forward):
    under the name the model's own forward declares (``cache`` in current transformers, where
    ``past_key_values`` is deprecated; ``past_key_values`` in earlier 5.x releases), looked up once
    per forward function, and as ``kvbench_cache`` for the attention function
    (``methods.seam.attention``)."""
    return {cache_keyword(forward): cache, "kvbench_cache": cache}


def model_forward(
    forward,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    cache: CompressedCache | RowsCache,
    observer=None,
    **kwargs,
) -> torch.Tensor:
    """One call of ``forward`` (the model, or its compiled forward) on ``input_ids`` ``[batch, new]``
    at ``positions`` ``[batch, new]`` with ``cache`` (:func:`cache_arguments`); returns the last
    position's logits ``[batch, vocab]``."""
    out = forward(
        input_ids=input_ids,
        position_ids=positions,
        use_cache=True,
        kvbench_observer=observer,
        **cache_arguments(forward, cache),
        **kwargs,
    )
    return out.logits[:, -1]


def forward_rows(model: torch.nn.Module, runs: list[ModelRun], tokens: torch.Tensor) -> torch.Tensor:
    """One eager decode forward of several runs, one token each (``tokens`` ``[rows]``), each at its
    own position on its own cache (:class:`~runners.generation.rows.RowsCache`); returns the logits
    ``[rows, vocab]`` and advances every run by one token."""
    RAN.note("backend", "eager")
    positions = torch.tensor([[run.seen] for run in runs], device=tokens.device)
    logits = model_forward(model, tokens[:, None], positions, RowsCache([run.cache for run in runs]))
    for run in runs:
        run.seen += 1
    return logits
