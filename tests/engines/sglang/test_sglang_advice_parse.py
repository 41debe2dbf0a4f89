"""Every advice line attnhal prints over the recorded SGLang grid, read by SGLang 0.5.23's own parser.

For each user flag set of the recording (``tests/engines/recorded/sglang-0.5.23.jsonl``), ``attnhal
advise`` (every recommendation's flags: ``Option.argv()``, what ``attnhal advise`` prints to paste) and
the plugin's start-up line (``attnhal_sglang.advice.every_phase_line``: the flags it names) go through
``ServerArgs.add_cli_args`` on an ``argparse.ArgumentParser``, as ``sglang serve`` reads its command
line: each parses, and each flag it names is read back with the value attnhal meant."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex

import harness
import sglang_recording
from tier_summary import LINES as SUMMARY

from attnhal.engines import advise
from attnhal_sglang.advice import every_phase_line

_, RECORDED = sglang_recording.load()
_LINE_HEAD = "a combination that captures every phase here: "


def _parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _read(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | str:
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            return parser.parse_args(["--model-path", harness.model_dir("mha"), *argv])
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]


def _line_flags(line: str) -> list[str]:
    """The flags the plugin's line sets (between its head and ``(instead of``; flags to drop follow
    ``without`` and are checked to be options of the parser)."""
    flags = line.removeprefix(_LINE_HEAD).split(" (instead of", 1)[0]
    keep, _, dropped = flags.partition("without ")
    for flag in dropped.split():
        assert flag in _parser()._option_string_actions, (line, flag)
    return shlex.split(keep.rstrip(", "))


def test_every_advice_line_parses_with_sglangs_parser() -> None:
    parser = _parser()
    users = {(c.platform, c.model, c.num_steps, c.topk, c.page_size, c.algorithm, c.decode_backend,
              c.attention_mode): c for c in RECORDED
             if c.backend is not None}
    bad: list[str] = []
    parsed = lines = 0
    for case in users.values():
        advice = advise("sglang", case.args(), case.platform, case.model, top=20)
        for option in (advice.current, *advice.recommended):
            found = _read(parser, option.argv())
            parsed += 1
            if isinstance(found, str):
                bad.append(f"{case}: {option.command()}: {found}")
                continue
            for name, value in option.flags.items():
                if value is not None and str(getattr(found, name)) != str(value):
                    bad.append(f"{case}: {option.command()}: {name}={getattr(found, name)!r}, attnhal {value!r}")
        line = every_phase_line(case.args(), case.platform, case.model)
        if line is not None and line.startswith(_LINE_HEAD):
            lines += 1
            found = _read(parser, [*_line_flags(line)])
            if isinstance(found, str):
                bad.append(f"{case}: plugin line {line!r}: {found}")
    SUMMARY.append(f"advice parsed by SGLang's parser: {parsed} flag sets over {len(users)} recorded user flag sets, "
                   f"{lines} plugin lines; refused or misread: {len(bad)}")
    assert not bad, f"{len(bad)}:\n" + "\n".join(bad[:8])
