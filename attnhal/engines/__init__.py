"""Engine adapters: an engine's own vocabulary in, attnhal's plan inputs out.

- :mod:`attnhal.engines.sglang`: SGLang server arguments -> spec, roles, policy, context -> plan.
- :mod:`attnhal.engines.vllm`: descriptors <-> vLLM's ``AttentionCGSupport`` levels and graph modes.
- :mod:`attnhal.engines.flags`: what both share: one table of modelled flags, one set of harmless ones.

One package per engine: ``flags`` (the engine's vocabulary), ``resolution`` (what the
engine's own code decides from it), ``plan``. Neither imports its engine: they work
from plain dicts, namespaces and names. This package imports no adapter itself, so
``import attnhal.engines.vllm`` loads nothing of SGLang's.
"""
