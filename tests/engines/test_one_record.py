"""One record, three views: for every recorded grid cell, ``--engine --json``'s ``engine_outcome``,
the text report and attnhal's plan are rendered from the same rows
(:meth:`~attnhal.engines.base.EngineConfig.outcome`); on SGLang's grid the engine outcome
(attnhal's plan with the catalogued SGLang decisions, docs/catalog.md D-entries) is what SGLang's
executed code did: on every cell SGLang starts with and attnhal plans valid, the same phases captured;
the plugins' start-up tables (SGLang's and vLLM's, fed what the engine decided on each recorded cell)
say what the report says; and ``plan --engine``'s exit status (0 / 1 / 4) says whether the engine's
outcome is attnhal's plan."""

from __future__ import annotations

import collections
import functools
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import sglang_grid
import sglang_recording
import vllm_recording

import attnhal_sglang as sglang
from attnhal.cli import main
from attnhal.cli.app import OUTCOME_DIFFERS
from attnhal.cli.engine import engine_status
from attnhal.engines.report import GraphRow, format_report
from attnhal.phases import Phase

#: The seed: aiter, EAGLE one step, on gfx942 (docs/catalog.md D1).
SEED = ["--attention-backend", "aiter", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2", "--platform", "hip:gfx942"]


def _table(text: str) -> list[tuple[str, ...]]:
    """The report's rows read back from the text: its columns are at the header's offsets."""
    lines = text.splitlines()
    header = lines[1]
    starts = [m.start() for m in re.finditer(r"(?<=  )\S", "  " + header)]
    starts = [s - 2 for s in starts]
    out = []
    for line in lines[2:]:
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:])] + [line[starts[-1]:].strip()]
        out.append(tuple(cells))
    return out


def _vllm_configs(release: str) -> Iterator[tuple[vllm_recording.Case, Any]]:
    """Each recorded vLLM cell of ``release`` and attnhal's adapter's config for it."""
    import attnhal_vllm as vllm

    for case in vllm_recording.load(release):
        args: dict[str, object] = {"attention_backend": case.backend}
        if case.spec is not None:
            args["speculative_config"] = json.dumps({"method": case.spec,
                                                     "num_speculative_tokens": vllm_recording.SPEC_TOKENS})
        if case.mode is not None:
            args["compilation_config"] = json.dumps({"cudagraph_mode": case.mode})
        env = {vllm_recording.RUNNER_VAR: case.runner_env} if case.runner_env is not None else {}
        yield case, vllm.from_engine_args(args, case.platform, trtllm_cubins=False, model=case.model,
                                          version=release, env=env)


@functools.cache
def _recorded(release: str) -> dict[vllm_recording.Case, vllm_recording.Outcome]:
    return vllm_recording.load(release)


def _same(rows: list[GraphRow]) -> None:
    """The JSON rows and the text table say the same, row by row."""
    text = _table(format_report("title", rows))
    for row, cells, data in zip(rows, text, (r.to_dict() for r in rows), strict=True):
        graph = f"{data['graph']} ({data['decided_by']})" if data["decided_by"] else data["graph"]
        assert cells == (data["phase"], data["sizes"] or "-", graph, data["backend"] or "-", data["why"] or "-",
                         data["to_change"] or "-"), (cells, data)
        assert json.loads(json.dumps(data)) == data


def test_sglang_json_text_and_plan_agree_on_every_recorded_cell() -> None:
    _, recorded = sglang_recording.load()
    counts: collections.Counter[str] = collections.Counter()
    for case, engine in recorded.items():
        try:
            config = sglang.from_server_args(case.args(), model=case.model, platform=case.platform)
        except ValueError:
            counts["adapter refuses"] += 1
            continue
        result = config.plan(case.platform)
        rows = config.outcome(result.platform, result)
        _same(rows)
        by_phase = {row.phase: row for row in rows}
        assert list(by_phase) == [p.value for p in result.phases]
        for phase, decision in result.phases.items():
            row = by_phase[phase.value]
            if row.by == "attnhal's plan":  # the plan's own verdict, with its sizes
                assert (row.graph == "captured") == decision.capture
                assert row.capture_sizes == (tuple(decision.capture_sizes) if decision.capture else ())
            elif row.by == "late failure":  # SGLang starts, then fails on this phase; attnhal's plan refuses it
                assert row.graph in ("fails at start", "fails later") and decision.blocking
                assert row.why.startswith("late failure (docs/catalog.md, Late failures")
                counts["late failures said"] += 1
            else:  # SGLang's catalogued rule: eager where attnhal's plan captures, enforce captures it
                assert row.by == "SGLang" and row.graph == "eager" and decision.capture
                assert row.change == "ATTNHAL_SGLANG_GRAPHS=enforce" and "docs/catalog.md D" in row.why
        if not engine.accepted or not result.valid:
            counts["refused or invalid"] += 1
            continue
        captured = frozenset(p for p in sglang_grid.SPEC_PHASES if by_phase[p].graph == "captured")
        assert captured == engine.captured, f"{case}: outcome {sorted(captured)}, SGLang {sorted(engine.captured)}"
        counts["engine outcome = SGLang's executed captures"] += 1
    assert counts["engine outcome = SGLang's executed captures"] > 1000 and counts["late failures said"], counts


