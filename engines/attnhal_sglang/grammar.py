"""SGLang's command-line grammar: argparse's, over SGLang's own option strings.

SGLang's server parser is a plain ``argparse.ArgumentParser`` (``allow_abbrev`` on) whose options
are spelled with dashes (:data:`~attnhal_sglang.options.OPTIONS`, recorded from SGLang 0.5.23's
parser). So, as argparse reads a long flag (``--name`` or ``--name=value``): an option string
exactly; else the one option it is a prefix of (``--attention-back`` is ``--attention-backend``);
a prefix of several is refused as ambiguous (``--cuda-graph-max-bs``); a name of no option is
refused — underscores included (``--attention_backend``: SGLang does not turn them into dashes).
:func:`rewrite` gives each flag the field SGLang stores it in, or raises naming it.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnhal.engines.flags import EngineArgError
from attnhal_sglang.options import OPTIONS, dest

__all__ = ["full_name", "rewrite"]


def full_name(name: str) -> str:
    """The option argparse takes ``name`` (``--...``) for; :class:`EngineArgError` where SGLang's
    parser refuses it."""
    if name in OPTIONS:
        return name
    matches = sorted(option for option in OPTIONS if option.startswith(name))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise EngineArgError(name, f"{name} is ambiguous for SGLang's parser (supported: one of "
                                   f"{', '.join(matches)})")
    hint = f"; SGLang spells it {name.replace('_', '-')}" if "_" in name and name.replace("_", "-") in OPTIONS else ""
    raise EngineArgError(name, f"{name} is not an option of SGLang's server (its parser refuses it{hint})")


def rewrite(argv: Sequence[str]) -> list[str]:
    """Each long flag of ``argv`` by the field SGLang stores it in (``--tensor-parallel-size`` is
    ``--tp-size``; values and ``=value`` kept)."""
    out = []
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token.partition("=")
            token = "--" + dest(full_name(name)).replace("_", "-") + eq + value
        out.append(token)
    return out
