"""Engine adapters: an engine's own vocabulary in, attnhal's plan inputs out.

- :mod:`attnhal.engines.base`: the contract (:class:`~attnhal.engines.base.EngineAdapter`) and the one
  record every adapter resolves to (:class:`~attnhal.engines.base.EngineConfig`).
- :mod:`attnhal.engines.registry`: the adapters registered in the ``attnhal.engines`` entry-point group.
- :mod:`attnhal.engines.sglang`: SGLang server arguments -> spec, roles, policy, context -> plan.
- :mod:`attnhal.engines.vllm`: descriptors <-> vLLM's ``AttentionCGSupport`` levels and graph modes.
- :mod:`attnhal.engines.flags`: what both share: one table of modelled flags, one set of harmless ones.
- :mod:`attnhal.engines.advice`: :func:`advise`'s answer (options, their rank), for any engine.

One package per engine, in a fixed layout: ``flags`` (the engine's vocabulary), ``resolution``
(what the engine's own code decides from it), ``plan`` (the adapter); optionally ``executed``,
``audit``, ``plugin``, ``kit``, ``advice`` (``docs/engine.md``). None imports its engine at
module level: they work from plain dicts, namespaces and names. This package imports no adapter
itself (:func:`advise` loads the one asked for), so ``import attnhal.engines.vllm`` loads nothing
of SGLang's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnhal.engines.advice import Advice

__all__ = ["ENGINES", "advise"]

#: The engines :func:`advise` answers for.
ENGINES = ("sglang", "vllm")


def advise(engine: str, args: Mapping[str, Any], platform: Any, model: Any = None, **options: Any) -> Advice:
    """The engine's attention-backend flags that capture the most for this model on ``platform``,
    ranked against the user's arguments ``args`` (names as the engine's own, e.g. ``attention_backend``).

    ``engine``: ``"sglang"`` (:func:`attnhal.engines.sglang.advice.advise`: also ``env``, ``vary``)
    or ``"vllm"`` (:func:`attnhal.engines.vllm.advice.advise`: also ``trtllm_cubins``); both take
    ``top``, ``among`` and ``limit``. Returns an :class:`~attnhal.engines.advice.Advice`.
    """
    if engine == "sglang":
        from attnhal.engines.sglang.advice import advise as sglang_advise

        return sglang_advise(args, platform, model, **options)
    if engine == "vllm":
        from attnhal.engines.vllm.advice import advise as vllm_advise

        return vllm_advise(args, platform, model, **options)
    from attnhal.engines.flags import EngineArgError

    raise EngineArgError("--engine", f"--engine={engine!r} (supported: {', '.join(ENGINES)})")
