"""attnhal's vLLM plugin inside vLLM 0.33.0 or 0.34.0: loaded by vLLM's own ``load_general_plugins()``
from the entry point installed in this environment, then vLLM's real mode resolution executed as in
``test_vllm_executed.py`` (emulated SM90/SM100) on the runner vLLM selects (``harness.resolve``): the
V2 runner's steps (0.33's default, 0.34's only) and, on 0.33, the V1 runner's
``_check_and_update_cudagraph_mode`` (``VLLM_USE_V2_MODEL_RUNNER=0``)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
from engine_tier import installed_entry_point
from entry_point_overlay import overlay
import pytest
from tier_summary import LINES as SUMMARY

from attnhal_vllm import plugin, startup

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
#: How the start-up graph report begins; the last loaded() block's reports are kept in REPORTS.
REPORT = "attnhal: attnhal graph report: "
REPORTS: list[str] = []


def _targets() -> list[tuple[Any, str]]:
    """(owner, attribute) of every function the plugin wraps in the installed vLLM release."""
    import importlib

    out = []
    for target in plugin.RELEASES[harness.release()]:
        module = importlib.import_module(target.module)
        out.append((getattr(module, target.owner) if target.owner else module, target.name))
    return out


def _target() -> tuple[Any, str]:
    """The mode resolution: the wrapper every V2 cell goes through."""
    kinds = [t.kind for t in plugin.RELEASES[harness.release()]]
    return _targets()[kinds.index("resolution")]


#: The runners each release's grid runs on: ``VLLM_USE_V2_MODEL_RUNNER`` (None: unset, vLLM's own choice).
RUNNER_ENVS: tuple[str | None, ...] = (None,) if harness.V2_RUNNER[harness.release()] else (None, "0")


def _wrapped() -> bool:
    return all(getattr(vars(owner)[name], "__attnhal_audit__", False) for owner, name in _targets())


def _original(owner: Any, name: str) -> Any:
    """vLLM's own function, under any wrapper of the plugin (vLLM itself loads its general plugins
    while it builds a config, so the tier process has the plugin before these tests load it)."""
    method = vars(owner)[name]
    while getattr(method, "__attnhal_audit__", False):
        method = method.__wrapped__
    return method


@pytest.fixture(autouse=True, scope="module")
def unwrapped() -> Iterator[None]:
    """These tests compare vLLM with and without the plugin: vLLM's functions unwrapped between loads."""
    current = [(owner, name, vars(owner)[name]) for owner, name in _targets()]
    for owner, name, _ in current:
        setattr(owner, name, _original(owner, name))
    yield
    for owner, name, function in current:
        setattr(owner, name, function)


