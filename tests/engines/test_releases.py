"""Releases by rule: a patch, pre- or post-release of a supported series is modelled as that
series' supported release (said in one line); another series is not (said once, as before)."""

from __future__ import annotations

import json
import logging

import pytest

from attnhal.cli import main
from attnhal.engines import plugin_gate, versions
from attnhal.engines.releases import modelled, release_numbers
from attnhal_vllm import config as vllm_config

VLLM = ("0.33.0", "0.34.0")


@pytest.mark.parametrize("given,release", [
    ("0.34.0", "0.34.0"), ("0.34.1", "0.34.0"), ("0.34.0rc1", "0.34.0"), ("v0.34.0", "0.34.0"),
    ("0.34", "0.34.0"), ("0.33.2.post1", "0.33.0"), ("0.34.0.dev3+cu129", "0.34.0"), ("0.33.0+cpu", "0.33.0"),
    ("0.35.0", None), ("0.3.40", None), ("1.34.0", None), ("latest", None), ("", None), (None, None),
])
def test_vllm_series_is_the_minor(given: str | None, release: str | None) -> None:
    same = modelled(given, VLLM, 2)
    assert (same.release if same else None) == release
    if same is not None:
        assert same.exact is (given == release) and (same.line("vLLM") == "") is same.exact


@pytest.mark.parametrize("given,release", [
    ("0.5.23", "0.5.23"), ("0.5.23.post1", "0.5.23"), ("0.5.23rc0", "0.5.23"), ("0.5.24", None), ("0.5.2", None),
])
def test_sglang_series_is_the_release(given: str, release: str | None) -> None:
    same = modelled(given, ("0.5.23",), 3)
    assert (same.release if same else None) == release


def test_release_numbers_read_pep440() -> None:
    assert release_numbers("v0.34.0rc1") == (0, 34, 0) and release_numbers("0.5.23.post1") == (0, 5, 23)
    assert release_numbers("0.34.x") is None and release_numbers("nightly") is None


def test_the_plugin_gate_runs_a_patch_in_the_mode_asked_with_one_line(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin_gate, "_said", set())
    log = logging.getLogger("attnhal.test.releases")
    with caplog.at_level(logging.INFO, logger=log.name):
        for _ in range(2):
            assert plugin_gate.plugin_mode("vLLM", "0.34.1", VLLM, "strict", "V", log, other=None, digits=2) == "strict"
            assert plugin_gate.plugin_mode("vLLM", "0.35.0", VLLM, "strict", "V", log, other=None, digits=2) is None
    assert [r.getMessage() for r in caplog.records] == [
        "attnhal: vLLM 0.34.1 is modelled as vLLM 0.34.0 (the same series: a patch, pre- or post-release of a "
        "supported release is read by that release's rules)",
        "attnhal: vLLM 0.35.0 is installed; attnhal's plugin is tested against vLLM 0.33.0, 0.34.0: it stays off "
        "(V=off silences this)"]


def test_the_vllm_plugin_hooks_a_patch_release_as_its_minor(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal_vllm import plugin

    monkeypatch.setattr(plugin, "installed_vllm", lambda: "0.34.1")
    monkeypatch.setattr(plugin_gate, "_said", set())
    monkeypatch.setattr(plugin.sys, "meta_path", [f for f in plugin.sys.meta_path
                                                  if not isinstance(f, plugin._WrapOnImport)])
    plugin._register({})
    finders = [f for f in plugin.sys.meta_path if isinstance(f, plugin._WrapOnImport)]
    assert [tuple(f.targets) for f in finders] == [plugin.RELEASES["0.34.0"]]


@pytest.mark.parametrize("here,status", [("0.34.1", "supported as 0.34.0"), ("0.34.0", "supported"),
                                         ("0.35.0", "another release: the plugin stays off")])
def test_info_says_a_patch_is_supported_as_its_minor(here: str, status: str) -> None:
    rows = {row.engine: row for row in versions.table({"vllm": here, "sglang": "0.5.23.post1"}.get)}
    assert rows["vllm"].status == status and rows["sglang"].status == "supported as 0.5.23"


def test_plan_models_a_patch_release_and_says_so(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["plan", "--engine", "vllm", "--platform", "cuda:sm90", "--json", "--vllm-version", "0.34.1", "--",
            "--attention-backend", "FLASH_ATTN", "--spec-method", "eagle", "--spec-tokens", "3"]
    assert main(argv) == 0
    release = json.loads(capsys.readouterr().out)["release"]
    assert release["version"] == "0.34.0" and "vLLM 0.34.1 is modelled as vLLM 0.34.0" in release["chosen"]
    assert main([*argv[:6], "--", *argv[9:], "--vllm-version", "v0.33.0"]) == 0
    assert json.loads(capsys.readouterr().out)["release"]["version"] == "0.33.0"
    monkeypatch.setattr(vllm_config, "installed", lambda distribution: "0.34.0rc1")
    assert vllm_config.release_for(None) == (
        "0.34.0", "installed; vLLM 0.34.0rc1 is modelled as vLLM 0.34.0 (the same series: a patch, pre- or "
        "post-release of a supported release is read by that release's rules)")
    assert main([*argv[:6], "--vllm-version", "0.36.1", *argv[8:]]) == 2
    assert "--vllm-version='0.36.1' (supported: 0.33.0, 0.34.0 and the patch" in capsys.readouterr().err
