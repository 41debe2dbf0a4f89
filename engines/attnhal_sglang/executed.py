"""SGLang's own argument resolution, executed: used when SGLang is importable.

``ServerArgs(...).resolve_once()`` is SGLang's pipeline: backend defaults and overrides, the
page size it sets, speculative defaults (steps, topk and draft tokens when omitted) and every
refusal. :func:`from_engine` runs it and hands what it resolved to the built-in translation
(:func:`~attnhal_sglang.config.from_server_args`), so the plan reads SGLang's own
decisions; :func:`choose` says which resolution a command uses, and why.

SGLang resolves for the machine it runs on (its device probes): the engine's resolution is
used only for the local platform. A model config is needed (SGLang reads the architecture and
the attention kind from it): ``--model-path``, as on the server's command line. SGLang is
imported inside the functions only.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from attnhal.engines import flags as _flags
from attnhal.engines.flags import EngineArgError
from attnhal.engines.model_config import HFConfig
from attnhal_sglang.flags import FLAGS, HARMLESS
from attnhal_sglang.pages import DEFAULT_PAGE_SIZE, PageSize, resolve_page_size
from attnhal_sglang.config import Choice, SglangConfig, from_server_args
from attnhal.platform import Platform, as_platform
from attnhal.spec import ModelKind

__all__ = ["RESOLUTIONS", "Choice", "EngineRefused", "choose", "from_engine", "importable"]

RESOLUTIONS = ("engine", "builtin")
#: The fields read back from SGLang's resolution (``arg_groups/overrides.py`` ``resolution_result``).
_RESOLVED = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
             "speculative_draft_attention_backend", "speculative_attention_mode", "speculative_num_steps",
             "speculative_eagle_topk", "speculative_num_draft_tokens", "page_size")


class EngineRefused(EngineArgError):
    """SGLang's own resolution refused the arguments (its exception's message)."""

    def __init__(self, message: str) -> None:
        super().__init__("sglang", f"SGLang's own resolution refuses these flags: {message}")


def importable() -> bool:
    return importlib.util.find_spec("sglang") is not None


def choose(requested: str | None, local: bool, model_path: str | None, accelerator: bool = True) -> Choice:
    """The resolution to use: ``requested`` (``None``: the engine's when it can run), given
    whether the plan is for the local platform, the ``--model-path`` given and whether this
    machine has an accelerator (SGLang's resolution asks its device and refuses without one:
    checked here, before SGLang is imported). Asking for ``engine`` where it cannot run is an
    :class:`EngineArgError` naming ``--engine-resolution``."""
    if requested not in (None, *RESOLUTIONS):
        raise EngineArgError("--engine-resolution", f"--engine-resolution={requested!r} "
                                                    f"(supported: {', '.join(RESOLUTIONS)})")
    if requested == "builtin":
        return Choice("builtin", "--engine-resolution builtin")
    missing = ("SGLang is not importable" if not importable() else
               "SGLang resolves for the machine it runs on; --platform names another" if not local else
               "SGLang reads the model's config: give --model-path" if model_path is None else
               "SGLang's resolution asks the device and this machine has no accelerator" if not accelerator else None)
    if missing is None:
        return Choice("engine", "SGLang is importable" if requested is None else "--engine-resolution engine")
    if requested == "engine":
        raise EngineArgError("--engine-resolution", f"--engine-resolution=engine cannot run here ({missing}; "
                                                    "supported: builtin)")
    return Choice("builtin", missing)


def resolve(args: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's resolution of the server arguments ``args`` (``ServerArgs`` names, ``model_path``
    included) on this machine: the fields of :data:`_RESOLVED`, prefill/decode as SGLang pairs them."""
    from sglang.srt.arg_groups.overrides import attention_backends_of, resolution_result, resolving_view
    from sglang.srt.server_args import ServerArgs

    fields = {"skip_tokenizer_init": True, **args}
    if fields.get("speculative_algorithm") not in (None, "NGRAM"):
        fields.setdefault("speculative_draft_model_path", fields["model_path"])
    server_args = ServerArgs(**fields)
    try:
        server_args.resolve_once()
    except Exception as exc:  # SGLang's refusal: an assertion, ValueError, NotImplementedError, ...
        raise EngineRefused(f"{type(exc).__name__}: {exc}") from None
    out = {name: resolution_result(server_args, name) for name in _RESOLVED}
    out["prefill_attention_backend"], out["decode_attention_backend"] = attention_backends_of(
        resolving_view(server_args))
    return out


def from_engine(args: Mapping[str, Any] | argparse.Namespace, env: Mapping[str, str] | None = None,
                model: ModelKind | str | None = None, platform: Platform | str | None = None,
                model_config: HFConfig | None = None) -> SglangConfig:
    """:func:`from_server_args` on what SGLang's own resolution made of ``args`` (which must
    carry ``model_path``) on this machine, whose platform is ``platform``. The flags are checked
    as the built-in translation checks them; the page size says when SGLang changed it.
    ``model_config`` (``--model-config``): the model kind where ``model`` is not given."""
    raw = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    converted, _ = _flags.check(raw, FLAGS, HARMLESS, "attnhal_sglang.HARMLESS")
    if not raw.get("model_path"):
        raise EngineArgError("--model-path", "SGLang's own resolution reads the model's config: give --model-path")
    given = {k: v for k, v in raw.items() if v is not None}
    # SGLang takes typed values: the modelled flags as converted, and the model; other harmless
    # flags cannot change what is read back.
    typed = {k: list(v) if isinstance(v, tuple) else v for k, v in converted.items()}
    resolved = resolve({**typed, "model_path": str(raw["model_path"])})
    keep = {k: v for k, v in given.items() if k not in _RESOLVED}
    values = {**keep, **{k: v for k, v in resolved.items() if v is not None}}
    if values.get("speculative_algorithm") is None:  # no speculation: SGLang's speculative defaults are moot
        values = {k: v for k, v in values.items() if not k.startswith("speculative_")}
    config = from_server_args(values, env, model, model_config=model_config)
    if converted.get("attention_backend") != resolved["attention_backend"]:
        config = replace(config, notes=(f"attention backend: {resolved['attention_backend']} (set by SGLang's own "
                                        "resolution)", *config.notes))
    where = as_platform(platform) if platform is not None else None
    # The built-in rules name the backend that set the page size (the one SGLang resolved).
    before = resolve_page_size({**converted, "attention_backend": resolved["attention_backend"]},
                               config.context.model, where)
    asked = int(given["page_size"]) if "page_size" in given else None
    changed = resolved["page_size"] != (asked if asked is not None else DEFAULT_PAGE_SIZE)
    page = PageSize(resolved["page_size"], asked, before.set_by if before.value == resolved["page_size"] else None,
                    engine_set=changed)
    return replace(config, page=page if changed else PageSize(resolved["page_size"], asked), resolved_by="engine")
