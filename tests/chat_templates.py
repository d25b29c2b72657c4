"""Chat templates the template tests render: the embedded model config (SmolLM2) and a Qwen3-style
template with its thinking switch."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.conftest import REPO

#: Qwen3's template, its thinking switch kept (system prompt and tool calls left out).
QWEN3 = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


SMOLLM2 = OmegaConf.load(REPO / "configs" / "model" / "smollm2-135m.yaml")
