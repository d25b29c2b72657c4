"""Generation: the greedy loop, batched and shared-prefill decoding, the model call."""
