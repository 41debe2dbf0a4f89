"""attnhal's SGLang plugin inside SGLang 0.5.23: loaded by SGLang's own ``load_plugins()`` from the
entry point installed in this environment, then SGLang's real ``_capture_cuda_graphs`` executed
as in ``test_sglang_executed.py`` (emulated platforms, recorder runner classes).

- ``enforce``: the seed configuration on HIP builds a draft-extend runner of SGLang's own class;
  CUDA and HIP decide alike for the catalogued backends that run on both; every other cell of
  the grid keeps SGLang's decision, or changes exactly where a D-entry says SGLang is wrong.
- ``audit``: no decision changes on the grid; the log lines name the phases and the D-entries.
- the version guard, ``off``, ``SGLANG_PLUGINS`` filtering, and an error inside the hook (SGLang's
  own decision stands, the error is logged).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sglang_grid as grid
import harness
from engine_tier import installed_entry_point
from entry_point_overlay import overlay
import pytest
from sglang_grid import Case
from tier_summary import LINES as SUMMARY

from attnhal_sglang import plugin

EXTEND_RUNNER = "EAGLEDraftExtendCudaGraphRunner"
DECODE_RUNNER = "EAGLEDraftCudaGraphRunner"
SEED = Case("aiter", "hip:gfx942", "mha", 1, 1)
#: The start-up line of ``attnhal advise`` (``every_phase_line``), where SGLang leaves a phase eager.
ADVICE = "a combination that captures every phase here: "
NO_ADVICE = "no combination of attention-backend flags captures every phase here"
#: The seed's difference, as the plugin logs it: docs/catalog.md's entry and the catalogue's note.
D1 = ("differs: docs/catalog.md D1 (sglang:aiter): draft_extend on HIP with num_steps 1: SGLang 0.5.23 runs it "
      "eagerly, its HIP branch reads the draft-decode backend (speculative/eagle_worker_v2.py:546-565; "
      "draft_utils.py:84-87)")


def _on_both_vendors() -> tuple[str, ...]:
    """Catalogued backends that run on CUDA and HIP and can capture draft extend (triton, dsa)."""
    from attnhal import catalog
    from attnhal.phases import Phase

    return tuple(e.name for e in catalog.entries("sglang")
                 if {"cuda", "hip"} <= {v.value for v in e.descriptor.vendors} and Phase.DRAFT_EXTEND in e.descriptor.graph)


BOTH_VENDORS = _on_both_vendors()


def _hooked_methods() -> dict[str, Any]:
    """The hook targets' current function objects (to restore after a test's plugin load)."""
    import pkgutil

    out = {}
    for target in plugin.HOOKS:
        owner, _, name = target.rpartition(".")
        out[target] = (pkgutil.resolve_name(owner), name, vars(pkgutil.resolve_name(owner))[name])
    return out


@contextlib.contextmanager
def loaded(mode: str | None = "audit", **env: str) -> Iterator[None]:
    """SGLang's ``load_plugins()`` with ``ATTNHAL_SGLANG_GRAPHS=mode`` (None: unset) and ``env``;
    the hooks and SGLang's load-once flag undone afterwards."""
    from sglang.srt import plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved = _hooked_methods()
    values = {plugin.MODE_VAR: mode, **env}
    old = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    HookRegistry.reset()
    plugins._plugins_loaded = False
    try:
        with overlay():  # this clone's entry points, whoever reinstalled the shared environment last
            plugins.load_plugins()
        yield
    finally:
        HookRegistry.reset()
        plugins._plugins_loaded = False
        for owner, name, function in saved.values():
            setattr(owner, name, function)
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _hooks_applied() -> bool:
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    return hasattr(vars(EagleDraftWorker)["_capture_cuda_graphs"], "__wrapped__")


_RESOLVED: dict[Case, harness.Resolution] = {}


def _resolution(case: Case) -> harness.Resolution:
    if case not in _RESOLVED:
        _RESOLVED[case] = harness.resolve(case.args(), case.platform, case.model)
    return _RESOLVED[case]


