"""Engine adapters: an engine's own vocabulary in, attnhal's plan inputs out.

- :mod:`attnhal.engines.base`: the contract (:class:`~attnhal.engines.base.EngineAdapter`) and the one
  record every adapter resolves to (:class:`~attnhal.engines.base.EngineConfig`).
- :mod:`attnhal.engines.registry`: the adapters registered in the ``attnhal.engines`` entry-point group.
- :mod:`attnhal.engines.flags`: what adapters share: one table of modelled flags, one set of harmless ones.
- :mod:`attnhal.engines.advice`: :func:`advise`'s answer (options, their rank), for any engine.

The adapters themselves are packages beside the core, registered through the entry points as a
third party's is: ``attnhal_sglang`` and ``attnhal_vllm`` (``engines/`` in the source tree), each
in a fixed layout (``docs/engine.md``) with its catalogue and its plugin. None imports its engine
at module level: they work from plain dicts, namespaces and names. This package imports no adapter
itself (:func:`advise` loads the one asked for), so ``import attnhal_vllm`` loads nothing of
SGLang's.
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

    ``engine``: ``"sglang"`` (:func:`attnhal_sglang.advice.advise`: also ``env``, ``vary``)
    or ``"vllm"`` (:func:`attnhal_vllm.advice.advise`: also ``trtllm_cubins``); both take
    ``top``, ``among`` and ``limit``. Returns an :class:`~attnhal.engines.advice.Advice`.
    """
    if engine == "sglang":
        from attnhal_sglang.advice import advise as sglang_advise

        return sglang_advise(args, platform, model, **options)
    if engine == "vllm":
        from attnhal_vllm.advice import advise as vllm_advise
        from attnhal_vllm.adapter import from_engine_args

        return vllm_advise(args, platform, model, translate=from_engine_args, **options)
    from attnhal.engines.flags import EngineArgError

    raise EngineArgError("--engine", f"--engine={engine!r} (supported: {', '.join(ENGINES)})")
