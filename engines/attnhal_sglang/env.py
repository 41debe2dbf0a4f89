"""SGLang's environment variables as SGLang 0.5.23 reads them: one table and one rule.

SGLang reads its switches through ``EnvBool.get`` (``environ.py:67-86, 143-150``): true, 1, yes, y /
false, 0, no, n in any case; anything else (an empty string, padding, "on") is invalid, and SGLang
warns and takes the variable's default. Its older ``get_bool_env_var`` takes only true/1: a
variable read that way would need its own rule here.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnhal.errors import InvalidValue

__all__ = ["BOOL_ENV", "DRAFT_EXTEND_GRAPH_OFF", "SINGLE_GRAPH_DRAFT", "env_bool"]

#: The environment variable that turns the draft-extend graph off (environ.py; eagle_worker_v2.py:627).
DRAFT_EXTEND_GRAPH_OFF = "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"
#: Multi-layer EAGLE's one-graph draft extend (environ.py: ``EnvBool(True)``).
SINGLE_GRAPH_DRAFT = "SGLANG_ENABLE_SINGLE_CG_DRAFT"
#: Every SGLang environment variable attnhal reads, with SGLang's default (``environ.py:1587``:
#: ``EnvBool(False)``).
BOOL_ENV: Mapping[str, bool] = {DRAFT_EXTEND_GRAPH_OFF: False, SINGLE_GRAPH_DRAFT: True}
#: ``EnvBool.parse``: the lower-cased value in one of these; anything else (an empty string,
#: padding, "on") is invalid and SGLang warns and takes the default.
_TRUE, _FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")


def env_bool(env: Mapping[str, str], name: str) -> bool:
    """``env[name]`` as SGLang 0.5.23 reads it (``EnvBool``): unset or invalid -> the default.

    ``name`` must be one of :data:`BOOL_ENV`: a variable SGLang reads otherwise (its older
    ``get_bool_env_var`` takes only true/1) would need its own rule here.
    """
    if name not in BOOL_ENV:
        raise InvalidValue("name", name, ", ".join(BOOL_ENV))
    raw = env.get(name)
    value = raw.lower() if raw is not None else None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return BOOL_ENV[name]
