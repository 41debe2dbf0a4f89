"""Engine adapters: an engine's own vocabulary in, attnhal's plan inputs out.

- :mod:`attnhal.engines.sglang`: SGLang server arguments -> spec, roles, policy, context -> plan.
- :mod:`attnhal.engines.vllm`: descriptors <-> vLLM's ``AttentionCGSupport`` levels and graph modes.

Neither imports its engine: they work from plain dicts, namespaces and names.
"""
