"""Named model configurations (shapes) for random-weight models: the one table the ``random``
model source (``runners.models.random_weights``) and ``scripts/bench_cuda.py`` read.

Each entry is the keyword arguments of a transformers ``LlamaConfig`` (every shape here is a Llama:
RMSNorm, SwiGLU MLP, RoPE), copied from the paper model's own ``config.json``:

- ``llama2-7b``: Llama-2-7B, as ZSMerge Tables 1/4 and KeepKV Table 1 timed it (MHA 32/32, 4K).
- ``llama2-13b``: Llama-2-13B (MHA 40/40, 4K).
- ``smollm2-135m``: SmolLM2-135M(-Instruct), the embedded model's shape (GQA 9/3, 8K, tied
  embeddings): small enough for tests.
- ``tiny``: a 2-layer toy (hidden 128, GQA 4/2, vocabulary 512) for dry runs.

Timings do not depend on weight values, so a shape with random weights times as the paper's model
does; it has no quality to score.
"""

from __future__ import annotations

#: Shape name -> ``LlamaConfig`` keyword arguments (sizes in elements, context in tokens).
SHAPES: dict[str, dict] = {
    "llama2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                      max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0),
    "llama2-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                       max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True),
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096),
}  # fmt: skip