@contextlib.contextmanager
def loaded(mode: str | None = None) -> Iterator[list[str]]:
    """vLLM's ``load_general_plugins()`` with ``ATTNHAL_VLLM=mode`` (None: unset), only attnhal's
    plugin allowed; yields the plugin's log lines; the wrapper and vLLM's load-once flag undone after."""
    from vllm import plugins

    originals = [(owner, name, _original(owner, name)) for owner, name in _targets()]
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(plugin.LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    old = {var: os.environ.get(var) for var in (plugin.ENV_VAR, "VLLM_PLUGINS")}
    os.environ["VLLM_PLUGINS"] = "attnhal"
    if mode is None:
        os.environ.pop(plugin.ENV_VAR, None)
    else:
        os.environ[plugin.ENV_VAR] = mode
    plugins.plugins_loaded = False
    startup._REPORTED.clear()  # a fresh server: the graph report comes once, with the first resolution
    lines: list[str] = []
    try:
        with overlay():  # this clone's entry points, whoever reinstalled the shared environment last
            plugins.load_general_plugins()
        yield lines
    finally:
        lines.extend(r.getMessage() for r in records if not r.getMessage().startswith(REPORT))
        REPORTS[:] = [r.getMessage() for r in records if r.getMessage().startswith(REPORT)]
        plugins.plugins_loaded = False
        for owner, name, original in originals:
            setattr(owner, name, original)
        logger.removeHandler(handler)
        logger.setLevel(level)
        for var, value in old.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


@contextlib.contextmanager
def _platform(platform: str) -> Iterator[None]:
    """attnhal.detect() answers the emulated platform (where the plugin reads attnhal's levels)."""
    os.environ["ATTNHAL_PLATFORM"] = platform
    try:
        yield
    finally:
        os.environ.pop("ATTNHAL_PLATFORM", None)


def _resolve(backend: str, model: str, speculative: dict[str, Any] | None, platform: str,
             mode: str | None = None, runner_env: str | None = None) -> harness.Resolution:
    with _platform(platform):
        return harness.resolve(harness.engine_config(backend, model, speculative, mode), backend, platform,
                               runner_env)


def test_the_entry_point_is_installed_in_this_environment() -> None:
    assert installed_entry_point("vllm.general_plugins", "vllm").load() is plugin.register


def test_attnhal_plan_models_the_installed_release_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    """With vLLM installed, ``attnhal plan --engine vllm`` models that release and says so."""
    from attnhal.cli import main

    assert main(["plan", "--engine", "vllm", "--platform", "cuda:sm90", "--", "--attention-backend", "TRITON_ATTN",
                 "--spec-method", "eagle", "--spec-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"engine: vLLM {harness.release()} (installed) -> vllm:TRITON_ATTN"), out[:200]
    assert f"attnhal graph report (before launch): vLLM {harness.release()} on cuda:sm90" in out


def test_load_general_plugins_wraps_the_mode_check_once_and_off_does_not() -> None:
    with loaded():
        assert _wrapped()
        plugin.register()  # vLLM may load plugins again in the same process
        cls, name = _target()
        assert not getattr(vars(cls)[name].__wrapped__, "__attnhal_audit__", False)
    assert not _wrapped()
    with loaded("off"):
        assert not _wrapped()


def test_another_vllm_release_gets_one_warning_and_no_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    """An untested release: the plugin knows no code of it to hook; one warning per process says so."""
    from attnhal.engines import plugin_gate

    monkeypatch.setattr(plugin, "installed_vllm", lambda: "0.99.0")
    monkeypatch.setattr(plugin_gate, "_said", set())
    with loaded() as lines:
        assert not _wrapped()
    with loaded() as again:
        assert not _wrapped()
    assert lines == ["attnhal: vLLM 0.99.0 is installed; attnhal's plugin is tested against vLLM 0.33.0, 0.34.0: it "
                     "stays off (ATTNHAL_VLLM=off silences this)"]
    assert again == []


def test_flashinfer_with_speculation_on_sm90_names_the_downgrade_and_its_cause() -> None:
    without = _resolve("FLASHINFER", "mha", NGRAM, "cuda:sm90")
    with loaded() as lines:
        with_plugin = _resolve("FLASHINFER", "mha", NGRAM, "cuda:sm90")
    assert with_plugin == without and (without.support, without.mode) == ("UNIFORM_SINGLE_TOKEN_DECODE", "PIECEWISE")
    assert lines[:4] == [
        "attnhal: attention groups: FLASHINFER UNIFORM_SINGLE_TOKEN_DECODE (KV-cache group 0, FullAttentionSpec)",
        "attnhal: level UNIFORM_SINGLE_TOKEN_DECODE, set by FLASHINFER (KV-cache group 0, FullAttentionSpec)",
        "attnhal: cudagraph_mode: FULL_AND_PIECEWISE -> PIECEWISE",
        "attnhal: downgrade FULL_AND_PIECEWISE -> PIECEWISE: spec decode (query len 4) needs UNIFORM_BATCH "
        "(support: UNIFORM_SINGLE_TOKEN_DECODE)"]
    assert lines[4].startswith("attnhal: differs: attnhal reads vllm:FLASHINFER as UNIFORM_BATCH (trtllm-gen decode "
                               "on sm90; assumes trtllm-gen cubins available: flashinfer-cubin installed or NVIDIA's "
                               "artifactory reachable")
    assert len(lines) == 5, lines
    SUMMARY.append("vLLM plugin, FLASHINFER + ngram (3 tokens), SM90:")
    SUMMARY.extend(f"  {line}" for line in lines)


def test_the_report_comes_once_per_server_and_strict_refuses_the_flashinfer_downgrade() -> None:
    from attnhal.engines.report import StrictRefusal

    with loaded():
        _resolve("FLASHINFER", "mha", NGRAM, "cuda:sm90")
        _resolve("TRITON_ATTN", "mha", NGRAM, "cuda:sm90")
    assert len(REPORTS) == 1, REPORTS
    rows = REPORTS[0].removeprefix("attnhal: ").splitlines()
    assert rows[0] == "attnhal graph report: vLLM on cuda:sm90"
    assert [row.split()[0] for row in rows[2:]] == ["prefill+decode", "target_verify"]  # no decode: ngram verifies
    assert all("  piecewise  " in row for row in rows[2:]), rows  # after the sizes ("1..512 (51 sizes)")
    SUMMARY.append("vLLM plugin, FLASHINFER + ngram (3 tokens), SM90, the start-up graph report:")
    SUMMARY.extend(f"  {row}" for row in rows)
    with loaded("strict"):
        with pytest.raises(StrictRefusal, match="ATTNHAL_VLLM=strict refuses to start: attnhal plans decode"):
            _resolve("FLASHINFER", "mha", NGRAM, "cuda:sm90")
        assert _resolve("TRITON_ATTN", "mha", NGRAM, "cuda:sm90").mode == "FULL_AND_PIECEWISE"  # agrees: starts


def test_a_mode_vllm_refuses_is_explained_and_still_refused() -> None:
    """CPU_ATTN's builder grades NEVER: vLLM refuses a requested FULL (ValueError) with the plugin too."""
    without = _resolve("CPU_ATTN", "mha", None, "cuda:sm90", "FULL")
    with loaded() as lines:
        with_plugin = _resolve("CPU_ATTN", "mha", None, "cuda:sm90", "FULL")
    assert with_plugin == without and without.error is not None and without.error.startswith("ValueError: ")
    assert lines[:3] == ["attnhal: attention groups: CPU_ATTN NEVER (KV-cache group 0, FullAttentionSpec)",
                         "attnhal: level NEVER, set by CPU_ATTN (KV-cache group 0, FullAttentionSpec)",
                         f"attnhal: cudagraph_mode: FULL -> refused ({without.error.removeprefix('ValueError: ')})"]


def test_an_error_inside_the_wrapper_leaves_vllms_resolution_and_is_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal_vllm import audit

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("attnhal broke")

    monkeypatch.setattr(audit, "audit_mode", broken)
    without = _resolve("TRITON_ATTN", "mha", NGRAM, "cuda:sm90")
    with loaded() as lines:
        assert _resolve("TRITON_ATTN", "mha", NGRAM, "cuda:sm90") == without
    assert lines == ["attnhal: explaining vLLM's cudagraph_mode failed; vLLM's resolution stands"]


def _cells() -> list[tuple[str, str, str, str | None, str, str | None]]:
    """(backend, model, speculation, requested mode, platform, runner switch): every catalogued CUDA
    backend of vLLM whose builder imports here (not ``harness.NOT_REACHED``) with eagle (3 tokens) and
    ngram, vLLM's default mode and FULL, on SM90 and SM100, on each runner of the release."""
    from attnhal import catalog

    out = []
    for entry in catalog.entries("vllm"):
        if "cuda" not in {v.value for v in entry.descriptor.vendors} or entry.name in harness.NOT_REACHED:
            continue
        model = next(m.value for m in entry.descriptor.models if m.value in ("mha", "mla"))
        for spec in ("eagle", "ngram"):
            for mode in (None, "FULL"):
                for platform in ("cuda:sm90", "cuda:sm100"):
                    out.extend((entry.name, model, spec, mode, platform, env) for env in RUNNER_ENVS)
    return out


def _outcome(backend: str, model: str, spec: str, mode: str | None, platform: str,
             runner_env: str | None = None) -> harness.Resolution:
    speculative: dict[str, Any] = dict(NGRAM) if spec == "ngram" else {
        "method": "eagle", "num_speculative_tokens": 3, "model": harness.model_dir(model)}
    return _resolve(backend, model, speculative, platform, mode, runner_env)


def test_no_vllm_decision_changes_on_the_grid() -> None:
    cells = _cells()
    without = {cell: _outcome(*cell) for cell in cells}
    with loaded() as lines:
        with_plugin = {cell: _outcome(*cell) for cell in cells}
    changed = [cell for cell in cells if with_plugin[cell] != without[cell]]
    assert not changed, changed
    reached = len(cells)
    assert sum(line.startswith("attnhal: cudagraph_mode: ") for line in lines) == reached >= 80, (reached, lines)
    assert not any("failed" in line for line in lines), [line for line in lines if "failed" in line]
    SUMMARY.append(f"vLLM plugin grid: {len(cells)} cells, no decision changed, "
                   f"{sum(line.startswith('attnhal: differs') for line in lines)} differences logged")


@pytest.mark.parametrize("runner_env", RUNNER_ENVS)
def test_the_drafters_mode_is_logged_with_its_runners_reason(runner_env: str | None) -> None:
    """The drafter of the runner vLLM selects (V1, 0.33 with VLLM_USE_V2_MODEL_RUNNER=0: the proposer's
    dispatcher; V2: the speculator's decode graph manager) as vLLM set it up, with the reason attnhal's
    rule for that runner gives; the draft prefill's mode too on V2."""
    with loaded() as lines:
        resolution = _outcome("TRITON_ATTN", "mha", "eagle", None, "cuda:sm90", runner_env)
    drafted = [line for line in lines if line.startswith("attnhal: drafter ")]
    expected = ("draft decode PIECEWISE (the target's mixed mode is PIECEWISE; the V1 runner's drafter"
                if runner_env == "0" else "draft decode FULL_DECODE_ONLY (the target's decode graphs are FULL)")
    assert resolution.runner == ("V1" if runner_env == "0" else "V2")
    assert resolution.drafter in expected and len(drafted) == 1 and expected in drafted[0], drafted
    assert "differs" not in drafted[0]
    assert drafted[0].endswith("; draft prefill FULL_AND_PIECEWISE") is (runner_env is None), drafted[0]
    assert sum(line.startswith("attnhal: cudagraph_mode: ") for line in lines) == 1, lines  # one runner reports
    SUMMARY.append(f"vLLM plugin, TRITON_ATTN + eagle, SM90, {resolution.runner} runner: {drafted[0]}")


def _rows(table: str) -> list[list[str]]:
    """A logged table's rows, cells split at the column gaps (two spaces or more)."""
    return [re.split(r"\s{2,}", line.strip()) for line in table.removeprefix("attnhal: ").splitlines()[2:]]


@pytest.mark.parametrize("runner_env", RUNNER_ENVS)
def test_the_executed_plugins_tables_are_attnhal_plans_report(runner_env: str | None) -> None:
    """Inside vLLM's executed code the plugin logs two tables (the target's at the mode resolution,
    the drafter's when vLLM set the drafter up); their rows are the rows ``attnhal plan --engine vllm``
    prints and puts in ``engine_outcome`` for the same flags, the capture sizes aside (known at start)."""
    import attnhal_vllm

    with loaded():
        _outcome("TRITON_ATTN", "mha", "eagle", None, "cuda:sm90", runner_env)
    assert [r.splitlines()[0] for r in REPORTS] == [f"{REPORT}vLLM on cuda:sm90", f"{REPORT}vLLM on cuda:sm90, the drafter"]
    logged = [row for report in REPORTS for row in _rows(report)]
    config = attnhal_vllm.from_engine_args(
        {"attention_backend": "TRITON_ATTN", "speculative_config": '{"method": "eagle", "num_speculative_tokens": 3}'},
        "cuda:sm90", model="mha", version=harness.release(),
        env={"VLLM_USE_V2_MODEL_RUNNER": runner_env} if runner_env is not None else {})
    result = config.plan("cuda:sm90")
    planned = [row.cells() for row in config.outcome(result.platform, result)]
    assert [(r[0], *r[2:]) for r in logged] == [(r[0], *r[2:]) for r in planned], (logged, planned)
    assert [r[0] for r in logged] == ["prefill+decode", "target_verify", "draft_decode", "draft_extend"]
    SUMMARY.append(f"vLLM plugin, TRITON_ATTN + eagle, SM90, {runner_env or 'default'} runner: the tables' rows = "
                   "attnhal plan's report: " + "; ".join(f"{r[0]} {r[2]}" for r in logged))


def test_the_docs_show_the_lines_these_tests_check() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "engines" / "vllm.md").read_text(encoding="utf-8")
    assert ("attnhal: downgrade FULL_AND_PIECEWISE -> PIECEWISE: spec decode (query len 4) needs UNIFORM_BATCH "
            "(support: UNIFORM_SINGLE_TOKEN_DECODE)") in text

