"""The engine plugins without their engines: light imports, entry points, the class table, the
audit records and their log lines. The plugins run inside SGLang and vLLM in the engine tiers
(``tests/engines/sglang/test_plugin.py``, ``tests/engines/vllm/test_plugin.py``)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tomllib
import types
from importlib import import_module
from pathlib import Path

import pytest
from repo import ROOT

import attnhal_hooks.sglang as sglang_entry
from attnhal_hooks import SwitchRefused, switch
from attnhal import catalog
import attnhal_sglang as sglang
from attnhal_sglang import classes, plugin
from attnhal_sglang.audit import (LATE_FAILURE, RULES, SHOWN, Direction, PhaseAudit, Verdict, audit,
                                          descriptor_limit, engine_differs, explain)
from attnhal_vllm import plugin as vllm_plugin
from attnhal_vllm.audit import GroupLevel, audit_mode
from attnhal_vllm.modes import CGSupport, GraphMode
from attnhal.phases import Phase
from attnhal.platform import parse

SEED = {"attention_backend": "aiter", "speculative_algorithm": "EAGLE", "speculative_num_steps": 1,
        "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 2}
ENGINES_AND_HEAVY = ("sglang", "vllm", "torch", "triton")


def test_the_plugin_modules_import_no_engine_and_no_torch() -> None:
    code = ("import sys, attnhal_hooks.sglang, attnhal_sglang.plugin, attnhal_vllm.plugin\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINES_AND_HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_pyproject_registers_both_plugins_under_the_engines_groups() -> None:
    tables = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    for group, target in (("sglang.srt.plugins", sglang_entry.register), ("vllm.general_plugins", vllm_plugin.register)):
        module, _, name = tables[group]["attnhal"].partition(":")
        assert getattr(import_module(module), name) is target


def test_the_tiers_overlay_declares_the_tables_of_pyproject() -> None:
    from entry_point_overlay import entry_points_txt

    text = entry_points_txt()
    assert "[sglang.srt.plugins]\nattnhal = attnhal_hooks.sglang:register\n" in text
    assert "[vllm.general_plugins]\nattnhal = attnhal_vllm.plugin:register\n" in text
    assert "[console_scripts]\nattnhal = attnhal.cli:main\n" in text


def test_sglangs_entry_point_imports_nothing_of_attnhal_and_waits_for_the_hooked_workers() -> None:
    """The entry point loads attnhal's plugin when a worker its hooks name is imported, not before."""
    code = ("import sys, attnhal_hooks.sglang\n"
            "print(sorted(m for m in sys.modules if m == 'attnhal' or m.startswith('attnhal.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    assert set(sglang_entry.WORKERS) == {target.rsplit(".", 2)[0] for target in plugin.HOOKS}


def test_the_plugins_hook_the_releases_the_adapters_support() -> None:
    from attnhal.engines import registry, versions

    assert tuple(vllm_plugin.RELEASES) == versions.supported(registry.get("vllm"))
    assert catalog.ENGINES["vllm"] == versions.supported(registry.get("vllm"))[0]  # the catalogue describes the first

def test_without_an_engine_registering_warns_and_does_nothing(caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal.engines import plugin_gate

    monkeypatch.setattr(plugin_gate, "_said", set())  # said once per process: this test must see it
    monkeypatch.delenv(plugin.MODE_VAR, raising=False)
    monkeypatch.delenv(vllm_plugin.ENV_VAR, raising=False)
    with caplog.at_level(logging.WARNING):
        plugin.register()
        vllm_plugin.register()
    assert "SGLang is not installed here" in caplog.text and "vLLM is not installed here" in caplog.text
    assert "sglang" not in sys.modules and "vllm" not in sys.modules


@pytest.mark.parametrize("module,var", [(plugin, plugin.MODE_VAR), (vllm_plugin, vllm_plugin.ENV_VAR),
                                        (sglang_entry, sglang_entry.MODE_VAR)])
@pytest.mark.parametrize("value", ["enforce-all", "strcit", "bogus"])
def test_an_unknown_mode_fails_closed_naming_the_variable_the_value_and_the_choices(
        module: types.ModuleType, var: str, value: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo of ``strict`` must not start a server without the hook: the start ends with a
    SystemExit, which the engines' plugin loaders (``except Exception``) do not swallow."""
    monkeypatch.setenv(var, value)
    with caplog.at_level(logging.ERROR), pytest.raises(SwitchRefused) as refused:
        module.register()
    assert isinstance(refused.value, SystemExit) and not isinstance(refused.value, Exception)
    message = str(refused.value)
    assert f"{var}={value!r} (supported: " in message and "the server does not start" in message
    assert "audit" in message and "off" in message
    assert "sglang" not in sys.modules and "vllm" not in sys.modules  # refused before the engine is touched


@pytest.mark.parametrize("value", ["", " AUDIT ", "off", "strict"])
def test_a_known_mode_any_case_is_read(value: str) -> None:
    assert switch({"V": value}, "V", ("audit", "strict", "off")) == (value.strip().lower() or "audit")


def test_the_switch_message_cuts_a_long_value() -> None:
    with pytest.raises(SwitchRefused) as refused:
        switch({"V": "x" * 10_000}, "V", ("audit", "off"))
    assert len(str(refused.value)) < 300 and "'xxxxxxxxxxxxxxxxxxxx...'" in str(refused.value)


# --- the class table -------------------------------------------------------------------------------

def _sglang_class(path: str, base: type = object) -> type:
    module, _, name = path.rpartition(".")
    return type(name, (base,), {"__module__": module, "__qualname__": name})


def test_every_catalogued_sglang_backend_has_a_class_and_every_class_an_entry() -> None:
    names = {name for names in classes.BACKEND_CLASSES.values() for name in names}
    assert names == {entry.name for entry in catalog.entries("sglang")}


def test_a_class_maps_by_itself_or_its_nearest_listed_parent() -> None:
    aiter = _sglang_class("sglang.srt.layers.attention.aiter_backend.AiterAttnBackend")
    out_of_tree = type("MyPlatformAiter", (aiter,), {"__module__": "my_platform.attention"})
    unrelated = type("AiterAttnBackend", (), {"__module__": "my_platform.attention"})  # same name, not the class
    assert classes.catalog_name(aiter()) == "aiter"
    assert classes.catalog_name(out_of_tree()) == "aiter"
    assert classes.catalog_name(unrelated()) is None


def test_one_class_for_two_entries_is_told_apart_by_the_factorys_stamp() -> None:
    fa = _sglang_class("sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend")
    backend = fa()
    assert classes.catalog_name(backend) is None  # no stamp: unknown, never a guess
    backend.prefill_attention_backend_str = "fa4"
    assert classes.catalog_name(backend) == "fa4"
    backend.prefill_attention_backend_str = "triton"
    assert classes.catalog_name(backend) is None


# --- the audit records ---------------------------------------------------------------------------------

def _seed_audit(sglang_extend: Verdict, **args: object) -> PhaseAudit:
    config = sglang.from_server_args({**SEED, **args}, model="mha")
    rows = audit(config.plan("hip:gfx942"), {Phase.DRAFT_DECODE: Verdict.NOT_RUN, Phase.DRAFT_EXTEND: sglang_extend},
                 names={Phase.DRAFT_DECODE: None, Phase.DRAFT_EXTEND: config.roles["draft_extend"]},
                 applicable=engine_differs(config, "hip:gfx942"))
    return rows[1]


def test_the_seed_bug_line_names_d1_with_the_catalogues_note() -> None:
    row = _seed_audit(Verdict.EAGER)
    assert (row.sglang, row.attnhal, row.direction) == (Verdict.EAGER, Verdict.CAPTURED, Direction.ATTNHAL_CAPTURES)
    assert row.entry is not None and row.entry.entry == "D1"
    assert row.line() == ("draft_extend: SGLang eager, attnhal captured (sglang:aiter); differs: docs/catalog.md D1 "
                          "(sglang:aiter): draft_extend on HIP with num_steps 1: SGLang 0.5.23 runs it eagerly, its "
                          "HIP branch reads the draft-decode backend (speculative/eagle_worker_v2.py:546-565; "
                          "draft_utils.py:84-87)")


def test_agreement_and_an_uncatalogued_difference() -> None:
    assert _seed_audit(Verdict.CAPTURED).line() == "draft_extend: SGLang captured, attnhal captured (sglang:aiter); agree"
    row = _seed_audit(Verdict.EAGER, speculative_num_steps=2, speculative_num_draft_tokens=3)  # D1 needs one step
    assert row.entry is None and row.line().endswith("; differs: not catalogued")


def test_a_descriptor_limit_is_told_from_a_policy_switch() -> None:
    # intel_amx runs draft extend and declares graphs for decode only.
    limited = sglang.plan_server_args({**SEED, "attention_backend": "intel_amx"}, "cpu", model="mha")
    switched = sglang.plan_server_args({**SEED, "disable_cuda_graph": True}, "hip:gfx942", model="mha")
    assert descriptor_limit(limited[Phase.DRAFT_EXTEND])
    assert not descriptor_limit(switched[Phase.DRAFT_EXTEND]) and not switched[Phase.DRAFT_EXTEND].capture


def test_every_catalogued_entry_says_where_it_shows_and_only_there() -> None:
    assert set(SHOWN) == set(RULES)
    config = sglang.from_server_args(SEED, model="mha")
    d1 = engine_differs(config, "hip:gfx942")
    assert [e.entry for e in d1] == ["D1"]
    assert explain(Phase.DRAFT_EXTEND, Direction.ATTNHAL_CAPTURES, d1).entry == "D1"  # type: ignore[union-attr]
    assert explain(Phase.DRAFT_EXTEND, Direction.SGLANG_CAPTURES, d1) is None
    assert explain(Phase.TARGET_VERIFY, Direction.ATTNHAL_CAPTURES, d1) is None
    assert explain(Phase.DRAFT_EXTEND, Direction.ATTNHAL_INVALID, (), "aiter", topk=2) is LATE_FAILURE
    assert explain(Phase.DRAFT_EXTEND, Direction.ATTNHAL_INVALID, (), "aiter", topk=1) is None
    assert str(LATE_FAILURE).startswith("docs/catalog.md, Late failures (sglang:aiter): ")


def test_the_late_failures_note_is_on_the_catalogue_page() -> None:
    assert "**Late failures.**" in (ROOT / "docs" / "catalog.md").read_text()


# --- vLLM's mode, explained ---------------------------------------------------------------------------

def test_flashinfer_with_speculation_names_the_downgrade_its_cause_and_the_catalogue_difference() -> None:
    groups = [GroupLevel(0, "FLASHINFER", CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "FullAttentionSpec")]
    result = audit_mode(groups, GraphMode.FULL_AND_PIECEWISE, GraphMode.PIECEWISE, query_len=4,
                        platform=parse("cuda:sm90"))
    assert result.differs
    assert result.lines[:4] == (
        "attention groups: FLASHINFER UNIFORM_SINGLE_TOKEN_DECODE (KV-cache group 0, FullAttentionSpec)",
        "level UNIFORM_SINGLE_TOKEN_DECODE, set by FLASHINFER (KV-cache group 0, FullAttentionSpec)",
        "cudagraph_mode: FULL_AND_PIECEWISE -> PIECEWISE",
        "downgrade FULL_AND_PIECEWISE -> PIECEWISE: spec decode (query len 4) needs UNIFORM_BATCH "
        "(support: UNIFORM_SINGLE_TOKEN_DECODE)")
    assert result.lines[4].startswith("differs: attnhal reads vllm:FLASHINFER as UNIFORM_BATCH (trtllm-gen decode on "
                                      "sm90; assumes trtllm-gen cubins available: ")
    assert result.lines[4].endswith("vLLM graded it UNIFORM_SINGLE_TOKEN_DECODE here; with attnhal's level the mode "
                                    "would be FULL_AND_PIECEWISE")


def test_the_lowest_group_sets_the_level_and_agreement_is_quiet() -> None:
    groups = [GroupLevel(0, "TRITON_ATTN", CGSupport.ALWAYS), GroupLevel(1, "FLASHINFER", CGSupport.UNIFORM_BATCH)]
    result = audit_mode(groups, GraphMode.FULL_AND_PIECEWISE, GraphMode.FULL_AND_PIECEWISE, query_len=4)
    assert result.lines[1] == "level UNIFORM_BATCH, set by FLASHINFER (KV-cache group 1)"
    assert not any(line.startswith(("downgrade", "differs: attnhal")) for line in result.lines)


def test_every_group_always_names_the_backends() -> None:
    """Issue 30 item 6: no group below ALWAYS sets the level, so the line names all of them."""
    groups = [GroupLevel(0, "FLASH_ATTN", CGSupport.ALWAYS, "FullAttentionSpec"),
              GroupLevel(1, "TRITON_ATTN", CGSupport.ALWAYS, "SlidingWindowSpec")]
    result = audit_mode(groups, GraphMode.FULL_AND_PIECEWISE, GraphMode.FULL_AND_PIECEWISE, query_len=4)
    assert result.lines[1] == ("level ALWAYS: every attention group is (FLASH_ATTN (KV-cache group 0, "
                               "FullAttentionSpec), TRITON_ATTN (KV-cache group 1, SlidingWindowSpec))")
    assert audit_mode([], GraphMode.FULL, GraphMode.FULL).lines[1] == "level ALWAYS (no attention group)"


def test_a_mode_vllm_refuses_is_explained_and_an_uncatalogued_backend_said() -> None:
    groups = [GroupLevel(0, "CUSTOM", CGSupport.NEVER)]
    result = audit_mode(groups, GraphMode.FULL, None, error="ValueError: not supported")
    assert "cudagraph_mode: FULL -> refused (ValueError: not supported)" in result.lines
    assert "CUSTOM: not in attnhal's catalogue (vllm:CUSTOM); its level is vLLM's" in result.lines
    assert not result.differs


# --- the vLLM plugin's lazy wrap, on a stand-in module ------------------------------------------------

RUNNER_MODULE = '''
class Runner:
    def _check_and_update_cudagraph_mode(self, attention_backends, kv_cache_groups):
        self.compilation_config.cudagraph_mode = self.resolves_to
'''


def _stand_ins(level: str, requested: str, resolved: str) -> tuple[object, list[set[type]], list[object]]:
    mode = types.SimpleNamespace
    builder = type("Builder", (), {"get_cudagraph_support": classmethod(lambda cls, config, spec: mode(name=level))})
    backend = type("Backend", (), {"get_name": staticmethod(lambda: "FLASHINFER"),
                                   "get_builder_cls": staticmethod(lambda: builder)})
    config = mode(cudagraph_mode=mode(name=requested), splitting_ops_contain_attention=lambda: True)
    runner = dict(vllm_config=None, compilation_config=config, uniform_decode_query_len=4,
                  resolves_to=mode(name=resolved))
    return runner, [{backend}], [mode(kv_cache_spec=type("FullAttentionSpec", (), {})())]


def test_the_vllm_plugin_wraps_its_target_when_the_module_is_first_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "stand_in_runner.py").write_text(RUNNER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(vllm_plugin, "RELEASES", {"0.33.0": (vllm_plugin.Target(
        "stand_in_runner", "Runner", "_check_and_update_cudagraph_mode", "runner"),)})
    monkeypatch.setattr(vllm_plugin, "installed_vllm", lambda: "0.33.0")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(vllm_plugin.ENV_VAR, raising=False)
    vllm_plugin.register()
    vllm_plugin.register()  # again: still one finder
    assert sum(type(f).__name__ == "_WrapOnImport" for f in sys.meta_path) == 1
    module = import_module("stand_in_runner")
    monkeypatch.delitem(sys.modules, "stand_in_runner")
    assert not any(type(f).__name__ == "_WrapOnImport" for f in sys.meta_path)
    fields, groups, kv_groups = _stand_ins("UNIFORM_SINGLE_TOKEN_DECODE", "FULL_AND_PIECEWISE", "PIECEWISE")
    runner = module.Runner()
    vars(runner).update(fields)
    with caplog.at_level(logging.INFO, logger=vllm_plugin.LOGGER):
        runner._check_and_update_cudagraph_mode(groups, kv_groups)
    assert runner.compilation_config.cudagraph_mode.name == "PIECEWISE"  # vLLM's own decision
    assert "attnhal: cudagraph_mode: FULL_AND_PIECEWISE -> PIECEWISE" in caplog.text
    assert "attnhal: downgrade FULL_AND_PIECEWISE -> PIECEWISE: spec decode (query len 4)" in caplog.text


V2_MODULE = '''
class Config:
    def __init__(self, requested, resolves_to):
        self.cudagraph_mode, self.resolves_to = requested, resolves_to
    def splitting_ops_contain_attention(self):
        return True
    def resolve_cudagraph_mode_and_sizes(self, min_cg_support, min_cg_attn_backend, uniform_decode_query_len=1,
                                         kv_cache_config=None, piecewise_capture_available=True):
        self.cudagraph_mode = self.resolves_to
        return self.resolves_to

def get_attn_cg_support(attn_groups, vllm_config, checked_layer_names=None):
    return min(g.get_metadata_builder(0).get_cudagraph_support(vllm_config, g.kv_cache_spec).value
               for groups in attn_groups for g in groups)

class Speculator:
    def init_cudagraph_manager(self, cudagraph_mode):
        self.decode_cudagraph_manager = Manager(self.decides)

class Manager:
    def __init__(self, mode):
        self.cudagraph_mode = mode
'''


def _v2_targets() -> dict[str, tuple[object, ...]]:
    target = vllm_plugin.Target
    return {"0.34.0": (target("stand_in_v2", None, "get_attn_cg_support", "groups"),
                       target("stand_in_v2", "Config", "resolve_cudagraph_mode_and_sizes", "resolution"),
                       target("stand_in_v2", "Speculator", "init_cudagraph_manager", "drafter"))}


def test_the_vllm_034_hooks_log_every_group_the_resolution_and_the_drafter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """vLLM 0.34's V2 runner, on stand-ins: the groups' levels remembered, the mode resolution audited
    (every backend named when all are ALWAYS), the drafter's mode said; vLLM's answers unchanged."""
    (tmp_path / "stand_in_v2.py").write_text(V2_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(vllm_plugin, "RELEASES", _v2_targets())
    monkeypatch.setattr(vllm_plugin, "installed_vllm", lambda: "0.34.0")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(vllm_plugin.ENV_VAR, raising=False)
    vllm_plugin.register()
    module = import_module("stand_in_v2")
    monkeypatch.delitem(sys.modules, "stand_in_v2")
    mode = types.SimpleNamespace
    always = mode(name="ALWAYS", value=3)
    builder = mode(get_cudagraph_support=lambda config, spec: always)
    group = mode(get_metadata_builder=lambda i: builder, kv_cache_spec=type("FullAttentionSpec", (), {})(),
                 backend=type("TritonAttentionBackend", (), {}))
    with caplog.at_level(logging.INFO, logger=vllm_plugin.LOGGER):
        assert module.get_attn_cg_support([[group, group]], None) == 3
        config = module.Config(mode(name="FULL_AND_PIECEWISE"), mode(name="FULL_AND_PIECEWISE"))
        assert config.resolve_cudagraph_mode_and_sizes(always, None, 4).name == "FULL_AND_PIECEWISE"
        speculator = module.Speculator()
        speculator.decides = mode(name="FULL_DECODE_ONLY")
        speculator.init_cudagraph_manager(mode(name="FULL_AND_PIECEWISE"))
    assert "attnhal: level ALWAYS: every attention group is (TritonAttentionBackend (KV-cache group 0, " \
           "FullAttentionSpec), TritonAttentionBackend (KV-cache group 0, FullAttentionSpec))" in caplog.text
    assert "attnhal: cudagraph_mode: FULL_AND_PIECEWISE -> FULL_AND_PIECEWISE" in caplog.text
    assert ("attnhal: drafter Speculator: draft decode FULL_DECODE_ONLY (the target's decode graphs are FULL)"
            in caplog.text)
    assert "failed" not in caplog.text
    report = next(m for m in caplog.messages if m.startswith("attnhal: attnhal graph report: vLLM on "))
    assert [row.split()[:3] for row in report.splitlines()[2:]] == [
        ["prefill+decode", "-", "piecewise"], ["target_verify", "-", "full"]]


def test_vllm_strict_refuses_where_attnhals_reading_captures_decode_and_vllms_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from attnhal.engines.report import StrictRefusal
    from attnhal_vllm import startup

    groups = [GroupLevel(0, "FLASHINFER", CGSupport.UNIFORM_SINGLE_TOKEN_DECODE, "FullAttentionSpec")]
    monkeypatch.setenv(startup.MODE_VAR, "strict")
    monkeypatch.setattr(startup, "_REPORTED", ["target", "drafter"])
    with pytest.raises(StrictRefusal, match=r"attnhal plans decode \(and target verify\) captured with full "
                                            r"graphs \(FULL_AND_PIECEWISE\), vLLM resolves PIECEWISE \(FLASHINFER"):
        startup.at_start(groups, GraphMode.FULL_AND_PIECEWISE, GraphMode.PIECEWISE, 4, True, (1, 2), None,
                         parse("cuda:sm90"))
    ready = [GroupLevel(0, "FLASHINFER", CGSupport.UNIFORM_BATCH, "FullAttentionSpec")]  # with trtllm-gen cubins
    startup.at_start(ready, GraphMode.FULL_AND_PIECEWISE, GraphMode.FULL_AND_PIECEWISE, 4, True, (1, 2), None,
                     parse("cuda:sm90"))  # vLLM captures what attnhal plans: it starts
    assert startup.MODE_VAR == vllm_plugin.ENV_VAR and "strict" in vllm_plugin.MODES


def test_another_vllm_release_is_said_once_with_the_supported_ones(monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from attnhal.engines import plugin_gate

    monkeypatch.setattr(vllm_plugin, "installed_vllm", lambda: "0.35.0")
    monkeypatch.setattr(plugin_gate, "_said", set())
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv(vllm_plugin.ENV_VAR, raising=False)
    with caplog.at_level(logging.INFO, logger=vllm_plugin.LOGGER):
        vllm_plugin.register()
    assert caplog.messages == ["attnhal: vLLM 0.35.0 is installed; attnhal's plugin is tested against vLLM 0.33.0, "
                               "0.34.0: it stays off (ATTNHAL_VLLM=off silences this)"]
    assert not any(type(f).__name__ == "_WrapOnImport" for f in sys.meta_path)


# --- planning a draft worker, on stand-ins for SGLang's objects -----------------------------------------

def _worker(steps: int = 1, extend: str = "sglang.srt.layers.attention.aiter_backend.AiterAttnBackend",
            **args: object) -> types.SimpleNamespace:
    config = types.SimpleNamespace(num_attention_heads=32, get_total_num_kv_heads=lambda: 8)
    server_args = types.SimpleNamespace(**{**SEED, "speculative_num_steps": steps,
                                           "speculative_num_draft_tokens": steps + 1, **args})
    return types.SimpleNamespace(server_args=server_args, speculative_num_steps=steps, topk=1,
                                 speculative_num_draft_tokens=steps + 1, draft_attn_backend=None,
                                 draft_extend_attn_backend=_sglang_class(extend)(),
                                 draft_runner=types.SimpleNamespace(use_mla_backend=False, model_config=config))


def test_a_draft_worker_is_planned_from_its_backend_classes_and_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNHAL_PLATFORM", "hip:gfx942")
    planned = plugin.plan_draft_worker(_worker(), graphs_enabled=True, env={})
    assert planned.plan[Phase.DRAFT_EXTEND].capture and planned.plan.context.model.value == "gqa"
    assert [e.entry for e in planned.applicable] == ["D1"] and planned.platform == "hip:gfx942"
    assert not plugin.plan_draft_worker(_worker(), graphs_enabled=False, env={}).plan[Phase.DRAFT_EXTEND].capture
    # An adaptive state with one step on a server started with three: D1 is read for the state.
    state = plugin.plan_draft_worker(types.SimpleNamespace(**{**vars(_worker(steps=3)), "speculative_num_steps": 1,
                                                              "speculative_num_draft_tokens": 2}), True, env={})
    assert state.plan.spec.num_steps == 1 and [e.entry for e in state.applicable] == ["D1"]


def test_the_start_up_line_names_flags_that_capture_every_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where SGLang leaves a phase eager, the hook adds one line: ``attnhal advise``'s best flag set."""
    from attnhal_sglang.advice import every_phase_line

    monkeypatch.setenv("ATTNHAL_PLATFORM", "hip:gfx942")
    planned = plugin.plan_draft_worker(_worker(), graphs_enabled=True, env={})
    line = every_phase_line(planned.args, planned.platform, planned.model, env={})
    assert line == ("a combination that captures every phase here: --speculative-num-steps 2 "
                    "--speculative-num-draft-tokens 3 (instead of --speculative-num-steps 1 "
                    "--speculative-num-draft-tokens 2; attnhal advise --engine sglang)")
    three = plugin.plan_draft_worker(_worker(steps=3), graphs_enabled=True, env={})
    assert every_phase_line(three.args, three.platform, three.model, env={}) is None  # aiter's 3 steps: all captured


@pytest.mark.parametrize("worker,platform,says", [
    (_worker(extend="my_platform.attention.Mystery"), "hip:gfx942", "draft_extend backend class=my_platform"),
    (_worker(kv_cache_dtype="mxfp8"), "hip:gfx942", "server argument --kv-cache-dtype='mxfp8' (supported: "),
    (_worker(steps=100), "hip:gfx942", "server argument --speculative-num-steps=100 (supported: 1..64)"),
    (types.SimpleNamespace(**{**vars(_worker()), "speculative_num_steps": 100}), "hip:gfx942",  # an adaptive state
     "server argument --speculative-num-steps=100 (supported: 1..64)"),
    (_worker(), "cpu", "platform=cpu has no device graphs here"),
])
def test_what_attnhal_cannot_plan_is_said(worker: types.SimpleNamespace, platform: str, says: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNHAL_PLATFORM", platform)
    with pytest.raises(plugin.Unplannable, match=re.escape(says)):
        plugin.plan_draft_worker(worker, graphs_enabled=True, env={})


def test_the_sglang_docs_entry_point_example_is_what_the_installed_metadata_registers() -> None:
    """docs/engines/sglang.md's console example prints the entry point; the installed attnhal
    (``pip install -e .``) must register exactly that line."""
    from importlib.metadata import entry_points

    text = (ROOT / "docs" / "engines" / "sglang.md").read_text(encoding="utf-8")
    command = "$ python -c 'from importlib.metadata import entry_points; print(entry_points(group=\"sglang.srt.plugins\"))'"
    shown = text.split(command + "\n", 1)[1].splitlines()[0]
    installed = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "attnhal"]
    assert shown == str(installed), (shown, installed)
    assert "attnhal_hooks.sglang:register" in shown
