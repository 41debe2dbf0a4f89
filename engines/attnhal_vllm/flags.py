"""vLLM's vocabulary (release 0.33.0): the modelled engine arguments and the harmless ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnhal.catalog import CatalogError, entries, load
from attnhal.engines.flags import EngineArgError, Flag, json_object, one_of, positive, truth
from attnhal.engines.flags import parse_cli as parse_flags
from attnhal_vllm.modes import GraphMode

__all__ = ["FIELD_FLAGS", "FLAGS", "HARMLESS", "METHODS", "OPTIMIZATION_LEVELS", "VLLM_SERIES_DIGITS", "VLLM_VERSION", "VLLM_VERSIONS", "parse_cli"]

#: The release whose arguments this module reads and whose backends ``engines/attnhal_vllm/catalog`` describes.
VLLM_VERSION = "0.33.0"
#: The releases the adapter and the plugin are tested against (``attnhal info``; the plugin stays off on others: it knows no code of theirs to hook).
VLLM_VERSIONS = (VLLM_VERSION, "0.34.0")
#: vLLM's series is its minor (``0.34``): a patch, pre- or post-release of a supported release is
#: modelled as it (:func:`attnhal.engines.releases.modelled`); vLLM moves code between minors.
VLLM_SERIES_DIGITS = 2

#: Planner field (an :class:`~attnhal.errors.InvalidValue`'s ``field``) -> the flags that set it, in
#: the order :func:`~attnhal_vllm.config.from_engine_args` reads them, each with how a message
#: names it (the planner validates the spec; the user never typed ``num_steps=``).
FIELD_FLAGS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "num_steps": (("--spec-tokens", "--spec-tokens"),
                  ("--speculative-config", "--speculative-config num_speculative_tokens")),
}

#: ``--spec-method`` / ``speculative_config.method`` -> attnhal algorithm. ``draft_model`` is a
#: separate small draft model (attnhal's ``standalone``); ``ngram`` drafts from the context.
METHODS = {"eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp", "deepseek_mtp": "mtp", "draft_model": "standalone",
           "ngram": "ngram"}

#: The flag naming the model's checkpoint (``vllm serve MODEL`` too): accepted and said not read —
#: its attention kind can change a decision; attnhal's ``--model`` / ``--model-config`` say it.
CHECKPOINT = frozenset({"model"})
#: Flags that cannot change the attention graph decision: accepted, listed as ignored (and the
#: checkpoint's, listed as not read).
HARMLESS = CHECKPOINT | frozenset("""
tokenizer revision host port served_model_name trust_remote_code seed tensor_parallel_size
pipeline_parallel_size data_parallel_size gpu_memory_utilization max_model_len max_num_seqs
max_num_batched_tokens dtype quantization spec_model load_format download_dir api_key
""".split())


def _backend(flag: str, value: Any) -> str:
    name = f"vllm:{str(value).upper()}"
    try:
        load(name)
    except CatalogError:
        known = ", ".join(e.name for e in entries("vllm"))
        raise EngineArgError(flag, f"{flag}={value!r} (supported: {known})") from None
    return name


def _json_table(keys: Mapping[str, Flag]) -> Callable[[str, Any], dict[str, Any]]:
    """A JSON object flag (``--speculative-config '{...}'``) whose keys are checked like flags."""
    def convert(flag: str, value: Any) -> dict[str, Any]:
        table = json_object(flag, value)
        out = {}
        for key, item in table.items():
            if key not in keys:
                raise EngineArgError(f"{flag}.{key}", f"{flag}.{key} is not modelled by attnhal "
                                     f"(modelled: {', '.join(keys)})")
            out[key] = keys[key].convert(f"{flag}.{key}", item)
        return out
    return convert


_METHOD = Flag(one_of(tuple(METHODS)))


def _mode(flag: str, value: Any) -> str:
    """A ``cudagraph_mode`` name, any case (vLLM reads ``CUDAGraphMode[value.upper()]``,
    config/compilation.py:873-879)."""
    return one_of(tuple(m.value for m in GraphMode))(flag, value.upper() if isinstance(value, str) else value)


def _text(flag: str, value: Any) -> str:
    """A value attnhal passes through unread (the draft model's path)."""
    if not isinstance(value, str):
        raise EngineArgError(flag, f"{flag}={value!r} (supported: a string)")
    return value


_MODE = Flag(_mode)
#: ``-O<n>`` / ``--optimization-level``: the ``cudagraph_mode`` each level defaults to
#: (``config/vllm.py:269, 290, 311, 332, 340-345``; an explicit mode wins, ``--enforce-eager`` too).
OPTIMIZATION_LEVELS = {"0": "NONE", "1": "PIECEWISE", "2": "FULL_AND_PIECEWISE", "3": "FULL_AND_PIECEWISE"}

#: The modelled arguments (vLLM 0.33.0 names: vllm/engine/arg_utils.py:1114, 1866-1873, 1891).
FLAGS: Mapping[str, Flag] = {
    "attention_backend": Flag(_backend),
    "spec_method": _METHOD,
    "spec_tokens": Flag(positive),
    "speculative_config": Flag(_json_table({"method": _METHOD, "num_speculative_tokens": Flag(positive),
                                            "model": Flag(_text)})),
    "compilation_config": Flag(_json_table({"cudagraph_mode": _MODE})),
    "enforce_eager": Flag(truth, boolean=True),
    "optimization_level": Flag(one_of(tuple(OPTIMIZATION_LEVELS))),
}


def parse_cli(argv: Sequence[str]) -> dict[str, Any]:
    """vLLM command-line flags -> ``{argument_name: text}``, read with vLLM's own rewriting first
    (:func:`attnhal_vllm.grammar.rewrite`: ``-O0``, ``-cc.cudagraph_mode=...``, dotted keys, aliases);
    a leading word is the model, as in ``vllm serve MODEL`` (``vllm/entrypoints/cli/serve.py:56-57``:
    ``model_tag`` becomes ``model``)."""
    from attnhal_vllm.grammar import rewrite

    return parse_flags(rewrite(argv), FLAGS, positional="model")
