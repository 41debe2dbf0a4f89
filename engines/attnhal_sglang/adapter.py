"""The SGLang adapter (:data:`ADAPTER`, registered as ``attnhal.engines`` entry point ``sglang``),
and the plan SGLang server arguments lead to, in one call."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from attnhal.engines.base import OwnFlag
from attnhal.engines.flags import Flag
from attnhal.engines.model_config import read
from attnhal_sglang import executed
from attnhal_sglang.flags import (FIELD_FLAGS, FLAGS, HARMLESS, SGLANG_SERIES_DIGITS, SGLANG_VERSION,
                                  SGLANG_VERSIONS, parse_cli)
from attnhal_sglang.config import DRAFT_EXTEND_GRAPH_OFF, SglangConfig, from_server_args
from attnhal.planner import GraphPlan
from attnhal.platform import ENV_VAR, Platform
from attnhal.spec import ModelKind

if TYPE_CHECKING:
    from attnhal.engines.advice import Advice

__all__ = ["ADAPTER", "SglangAdapter", "plan_server_args"]


def plan_server_args(args: Mapping[str, Any] | argparse.Namespace, platform: Platform | str,
                     env: Mapping[str, str] | None = None, model: ModelKind | str | None = None) -> GraphPlan:
    """``from_server_args(args, env, model, platform).plan(platform)``."""
    return from_server_args(args, env, model, platform).plan(platform)


class SglangAdapter:
    """SGLang 0.5.23 server flags -> :class:`~attnhal_sglang.config.SglangConfig`, resolved by
    SGLang's own code where it can run (:mod:`~attnhal_sglang.executed`), else attnhal's."""

    name = "sglang"
    version = SGLANG_VERSION
    versions = SGLANG_VERSIONS
    series_digits = SGLANG_SERIES_DIGITS
    distribution = "sglang"
    flags: Mapping[str, Flag] = FLAGS
    harmless = HARMLESS
    own_flags = (OwnFlag("engine-resolution", "resolve the flags with SGLang's own code (engine) or attnhal's "
                                              "(builtin); default: engine where SGLang is importable, the platform "
                                              "is this machine's and --model-path is given", executed.RESOLUTIONS),)
    field_flags = FIELD_FLAGS
    catalog = "attnhal_sglang.catalog"
    #: ``--model-config`` is read as SGLang reads a config.json (:mod:`attnhal_sglang.model`).
    reads_model_config = True

    def parse(self, argv: Sequence[str]) -> dict[str, Any]:
        return parse_cli(argv)

    def advise(self, values: Mapping[str, Any], platform: Platform, own: Mapping[str, str | None], *,
               top: int = 3, vary: Sequence[str] | None = None, **options: Any) -> Advice:
        """``attnhal advise --engine sglang``: :func:`attnhal_sglang.advice.advise` with the
        draft-extend graph switch read from the environment and ``--model-config`` read, as
        :meth:`resolve` reads them (``env=`` replaces the switch; ``among=``, ``limit=`` as there)."""
        from attnhal_sglang.advice import advise

        env = options.pop("env", {DRAFT_EXTEND_GRAPH_OFF: os.environ.get(DRAFT_EXTEND_GRAPH_OFF, "")})
        model_config = own.get("model-config")
        return advise(values, platform, own.get("model"), env=env, vary=vary, top=top,
                      model_config=read(model_config) if model_config else None, **options)

    def conformance(self, ref: str) -> Callable[..., Any] | None:
        """How ``attnhal conformance`` checks catalogue name ``ref``: the kit on SGLang's own backend
        classes (:func:`attnhal_sglang.kit.runner`), or None (the name stays a descriptor)."""
        from attnhal_sglang.kit import runner

        return runner(ref)

    def resolve(self, values: Mapping[str, Any], platform: Platform,
                own: Mapping[str, str | None]) -> SglangConfig:
        env = {DRAFT_EXTEND_GRAPH_OFF: os.environ.get(DRAFT_EXTEND_GRAPH_OFF, "")}
        local = own.get("platform") is None and not os.environ.get(ENV_VAR)
        choice = executed.choose(own.get("engine-resolution"), local, values.get("model_path"),
                                 accelerator=platform.torch_device != "cpu")
        path = own.get("model-config")
        model_config = read(path) if path else None
        if choice.used == "engine":
            config = executed.from_engine(values, env, own.get("model"), platform, model_config)
        else:
            config = from_server_args(values, env=env, model=own.get("model"), platform=platform,
                                      model_config=model_config)
        return replace(config, choice=choice)


#: The adapter the ``attnhal.engines`` entry point ``sglang`` names.
ADAPTER = SglangAdapter()