def runners(case: Case) -> dict[str, str] | None:
    """The graph runners SGLang's draft worker builds for ``case`` (None: SGLang refuses it)."""
    resolution = _resolution(case)
    if not resolution.accepted:
        return None
    try:
        harness.target_backend(resolution, case.platform)
    except Exception:  # the target backend's creator refuses at startup (fa3 off SM80-SM90, ...)
        return None
    os.environ["ATTNHAL_PLATFORM"] = case.platform  # attnhal.detect() answers the emulated platform
    try:
        graphs = harness.draft_graphs(resolution, case.platform, worker=harness.WORKERS[case.algorithm])
    finally:
        os.environ.pop("ATTNHAL_PLATFORM", None)
    return None if graphs.error else dict(graphs.runners)


#: How the start-up graph report begins (one message: the title line, then the table).
REPORT = "attnhal: attnhal graph report: "


@pytest.fixture
def lines(caplog: pytest.LogCaptureFixture) -> Any:
    """The plugin's log lines since the last read, without the graph report (``reports=True``: only it)."""
    caplog.set_level(logging.INFO, logger=plugin.LOGGER)

    def read(reports: bool = False) -> list[str]:
        out = [r.getMessage() for r in caplog.records if r.name == plugin.LOGGER]
        caplog.clear()
        return [line for line in out if line.startswith(REPORT) is reports]

    return read


# --- installed, loaded by SGLang's loader -------------------------------------------------------------

def test_the_entry_point_is_installed_in_this_environment() -> None:
    import attnhal_hooks.sglang

    assert installed_entry_point("sglang.srt.plugins", "sglang").load() is attnhal_hooks.sglang.register


def test_load_plugins_registers_the_hooks_and_off_registers_none() -> None:
    with loaded("audit"):
        assert _hooks_applied()
    assert not _hooks_applied()
    with loaded("off"):
        assert not _hooks_applied()


def test_sglang_plugins_filters_attnhal_in_and_out(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="sglang.srt.plugins"):
        with loaded("enforce", SGLANG_PLUGINS="someone_else"):
            assert not _hooks_applied()
            assert runners(SEED) == {}
    assert "Skipping plugin attnhal (not in SGLANG_PLUGINS)" in caplog.text
    with loaded("enforce", SGLANG_PLUGINS="someone_else,attnhal"):
        assert _hooks_applied()