def test_the_sglang_plugins_log_says_what_the_report_said_on_every_recorded_cell() -> None:
    """The plugin's start-up report (:func:`~attnhal_sglang.report.server_rows`, from SGLang's own
    verdicts of the draft phases it audits: here the recorded ones) and the report before launch
    (:func:`~attnhal_sglang.report.plan_rows`) give each phase the same graph, and for a phase
    SGLang's rule leaves eager the same catalogue entry and switch."""
    from attnhal_sglang.audit import Verdict, audit, engine_differs
    from attnhal_sglang.report import plan_rows, server_rows

    _, recorded = sglang_recording.load()
    compared = 0
    for case, engine in recorded.items():
        if not engine.accepted:
            continue
        try:
            config = sglang.from_server_args(case.args(), model=case.model, platform=case.platform)
        except ValueError:
            continue
        result = config.plan(case.platform)
        if not result.valid:
            continue
        verdicts = {phase: (Verdict.NOT_RUN if phase not in engine.runs else
                            Verdict.CAPTURED if phase in engine.captured else Verdict.EAGER)
                    for phase in (Phase.DRAFT_DECODE, Phase.DRAFT_EXTEND)}
        differs = engine_differs(config, case.platform)
        names = {Phase(role): name for role, name in config.roles.items()}
        logged = server_rows(result, audit(result, verdicts, names=names, applicable=differs))
        before = plan_rows(result, differs)
        for at_start, at_plan in zip(logged, before, strict=True):
            assert (at_start.phase, at_start.graph) == (at_plan.phase, at_plan.graph), (case, at_start, at_plan)
            if at_plan.by == "SGLang":
                assert (at_start.why, at_start.change) == (at_plan.why, at_plan.change), (case, at_start, at_plan)
        compared += 1
    assert compared > 1000


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_vllm_json_and_text_agree_on_every_recorded_cell(release: str) -> None:
    cells = 0
    for case, config in _vllm_configs(release):
        result = config.plan(case.platform)
        _same(config.outcome(result.platform, result))
        cells += 1
    assert cells >= 280


def test_the_exit_status_says_whether_sglangs_executed_outcome_is_attnhals_plan() -> None:
    """On every recorded cell SGLang starts with and attnhal plans valid, ``plan --engine``'s status
    is 4 exactly where SGLang's executed code captures other draft phases than attnhal's plan
    (and 0 where the same): the exit status answers the question from the engine's own code."""
    _, recorded = sglang_recording.load()
    statuses: collections.Counter[int] = collections.Counter()
    for case, engine in recorded.items():
        try:
            config = sglang.from_server_args(case.args(), model=case.model, platform=case.platform)
        except ValueError:
            continue
        result = config.plan(case.platform)
        status = engine_status(config, result, config.outcome(result.platform, result))
        statuses[status] += 1
        if not result.valid:
            assert status == 1, case
            continue
        if not engine.accepted:
            continue
        planned = frozenset(p for p in sglang_grid.SPEC_PHASES if result.phases[Phase(p)].capture)
        assert status == (OUTCOME_DIFFERS if planned != engine.captured else 0), (case, status, engine.captured)
    assert statuses[0] > 500 and statuses[OUTCOME_DIFFERS] > 50 and statuses[1] > 500, statuses


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_vllms_exit_status_on_every_recorded_cell(release: str) -> None:
    """vLLM: attnhal's plan follows vLLM's resolved mode and drafter (it has no enforce), so a valid
    plan vLLM starts with exits 0 on every recorded cell, and 1 where the plan cannot run or vLLM
    refuses the mode."""
    statuses: collections.Counter[int] = collections.Counter()
    for case, config in _vllm_configs(release):
        result = config.plan(case.platform)
        status = engine_status(config, result, config.outcome(result.platform, result))
        assert status == (0 if result.valid and config.refusal() is None else 1), (case, status)
        statuses[status] += 1
    assert statuses[0] > 100 and statuses[1] > 50, statuses


