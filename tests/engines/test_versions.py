"""The supported engine releases: one table from the adapters, printed by ``attnhal info``, and the
one plugin rule on another release (audit only, said once)."""

from __future__ import annotations

import json
import logging
import types

import pytest

from attnhal.cli import main
from attnhal.engines import plugin_gate, registry, versions


def test_the_table_is_the_adapters_data_and_says_what_is_installed() -> None:
    installed = {"sglang": "0.5.23", "vllm": "0.99.0"}.get
    rows = {row.engine: row for row in versions.table(installed)}
    assert rows["sglang"].supported == registry.get("sglang").versions == ("0.5.23",)
    assert rows["vllm"].supported == registry.get("vllm").versions
    assert (rows["sglang"].status, rows["vllm"].status) == ("supported", "another release: the plugin stays off")
    assert [r.status for r in versions.table(lambda name: None)] == ["not installed"] * len(rows)
    assert rows["vllm"].to_dict()["installed"] == "0.99.0"


def test_an_adapter_without_versions_supports_its_version() -> None:
    bare = types.SimpleNamespace(name="x", version="1.0")
    assert versions.supported(bare) == ("1.0",)


def test_plugin_mode_is_one_rule_for_both_plugins(caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin_gate, "_said", set())
    log = logging.getLogger("attnhal.test.gate")
    assert plugin_gate.plugin_mode("E", "1.0", ("1.0",), None, "V", log) is None
    assert plugin_gate.plugin_mode("E", "2.0", ("1.0",), "off", "V", log) is None
    assert plugin_gate.plugin_mode("E", "1.0", ("1.0",), "enforce", "V", log) == "enforce"
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert plugin_gate.plugin_mode("E", "2.0", ("1.0", "1.1"), "enforce", "V", log) == "audit"
        assert plugin_gate.plugin_mode("E", "2.0", ("1.0", "1.1"), "audit", "V", log) == "audit"
        assert plugin_gate.plugin_mode("E", None, ("1.0",), "audit", "V", log) is None
        assert plugin_gate.plugin_mode("E", None, ("1.0",), "audit", "V", log) is None
    assert [r.getMessage() for r in caplog.records] == [
        "attnhal: E 2.0 is installed; attnhal's plugin is tested against E 1.0, 1.1: it audits only "
        "(V=enforce needs a tested release; V=off silences this)",
        "attnhal: E is not installed here: the plugin stays off"]


def test_info_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--platform", "cuda:sm90"]) == 0
    out = capsys.readouterr().out
    assert "engines (what each plugin does on a release not listed as supported: its status):" in out
    assert any(line.split()[:2] == ["sglang", "0.5.23"] for line in out.splitlines())
    assert main(["info", "--platform", "cuda:sm90", "--json"]) == 0
    engines = json.loads(capsys.readouterr().out)["engines"]
    assert [e["engine"] for e in engines] == registry.names()