def test_another_sglang_release_audits_only_said_once(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """enforce on an untested release: the hooks run in audit mode (SGLang's decision kept:
    no draft-extend runner for the seed), and one warning says so, however often plugins load."""
    from attnhal.engines import plugin_gate

    monkeypatch.setattr(plugin, "installed_sglang", lambda: "0.5.24")
    monkeypatch.setattr(plugin_gate, "_said", set())
    with caplog.at_level(logging.WARNING, logger=plugin.LOGGER):
        for _ in range(2):
            with loaded("enforce"):
                assert _hooks_applied()
                assert runners(SEED) == {}
    warnings = [r.getMessage() for r in caplog.records if r.name == plugin.LOGGER and "installed" in r.getMessage()]
    assert warnings == ["attnhal: SGLang 0.5.24 is installed; attnhal's plugin is tested against SGLang 0.5.23: "
                        "it audits only (ATTNHAL_SGLANG_GRAPHS=enforce needs a tested release; "
                        "ATTNHAL_SGLANG_GRAPHS=off silences this)"]


# --- the seed ----------------------------------------------------------------------------------------------

def test_seed_audit_changes_nothing_and_names_d1(lines: Any) -> None:
    with loaded("audit"):
        assert runners(SEED) == {}
    found = lines()
    assert found == [
        "attnhal: audit: EagleDraftWorker on hip:gfx942: draft_decode: SGLang not run, attnhal not run "
        "([phase_not_run] " + found[0].split("([phase_not_run] ", 1)[1],
        f"attnhal: audit: EagleDraftWorker on hip:gfx942: draft_extend: SGLang eager, attnhal captured "
        f"(sglang:aiter); {D1}",
        "attnhal: audit: EagleDraftWorker on hip:gfx942: a combination that captures every phase here: "
        "--speculative-num-steps 2 --speculative-num-draft-tokens 3 (instead of --speculative-num-steps 1 "
        "--speculative-num-draft-tokens 2; attnhal advise --engine sglang)"]
    assert found[0].endswith("; agree")
    SUMMARY.append("plugin, seed, audit:")
    SUMMARY.extend(f"  {line}" for line in found)


def test_seed_enforce_builds_sglangs_own_draft_extend_runner(lines: Any) -> None:
    from sglang.srt.speculative import eagle_worker_v2

    built: list[object] = []
    with loaded("enforce"):
        recorder_class = eagle_worker_v2.EAGLEDraftExtendCudaGraphRunner
        assert runners(SEED) == {"draft_extend": EXTEND_RUNNER}
        built.append(recorder_class)
    found = [line for line in lines() if ADVICE not in line]
    assert found[-1].endswith(f"{D1}; enforce: built {EXTEND_RUNNER} (SGLang's draft_extend runner on device 'cuda')")
    SUMMARY.append("plugin, seed, enforce:")
    SUMMARY.append(f"  {found[-1]}")


#: The seed's start-up report row, as logged (test_the_seed_report_is_one_table_per_server); the docs show it.
SEED_REPORT_ROW = ("draft_extend   -                 eager (SGLang)             sglang:aiter  docs/catalog.md D1 "
                   "(sglang:aiter): draft_extend on HIP with num_steps 1")


def test_the_seed_report_is_one_table_per_server(lines: Any) -> None:
    """Once per server: the first worker planned logs the table; the D1 row names the entry and the switch."""
    with loaded("audit"):
        runners(SEED)
        runners(SEED)
    reports = lines(reports=True)
    assert len(reports) == 1, reports
    table = reports[0].removeprefix("attnhal: ")
    rows = table.splitlines()
    assert rows[0] == "attnhal graph report: audit: EagleDraftWorker on hip:gfx942"
    assert rows[1].split() == ["phase", "capture", "sizes", "graph", "backend", "why", "to", "change", "it"]
    extend = next(row for row in rows if row.startswith("draft_extend"))
    assert extend.startswith(SEED_REPORT_ROW) and extend.endswith("ATTNHAL_SGLANG_GRAPHS=enforce"), extend
    assert [row.split()[0] for row in rows[2:]] == ["prefill", "decode", "draft_decode", "draft_extend",
                                                   "target_verify"]
    SUMMARY.append("plugin, seed, the start-up graph report:")
    SUMMARY.extend(f"  {row}" for row in rows)


def test_seed_strict_refuses_to_start_naming_d1(lines: Any) -> None:
    from attnhal.engines.report import StrictRefusal

    with loaded("strict"):
        with pytest.raises(StrictRefusal) as refused:
            runners(SEED)
    assert str(refused.value).startswith(
        "ATTNHAL_SGLANG_GRAPHS=strict refuses to start EagleDraftWorker on hip:gfx942: draft_extend: attnhal plans "
        "it captured, SGLang runs it eagerly (docs/catalog.md D1 (sglang:aiter): draft_extend on HIP with num_steps 1")
    assert str(refused.value).endswith("ATTNHAL_SGLANG_GRAPHS=enforce captures it with SGLang's own runner, "
                                       "ATTNHAL_SGLANG_GRAPHS=audit starts as SGLang decided")
    SUMMARY.append(f"plugin, seed, strict: {type(refused.value).__name__}: {refused.value}")


def test_strict_starts_where_sglang_captures_what_attnhal_plans(lines: Any) -> None:
    three = dataclasses.replace(SEED, num_steps=3)
    with loaded("strict"):
        assert runners(three) == {"draft_decode": DECODE_RUNNER, "draft_extend": EXTEND_RUNNER}
    assert all(line.endswith("; agree") for line in lines() if ADVICE not in line)


def test_a_descriptor_limit_keeps_sglangs_runner_from_being_built(monkeypatch: pytest.MonkeyPatch,
                                                                  lines: Any) -> None:
    """A backend whose descriptor claims no draft-extend graph (here: triton's, with that claim
    removed) is not captured under enforce where SGLang's allowlist would capture it."""
    import attnhal.catalog
    from attnhal.phases import Phase

    real = attnhal.catalog.load

    def load(name: str) -> Any:
        entry = real(name)
        if name != "sglang:triton":
            return entry
        graph = {p: g for p, g in entry.descriptor.graph.items() if p is not Phase.DRAFT_EXTEND}
        return dataclasses.replace(entry, descriptor=dataclasses.replace(entry.descriptor, graph=graph))

    case = Case("triton", "cuda:sm90", "mha", 3, 1)
    with loaded("enforce"):
        assert runners(case) == {"draft_decode": DECODE_RUNNER, "draft_extend": EXTEND_RUNNER}
        monkeypatch.setattr(attnhal.catalog, "load", load)
        lines()
        assert runners(case) == {"draft_decode": DECODE_RUNNER}
    found = lines()
    assert "draft_extend: SGLang captured, attnhal eager (sglang:triton, [graph_unsupported] " in found[-1]
    assert found[-1].endswith(f"; differs: not catalogued; enforce: {EXTEND_RUNNER} not built (the descriptor's "
                              "limit above)")


# --- what attnhal cannot plan, and errors inside the hook ------------------------------------------------------

def test_an_unknown_backend_class_is_left_to_sglang_with_one_warning(monkeypatch: pytest.MonkeyPatch,
                                                                      lines: Any) -> None:
    from attnhal_sglang import classes

    table = {k: v for k, v in classes.BACKEND_CLASSES.items() if "aiter" not in v}
    monkeypatch.setattr(classes, "BACKEND_CLASSES", table)
    with loaded("enforce"):
        assert runners(SEED) == {}
        assert runners(SEED) == {}
    assert lines() == ["attnhal: EagleDraftWorker: draft_extend backend class=sglang.srt.layers.attention."
                       "aiter_backend.AiterAttnBackend (supported: the classes of attnhal_sglang.classes."
                       "BACKEND_CLASSES and their subclasses); its graph decision is left to SGLang"]


def test_an_argument_the_adapter_does_not_model_is_left_to_sglang(lines: Any) -> None:
    """fa4's MXFP8 KV cache (SGLang takes it on SM100): attnhal models no mxfp8."""
    case = Case("fa4", "cuda:sm100", "mha", 1, 1)
    resolution = harness.resolve({**case.args(), "kv_cache_dtype": "mxfp8"}, case.platform, case.model)
    assert resolution.accepted, resolution.error
    os.environ["ATTNHAL_PLATFORM"] = case.platform
    try:
        sglang_decision = harness.draft_graphs(resolution, case.platform).runners
        with loaded("enforce"):
            assert harness.draft_graphs(resolution, case.platform).runners == sglang_decision
    finally:
        os.environ.pop("ATTNHAL_PLATFORM", None)
    assert lines() == ["attnhal: EagleDraftWorker: server argument --kv-cache-dtype='mxfp8' (supported: auto, bf16, "
                       "bfloat16, fp16, float16, fp8_e4m3, fp8_e5m2); its graph decision is left to SGLang"]


@pytest.mark.parametrize("mode", ["audit", "enforce"])
def test_an_error_in_planning_leaves_sglangs_decision_and_is_logged(mode: str, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("attnhal broke")

    monkeypatch.setattr(plugin, "plan_draft_worker", broken)
    with caplog.at_level(logging.ERROR, logger=plugin.LOGGER), loaded(mode):
        assert runners(SEED) == {}
        assert runners(Case("triton", "cuda:sm90", "mha", 3, 1)) == {"draft_decode": DECODE_RUNNER,
                                                                    "draft_extend": EXTEND_RUNNER}
    errors = [r for r in caplog.records if r.name == plugin.LOGGER and r.levelno == logging.ERROR]
    assert errors and "planning EagleDraftWorker failed; SGLang's own graph decision stands" in errors[0].getMessage()
    assert "RuntimeError: attnhal broke" in caplog.text  # with its traceback


def test_an_error_after_sglangs_decision_restores_it(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Under enforce with a descriptor limit, attnhal kept SGLang's runner from being built; when the
    hook then fails, SGLang's runner is built after all."""
    from attnhal_sglang import audit

    monkeypatch.setattr(plugin.EagleDraftHook, "_not_captured", lambda self, planned: frozenset({"draft_extend"}))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("audit broke")

    monkeypatch.setattr(audit, "audit", broken)
    with caplog.at_level(logging.ERROR, logger=plugin.LOGGER), loaded("enforce"):
        assert runners(Case("triton", "cuda:sm90", "mha", 3, 1)) == {"draft_decode": DECODE_RUNNER,
                                                                    "draft_extend": EXTEND_RUNNER}
    assert "SGLang's own decision stands" in caplog.text and "RuntimeError: audit broke" in caplog.text


# --- the workers attnhal does not model ----------------------------------------------------------------------

def test_multi_layer_eagle_and_frozen_kv_mtp_are_left_to_sglang_with_one_warning(lines: Any) -> None:
    args = {"attention_backend": "aiter", "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    multi = harness.resolve({**args, "enable_multi_layer_eagle": True}, "hip:gfx942", "mla")
    frozen = harness.resolve(args, "hip:gfx942", "mla")
    with loaded("enforce"):
        for _ in range(2):
            assert harness.multi_layer_eagle_graphs(multi, "hip:gfx942").runners == {
                "draft_extend": "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner"}
            assert harness.frozen_kv_mtp_graphs(frozen, "hip:gfx942").runners == {
                "draft_decode": "FrozenKVMTPCudaGraphRunner"}
    assert lines() == [
        "attnhal: MultiLayerEagleDraftWorker: multi-layer EAGLE is planned by attnhal (attnhal plan --engine "
        "sglang), not audited by its plugin; SGLang's graph decision (draft_extend captured) is left as it is",
        "attnhal: FrozenKVMTPDraftWorker: frozen-KV MTP is not modelled by attnhal; SGLang's graph decision "
        "(draft_decode captured) is left as it is"]


# --- the grid -------------------------------------------------------------------------------------------------

def _grid() -> list[Case]:
    """The executed grid's EAGLE-family cases (``grid.py``) on steps 1-3 and topk 1, 2, 4: every
    catalogued CUDA/HIP backend, platform, page size and model it serves; split backends;
    EAGLE3, NEXTN, STANDALONE."""
    cases = [c for c in grid.single_cases() if c.num_steps <= 3 and c.topk <= 4]
    return cases + list(grid.split_cases()) + list(grid.algorithm_cases())


GRID = _grid()


@pytest.fixture(scope="module")
def decisions() -> dict[Case, dict[str, dict[str, str] | None]]:
    """Per case: SGLang's runners without the plugin, under audit and under enforce, and the lines logged."""
    import platforms

    logger = logging.getLogger(plugin.LOGGER)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    out: dict[Case, dict[str, Any]] = collections.defaultdict(dict)
    try:
        for mode in (None, "audit", "enforce"):
            with loaded(mode or "off"):
                for platform in sorted({c.platform for c in GRID}):
                    with platforms.emulate(platform):
                        for case in (c for c in GRID if c.platform == platform):
                            records.clear()
                            out[case][mode or "sglang"] = runners(case)
                            out[case][f"{mode}-lines"] = [r.getMessage() for r in records]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    changed = sum(1 for d in out.values() if d["enforce"] != d["sglang"])
    SUMMARY.append(f"plugin grid: {len(out)} cases; enforce changed {changed}, audit changed "
                   f"{sum(1 for d in out.values() if d['audit'] != d['sglang'])}")
    return out


def _entries(found: list[str]) -> set[str]:
    """The catalogued entries the lines name (``D1``, ..., ``late failures``)."""
    import re

    text = "\n".join(found)
    return set(re.findall(r"docs/catalog\.md (D\d+) \(", text)) | (
        {"late failures"} if "docs/catalog.md, Late failures (" in text else set())


#: The catalogued causes of sglang_expected.py the plugin's lines name for the draft worker's phases.
DRAFT_ENTRIES = {"D1", "D2", "D7", "late failures"}


def test_audit_changes_no_decision_on_the_grid_and_its_lines_name_the_phases(decisions: Any) -> None:
    from sglang_expected import rules_for

    for case, seen in decisions.items():
        assert seen["audit"] == seen["sglang"], case
        if seen["sglang"] is None:
            continue
        found = [line for line in seen["audit-lines"]
                 if ADVICE not in line and NO_ADVICE not in line and not line.startswith(REPORT)]
        rules = rules_for(case)
        assert [line.split(": ")[3] for line in found] == ["draft_decode", "draft_extend"], (case, found)
        # The advice line comes where SGLang leaves a phase eager, and only there.
        eager = any("SGLang eager" in line for line in found)
        assert eager == any(ADVICE in line or NO_ADVICE in line for line in seen["audit-lines"]), (case, found)
        assert _entries(found) == {r.cause for r in rules} & DRAFT_ENTRIES, (case, found)
        if any("not catalogued" in line for line in found):  # only where the adapter is known to differ
            assert any(r.adapter for r in rules), (case, found)


def test_enforce_changes_the_grid_exactly_where_a_d_entry_says(decisions: Any) -> None:
    from sglang_expected import rules_for

    for case, seen in decisions.items():
        if seen["sglang"] is None:
            assert seen["enforce"] is None, case
            continue
        d_entries = {r.cause for r in rules_for(case)} & {"D1", "D2", "D7"}
        if d_entries:
            assert seen["enforce"] == {**seen["sglang"], "draft_extend": EXTEND_RUNNER}, case
            assert "draft_extend" not in seen["sglang"], case
            assert _entries(seen["enforce-lines"]) >= d_entries, (case, seen["enforce-lines"])
        else:
            assert seen["enforce"] == seen["sglang"], case


def test_enforce_decides_cuda_and_hip_alike_for_backends_on_both(decisions: Any) -> None:
    pairs = 0
    for case, seen in decisions.items():
        if case.backend in BOTH_VENDORS and case.platform == "hip:gfx942" and case.decode_backend is None:
            cuda = dataclasses.replace(case, platform="cuda:sm90")
            assert seen["enforce"] == decisions[cuda]["enforce"], case
            pairs += seen["enforce"] is not None
    assert set(BOTH_VENDORS) >= {"triton", "dsa"} and pairs >= 6, (BOTH_VENDORS, pairs)


def test_the_class_table_names_classes_sglang_has() -> None:
    import pkgutil

    from attnhal_sglang.classes import BACKEND_CLASSES

    for path in BACKEND_CLASSES:
        module, _, name = path.rpartition(".")
        assert isinstance(getattr(pkgutil.resolve_name(module), name), type), path


def test_the_docs_show_the_lines_these_tests_check() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "engines" / "sglang.md").read_text(encoding="utf-8")
    assert f"draft_extend: SGLang eager, attnhal captured (sglang:aiter); {D1}" in text
    assert f"enforce: built {EXTEND_RUNNER} (SGLang's draft_extend runner on device 'cuda')" in text
    assert SEED_REPORT_ROW in text and "ATTNHAL_SGLANG_GRAPHS=strict refuses to start EagleDraftWorker" in text


@pytest.mark.parametrize(("steps", "when"), [(3, "during the draft-extend graph capture at server start-up"),
                                             (1, "at the first draft extend")])
def test_strict_refuses_a_late_failure_before_sglang_captures(steps: int, when: str, lines: Any) -> None:
    """aiter with topk 2 on HIP: SGLang's argument checks accept it and its draft extend raises later
    (docs/catalog.md, Late failures): strict refuses to start, naming the entry and when it would fail,
    before SGLang's capture runs (with 3 steps that capture is where it would fail)."""
    from attnhal.engines.report import StrictRefusal

    with loaded("strict"):
        with pytest.raises(StrictRefusal) as refused:
            runners(dataclasses.replace(SEED, num_steps=steps, topk=2))
    text = str(refused.value)
    assert text.startswith("ATTNHAL_SGLANG_GRAPHS=strict refuses to start EagleDraftWorker on hip:gfx942: "
                           "draft_extend: late failure (docs/catalog.md, Late failures; sglang:aiter)"), text
    assert when in text and "--speculative-eagle-topk 1" in text, text
    SUMMARY.append(f"plugin, aiter topk 2, {steps} steps, strict: {text}")