def test_the_seed_exits_4_and_a_cell_sglang_captures_exits_0(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", "--engine", "sglang", "--json", "--", *SEED]) == OUTCOME_DIFFERS
    assert json.loads(capsys.readouterr().out)["outcome_differs"] == ["draft_extend"]
    two_steps = [*SEED]
    two_steps[two_steps.index("--speculative-num-steps") + 1] = "2"
    two_steps[two_steps.index("--speculative-num-draft-tokens") + 1] = "3"
    assert main(["plan", "--engine", "sglang", "--json", "--", *two_steps]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["outcome_differs"] == [] and all(
        row["captured"] == data["plan"]["phases"][row["phase"]]["capture"] for row in data["engine_outcome"])


def _plugin_tables(release: str, case: vllm_recording.Case, engine: vllm_recording.Outcome, query_len: int,
                   requested: Any, caplog: pytest.LogCaptureFixture,
                   monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The vLLM plugin's start-up tables for a server whose vLLM decided ``engine`` (the recording):
    the plugin's own steps (:func:`~attnhal_vllm.startup.at_start` when vLLM resolved the mode,
    :func:`~attnhal_vllm.startup.at_drafter` when it set up the drafter), as logged, read back."""
    from attnhal_vllm import startup
    from attnhal_vllm.audit import GroupLevel
    from attnhal_vllm.drafter import observed
    from attnhal_vllm.modes import CGSupport, GraphMode

    from attnhal.platform import parse

    monkeypatch.setattr(startup, "_REPORTED", [])  # a fresh server; the process's own state is restored after
    monkeypatch.setattr(startup, "_STARTED", [])
    monkeypatch.delenv(startup.MODE_VAR, raising=False)
    caplog.clear()
    groups = [GroupLevel(0, case.backend, CGSupport[engine.support or "NEVER"], "FullAttentionSpec")]
    resolved = GraphMode(engine.mode) if engine.mode else None
    with caplog.at_level(logging.INFO, logger="vllm.attnhal"):
        startup.at_start(groups, requested, resolved, query_len, True, (1, 2, 4, 8), engine.error,
                         parse(case.platform))
        if engine.drafter is not None and resolved is not None:
            drafter = observed(release, resolved, engine.drafter, engine.runner or "V2")
            startup.at_drafter(drafter, resolved, vllm_recording.SPEC_TOKENS > 1)
    tables = [r.getMessage().removeprefix("attnhal: ") for r in caplog.records if "graph report" in r.getMessage()]
    return [row for table in tables for row in _table(table)]


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_the_vllm_plugins_lines_are_the_report_on_every_recorded_cell(release: str, caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's start-up tables, fed what vLLM decided on each recorded cell, say per phase what
    ``attnhal plan --engine vllm``'s report and JSON say (the capture sizes aside: known at start only);
    the draft_extend row is captured exactly where vLLM's drafter captured its prefill (recorded)."""
    compared = extends = 0
    for case, config in _vllm_configs(release):
        engine = _recorded(release)[case]
        if engine.refused:  # vLLM refuses the backend for the arch: no server, no plugin line
            continue
        result = config.plan(case.platform)
        rows = config.outcome(result.platform, result)
        logged = _plugin_tables(release, case, engine, config.query_len, config.resolution.requested, caplog,
                                monkeypatch)
        assert [cells[0] for cells in logged] == [row.phase for row in rows], (case, logged, rows)
        for cells, row in zip(logged, rows, strict=True):
            data = row.to_dict()
            assert (cells[2], cells[3], cells[5]) == (data["graph"], data["backend"], data["to_change"] or "-"), case
            assert (cells[1] == "-") == (data["sizes"] is None), (case, cells, data)
            if row.graph != "refused":  # vLLM's refusal is vLLM's own message in the plugin's line
                assert cells[4] == (data["why"] or "-"), (case, cells, data)
            if row.phase == "draft_extend":
                assert row.captured == (engine.draft_extend == "captured") == result[Phase.DRAFT_EXTEND].capture
                extends += 1
        compared += 1
    assert compared >= 200 and extends >= 40, (compared, extends)


def test_the_seeds_json_says_draft_extend_eager_by_sglang_and_enforce_captures_it(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["plan", "--engine", "sglang", "--json", "--", *SEED]) == OUTCOME_DIFFERS
    data = json.loads(capsys.readouterr().out)
    extend = next(row for row in data["engine_outcome"] if row["phase"] == "draft_extend")
    assert (extend["graph"], extend["decided_by"], extend["to_change"]) == ("eager", "SGLang",
                                                                           "ATTNHAL_SGLANG_GRAPHS=enforce")
    assert "docs/catalog.md D1" in extend["why"]
    assert data["plan"]["phases"]["draft_extend"]["capture"] is True  # attnhal's own plan, named apart
    assert main(["plan", "--engine", "sglang", "--", *SEED]) == OUTCOME_DIFFERS
    text = capsys.readouterr().out
    assert "outcome: what the engine will do differs from attnhal's plan: draft_extend eager (SGLang)" in text
    line = next(l for l in text.splitlines() if l.startswith("draft_extend") and "(SGLang)" in l)
    assert "eager (SGLang)" in line and line.endswith("ATTNHAL_SGLANG_GRAPHS=enforce")
