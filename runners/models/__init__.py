"""Models and their sources: configs, loading, GGUF conversion, weight identity."""
