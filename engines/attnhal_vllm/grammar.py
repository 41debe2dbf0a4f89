"""vLLM's command-line grammar, as its ``FlexibleArgumentParser.parse_args`` rewrites a command
line before argparse reads it (vLLM 0.33.0 ``utils/argparse_utils.py:374-500``; 0.34.0 the same):

- a ``--name`` has its underscores turned into dashes up to the first ``.`` (``--attention_backend``);
- ``-O<n>``, ``-O=<n>`` and ``-O <n>`` (n in 0..3) are ``--optimization-level <n>``;
- a dotted flag (``--compilation-config.cudagraph_mode NONE``, ``-cc.cudagraph_mode=PIECEWISE``)
  sets one key of that flag's JSON object; its value is JSON where it parses, else the text; the
  keys of one flag are merged and the object is given as that flag's value;
- the short aliases argparse knows (``-cc`` is ``--compilation-config``, ``-sc``
  ``--speculative-config``, ``-tp``, ``-pp``, ``-dp``, ``-q``);
- then argparse's own reading of a long flag (``allow_abbrev`` stays on: ``FlexibleArgumentParser``
  does not turn it off): an option string exactly, else the one option it is a prefix of
  (``--attention-back`` is ``--attention-backend``, ``--enforce`` ``--enforce-eager``); a prefix of
  several options is refused as ambiguous (``--max-num``: ``--max-num-seqs``,
  ``--max-num-batched-tokens``, ...), over the ``vllm serve`` parser's options of each release
  (:data:`~attnhal_vllm.options.OPTIONS`). Where 0.33.0 and 0.34.0 read a prefix differently
  (``--shu``: 0.34 added ``--shuffle-safetensors-files``) it is refused naming both readings.

:func:`rewrite` does the same for the tokens attnhal reads; a single-dash token it does not know is
refused naming it (never taken as the previous flag's value). The tier checks each spelling against
vLLM's own parser (``tests/engines/vllm/test_vllm_grammar.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from attnhal.engines.flags import EngineArgError
from attnhal_vllm.options import OPTIONS

__all__ = ["ALIASES", "full_name", "rewrite"]

#: vLLM's single-dash aliases of the flags attnhal reads or lists as harmless (``engine/arg_utils.py``).
ALIASES = {"-cc": "--compilation-config", "-sc": "--speculative-config", "-tp": "--tensor-parallel-size",
           "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size", "-q": "--quantization"}
_LEVELS = ("0", "1", "2", "3")
_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?")


def _name(token: str) -> str:
    """``--a_b.c_d`` -> ``--a-b.c_d`` (underscores become dashes before the first dot only, and in
    the name only: ``--attention_backend=TRITON_ATTN`` keeps its value)."""
    key, eq, value = token.partition("=")
    head, dot, rest = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest + eq + value


def _long(token: str) -> str:
    """A single-dash alias written as its long flag (``-cc.x`` -> ``--compilation-config.x``)."""
    head, dot, rest = token.partition(".")
    if head not in ALIASES:
        raise EngineArgError(head, f"{head} is not modelled by attnhal (vLLM's short flags it reads: "
                                   f"{', '.join(sorted(ALIASES))}, -O<level>)")
    return ALIASES[head] + dot + rest


def _reading(name: str, options: frozenset[str]) -> tuple[str, ...]:
    """The options argparse takes ``name`` for: itself, else every option it prefixes."""
    return (name,) if name in options else tuple(sorted(o for o in options if o.startswith(name)))


def full_name(name: str) -> str:
    """The long option vLLM's parser takes ``name`` (``--...``, dashes) for; a name of no option is
    kept (attnhal refuses it by name later, as vLLM's parser does). Raises :class:`EngineArgError`
    for a prefix of several options, or one the supported releases read differently."""
    readings = {release: _reading(name, options) for release, options in OPTIONS.items()}
    found = set(readings.values())
    if len(found) > 1 and any(len(r) == 1 for r in found):
        said = "; ".join(f"vLLM {release}: {r[0] if len(r) == 1 else 'ambiguous' if r else 'no option'}"
                         for release, r in readings.items())
        raise EngineArgError(name, f"{name} is read differently by vLLM's releases ({said}) (supported: the "
                                   "option spelled out)")
    matches = max(found, key=len)
    if len(matches) > 1:
        raise EngineArgError(name, f"{name} is ambiguous for vLLM's parser (supported: one of {', '.join(matches)})")
    return matches[0] if matches else name


def _long_name(token: str) -> str:
    """A long-flag token with its name read as vLLM's parser reads it (``=value`` kept)."""
    name, eq, value = token.partition("=")
    return full_name(name) + eq + value


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _expand(argv: Sequence[str]) -> list[str]:
    """Single-dash tokens as vLLM reads them: ``-O`` forms as ``--optimization-level``, aliases as
    their long flags; a negative number stays a value."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token.startswith("-O") and token != "-O" and not token.startswith("-O."):
            out += ["--optimization-level", token[3:] if token[2:3] == "=" else token[2:]]
        elif token == "-O" and i + 1 < len(argv) and argv[i + 1] in _LEVELS:
            out.append("--optimization-level")
        elif token.startswith("-") and not token.startswith("--") and not _NEGATIVE_NUMBER.fullmatch(token):
            key, eq, value = token.partition("=")
            out.append(_long(key) + eq + value)
        else:
            out.append(token)
    return out


def rewrite(argv: Sequence[str]) -> list[str]:
    """``argv`` rewritten as vLLM rewrites it: long flags with dashes, ``-O`` as
    ``--optimization-level``, aliases as their long flags, dotted keys merged into one JSON object
    per flag (appended last, as vLLM appends them). Raises :class:`EngineArgError` naming an
    unknown short flag or a dotted flag without a value."""
    tokens, out = _expand(argv), []
    dotted: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--") and "." in token.partition("=")[0]:
            key, eq, value = _name(token).partition("=")
            if not eq:
                if i + 1 >= len(tokens):
                    raise EngineArgError(key, f"{key} needs a value")
                value, i = tokens[i + 1], i + 1
            flag, *keys = key.split(".")
            node = dotted.setdefault(flag, {})
            for part in keys[:-1]:
                node = node.setdefault(part, {})
            node[keys[-1]] = _value(value)
        else:
            out.append(_long_name(_name(token)) if token.startswith("--") and len(token) > 2 else token)
        i += 1
    for flag, table in dotted.items():
        out += [full_name(flag), json.dumps(table)]
    return out
