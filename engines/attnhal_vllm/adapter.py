"""The vLLM adapter (:data:`ADAPTER`, registered as ``attnhal.engines`` entry point ``vllm``): engine
arguments parsed (:mod:`~attnhal_vllm.flags`), resolved (:mod:`~attnhal_vllm.config`) and advised
(:mod:`~attnhal_vllm.advice`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attnhal.engines.base import OwnFlag
from attnhal.engines.flags import EngineArgError, Flag, model_kind
from attnhal.engines.model_config import read
from attnhal.spec import ModelKind
from attnhal_vllm.model import kind_of, shape_of
from attnhal_vllm.selection import ModelShape
from attnhal_vllm.config import VllmConfig, _cubins, from_engine_args, release_for
from attnhal_vllm.flags import FIELD_FLAGS, FLAGS, HARMLESS, VLLM_SERIES_DIGITS, VLLM_VERSION, VLLM_VERSIONS, parse_cli
from attnhal_vllm.runner import ENV_VAR as RUNNER_VAR
from attnhal.platform import Platform

if TYPE_CHECKING:
    from attnhal.engines.advice import Advice

__all__ = ["ADAPTER", "VllmAdapter"]


class VllmAdapter:
    """vLLM engine arguments (0.33.0 and 0.34.0 take the same modelled flags) -> :class:`VllmConfig`
    (attnhal's reading; vLLM is never imported)."""

    name = "vllm"
    version = VLLM_VERSION
    versions = VLLM_VERSIONS
    series_digits = VLLM_SERIES_DIGITS
    distribution = "vllm"
    #: On another release the plugin knows no code to hook (0.34 moved the runner): it stays off.
    other_release = "stays off"
    flags: Mapping[str, Flag] = FLAGS
    harmless = HARMLESS
    own_flags = (OwnFlag("trtllm-cubins", "whether FlashInfer's trtllm-gen cubins are available (its graph level "
                                          "rests on them)", ("yes", "no"), "yes"),
                 OwnFlag("vllm-version", "the vLLM release to model (default: the installed one, else the newest "
                                         "supported; a patch or pre/post release of a supported minor is "
                                         "modelled as it)", VLLM_VERSIONS, open=True))
    field_flags = FIELD_FLAGS
    catalog = "attnhal_vllm.catalog"
    #: ``--model-config`` is read as vLLM reads a config.json (:mod:`attnhal_vllm.model`).
    reads_model_config = True

    def parse(self, argv: Sequence[str]) -> dict[str, Any]:
        return parse_cli(argv)

    def advise(self, values: Mapping[str, Any], platform: Platform, own: Mapping[str, str | None], *,
               top: int = 3, vary: Sequence[str] | None = None, **options: Any) -> Advice:
        """``attnhal advise --engine vllm``: :func:`attnhal_vllm.advice.advise` (one flag varies;
        ``trtllm_cubins=`` replaces ``--trtllm-cubins``, ``among=`` and ``limit=`` as there)."""
        from attnhal_vllm.advice import advise

        if vary is not None:
            raise EngineArgError("--vary", "--vary (supported: with --engine sglang; vLLM's choice is one flag, "
                                           "--attention-backend)")
        cubins = own.get("trtllm-cubins") or "yes"
        if cubins not in ("yes", "no"):
            raise EngineArgError("--trtllm-cubins", f"--trtllm-cubins={cubins!r} (supported: yes, no)")
        release = release_for(own.get("vllm-version"))[0]
        options.setdefault("trtllm_cubins", cubins == "yes")
        options.setdefault("env", _runner_env())
        model, shape = _model(own, release)
        return advise(values, platform, model, top=top, release=release, shape=shape, **options)

    def resolve(self, values: Mapping[str, Any], platform: Platform, own: Mapping[str, str | None]) -> VllmConfig:
        """The flags as vLLM reads them, with the runner switch of this process's environment."""
        release = release_for(own.get("vllm-version"))[0]
        model, shape = _model(own, release)
        return from_engine_args(values, platform, _cubins(own.get("trtllm-cubins")), model,
                                own.get("vllm-version"), _runner_env(), shape)


def _model(own: Mapping[str, str | None], release: str) -> tuple[str | None, ModelShape | None]:
    """``--model`` (the kind) and ``--model-config`` read as vLLM ``release`` reads it (:mod:`attnhal_vllm.model`):
    the kind from the config where ``--model`` is not given; the two must agree on MLA."""
    given = own.get("model")
    if not own.get("model-config"):
        return given, None
    config = read(str(own["model-config"]))
    kind, shape = kind_of(config, release), shape_of(config, release)
    if given is not None and (model_kind(given) is ModelKind.MLA) != (kind is ModelKind.MLA):
        raise EngineArgError("--model", f"--model={given} contradicts --model-config ({shape.source}: vLLM "
                                        f"{release} reads it as {kind.value}) (supported: one of them)")
    return given or kind.value, shape


def _runner_env() -> dict[str, str]:
    """vLLM's runner switch as this process's environment has it (``attnhal plan`` runs where the
    server's environment is set, or says it: ``VLLM_USE_V2_MODEL_RUNNER=0 attnhal plan ...``)."""
    return {RUNNER_VAR: os.environ[RUNNER_VAR]} if RUNNER_VAR in os.environ else {}


#: The adapter the ``attnhal.engines`` entry point ``vllm`` names.
ADAPTER = VllmAdapter()
