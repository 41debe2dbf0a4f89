"""The plan SGLang server arguments lead to, in one call."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from attnhal.engines.sglang.resolution import from_server_args
from attnhal.planner import GraphPlan
from attnhal.platform import Platform
from attnhal.spec import ModelKind

__all__ = ["plan_server_args"]


def plan_server_args(args: Mapping[str, Any] | argparse.Namespace, platform: Platform | str,
                     env: Mapping[str, str] | None = None, model: ModelKind | str | None = None) -> GraphPlan:
    """``from_server_args(args, env, model, platform).plan(platform)``."""
    return from_server_args(args, env, model, platform).plan(platform)
