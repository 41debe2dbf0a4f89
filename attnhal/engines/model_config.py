"""attnhal's ``--model-config PATH``: a Hugging Face ``config.json`` read for the fields engines decide by.

Engines read the model's architecture from its checkpoint (``architectures``, ``model_type``, the
MLA latent width ``kv_lora_rank``, the head counts and widths); ``--model`` gives attnhal the
attention kind alone. This module reads the file (JSON only: no torch, no transformers) and checks
the fields' types; each engine adapter reads them its engine's way (vLLM by ``model_type``,
SGLang by ``architectures``). A multimodal config's ``text_config`` is where both read the text
model's fields. A bad file is an :class:`~attnhal.engines.flags.EngineArgError` naming
``--model-config`` and the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnhal.engines.flags import EngineArgError

__all__ = ["FLAG", "HFConfig", "read"]

FLAG = "--model-config"
#: Integer fields read where present (each must be a positive integer).
_INTS = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "kv_lora_rank",
         "qk_nope_head_dim", "qk_rope_head_dim", "index_topk")


@dataclass(frozen=True)
class HFConfig:
    """The fields of one ``config.json`` the engines' choices read (``None``: absent)."""

    path: str
    architectures: tuple[str, ...]
    model_type: str | None
    fields: Mapping[str, int]  # the integers of _INTS that are present
    dtype: str | None  # ``torch_dtype`` (or ``dtype``)

    def get(self, name: str) -> int | None:
        return self.fields.get(name)

    @property
    def architecture(self) -> str:
        """The first architecture (the one both engines key their overrides on)."""
        return self.architectures[0]


def _bad(field: str, value: Any, supported: str, path: str) -> EngineArgError:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return EngineArgError(FLAG, f"{FLAG} {path}: {field}={shown} (supported: {supported})")


def _object(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise EngineArgError(FLAG, f"{FLAG}={path!r}: cannot read it ({exc.strerror or exc}; supported: a "
                                   "model's config.json)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineArgError(FLAG, f"{FLAG}={path!r}: not JSON (line {exc.lineno}: {exc.msg}; supported: a "
                                   "model's config.json)") from None
    if not isinstance(data, dict):
        raise _bad("(the file)", data, "a JSON object", path)
    return data


def read(path: str) -> HFConfig:
    """The config at ``path``; its ``text_config`` (when an object) supplies the text model's fields."""
    data = _object(path)
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and a for a in archs):
        raise _bad("architectures", archs, "a non-empty list of class names, as in a Hugging Face config.json",
                   path)
    text = data.get("text_config")
    body = {**data, **text} if isinstance(text, dict) else data
    fields = {}
    for name in _INTS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise _bad(name, value, "a positive integer", path)
        fields[name] = value
    if "num_attention_heads" not in fields:
        raise _bad("num_attention_heads", body.get("num_attention_heads"), "a positive integer", path)
    model_type = body.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise _bad("model_type", model_type, "a string", path)
    dtype = body.get("torch_dtype", body.get("dtype"))
    if dtype is not None and not isinstance(dtype, str):
        raise _bad("torch_dtype", dtype, "a dtype name (bfloat16, float16, float32)", path)
    return HFConfig(str(path), tuple(archs), model_type, fields, dtype)
