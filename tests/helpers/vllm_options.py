"""Writes ``engines/attnhal_vllm/options.py`` from the option strings of each vLLM release's
``vllm serve`` parser (the vLLM tiers record them: ``tests/engines/vllm/test_vllm_grammar.py``)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from pathlib import Path

PATH = Path(__file__).resolve().parents[2] / "engines" / "attnhal_vllm" / "options.py"

HEAD = '''"""vLLM's ``vllm serve`` option strings per release, as its own parser has them (generated: do not edit).

``make_arg_parser(FlexibleArgumentParser())`` (``vllm/entrypoints/common/cli_args.py``) in each vLLM
tier; the tier checks its release's table is current (``tests/engines/vllm/test_vllm_grammar.py``,
which rewrites it with ``ATTNHAL_RECORD=1``). :mod:`attnhal_vllm.grammar` resolves abbreviations
against them as argparse does (the parser keeps argparse's ``allow_abbrev``).
"""

from __future__ import annotations

__all__ = ["OPTIONS"]

'''


def _words(options: frozenset[str]) -> str:
    return "\n".join(textwrap.wrap(" ".join(sorted(options)), 110, break_on_hyphens=False))


def render(tables: Mapping[str, frozenset[str]]) -> str:
    """The module: the first release's options in full, each later one as what it adds and removes."""
    releases = sorted(tables, key=lambda r: tuple(int(p) for p in r.split(".")))
    first = releases[0]
    out = [HEAD, f'_{first.replace(".", "_")} = frozenset("""\n{_words(tables[first])}\n""".split())\n']
    entries = [f'    "{first}": _{first.replace(".", "_")},']
    for release in releases[1:]:
        added, removed = tables[release] - tables[first], tables[first] - tables[release]
        out.append(f'#: vLLM {release} against {first}: options added, options removed.\n'
                   f'_{release.replace(".", "_")}_ADDED = frozenset("""\n{_words(added)}\n""".split())\n'
                   f'_{release.replace(".", "_")}_REMOVED = frozenset("""\n{_words(removed)}\n""".split())\n')
        entries.append(f'    "{release}": (_{first.replace(".", "_")} | _{release.replace(".", "_")}_ADDED) - '
                       f'_{release.replace(".", "_")}_REMOVED,')
    sizes = ", ".join(f"{r}: {len(tables[r])}" for r in releases)
    out.append(f"#: Release -> every option string of its ``vllm serve`` parser ({sizes}).\n"
               "OPTIONS: dict[str, frozenset[str]] = {\n" + "\n".join(entries) + "\n}\n")
    return "\n".join(out)


def update(release: str, options: frozenset[str]) -> None:
    """Rewrite the module with ``release``'s options (the other releases' kept)."""
    from attnhal_vllm.options import OPTIONS

    PATH.write_text(render({**OPTIONS, release: options}), encoding="utf-8")
