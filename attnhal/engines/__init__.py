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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnhal.engines.advice import Advice
    from attnhal.platform import Platform

__all__ = ["advise"]


def advise(engine: str, args: Mapping[str, Any], platform: Platform | str, model: str | None = None, *,
           top: int = 3, vary: Sequence[str] | None = None, own: Mapping[str, str | None] | None = None,
           **options: Any) -> Advice:
    """The engine's attention-backend flags that capture the most for this model on ``platform``,
    ranked against the user's arguments ``args`` (names as the engine's own, e.g. ``attention_backend``).

    ``engine``: any registered engine whose adapter gives advice (:class:`~attnhal.engines.advice.Adviser`):
    the same call ``attnhal advise --engine NAME`` makes. ``own``: attnhal's own flags of that engine
    (``{"vllm-version": "0.33.0"}``); ``options``: the adapter's own keywords (SGLang: ``env``,
    ``among``, ``limit``; vLLM: ``trtllm_cubins``, ``among``, ``limit``). Returns an
    :class:`~attnhal.engines.advice.Advice`; an unknown, unavailable or advice-less engine raises a
    ``LookupError`` naming it.
    """
    from attnhal.engines import registry
    from attnhal.engines.advice import adviser
    from attnhal.platform import as_platform

    adapter = adviser(registry.get(engine))
    if adapter is None:
        giving = [a.name for a in registry.adapters() if adviser(a) is not None]
        raise registry.UnknownEngine(f"--engine={engine!r}: the {engine} adapter gives no advice "
                                     f"(supported: {', '.join(giving)})")
    return adapter.advise(args, as_platform(platform), {"model": model, **(own or {})}, top=top, vary=vary,
                          **options)
