"""Runners: ``runners.registry.RUNNER_REGISTRY`` maps ``runner.name`` to the function that runs a job
(``quality``, ``train_less`` here; the others in ``measure`` and ``sweeps``). One room per concern:

- ``setup``: the checks before any work (the option schema, budget, decode rule, storage kind,
  kernels, paths) and building the method, task and prompts;
- ``models``: model configs, their weight sources, GGUF conversion and weight identity;
- ``generation``: the model call, the greedy loop, batched rows, shared prefills, probe forwards;
- ``measure``: timing, efficiency, OOM thresholds, attention error;
- ``output``: a record's shared fields, provenance and memory facts, the console table, loggers;
- ``sweeps``: grids, shards and experiment sweeps;
- ``results``: the result store and run identity, which reports/ reads: it imports nothing else of
  runners/ and no torch.
"""
