"""One broken engine adapter costs only itself: the registry fails soft.

Two adapters are registered beside SGLang's and vLLM's (the registry's entry points replaced for
the test): ``broken``, whose module fails to import, and ``misnamed``, vLLM's adapter registered
under another name. ``attnhal info`` lists both as unavailable with their error; every other
command works; ``--engine broken`` exits 2 with one line and no traceback; the Python API says the
same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.metadata import EntryPoint

import pytest

from attnhal import catalog
from attnhal.cli import main
from attnhal.engines import advise, registry

BROKEN = "attnhal_no_such_engine.adapter:ADAPTER"


@pytest.fixture
def two_bad_adapters(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = registry._entry_points()
    found = {**real, "broken": EntryPoint("broken", BROKEN, registry.GROUP),
             "misnamed": EntryPoint("misnamed", "attnhal_vllm.adapter:ADAPTER", registry.GROUP)}
    registry.clear()
    monkeypatch.setattr(registry, "_entry_points", lambda: dict(sorted(found.items())))
    yield
    monkeypatch.undo()
    registry.clear()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.usefixtures("two_bad_adapters")
def test_info_lists_the_bad_adapters_as_unavailable_with_their_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "info", "--platform", "cuda:sm90", "--json")
    assert code == 0, err
    engines = {row["engine"]: row for row in json.loads(out)["engines"]}
    assert sorted(engines) == ["broken", "misnamed", "sglang", "vllm"]
    assert engines["broken"]["status"].startswith(f"unavailable: {BROKEN} failed to import (ModuleNotFoundError")
    assert engines["misnamed"]["error"] == ("attnhal_vllm.adapter:ADAPTER is the adapter named 'vllm', registered "
                                            "as 'misnamed' (supported: an entry point named as its adapter)")
    assert engines["sglang"]["error"] is None and engines["vllm"]["error"] is None
    code, out, _ = run(capsys, "info", "--platform", "cuda:sm90")
    assert code == 0 and "broken" in out and "unavailable: attnhal_no_such_engine" in out


@pytest.mark.usefixtures("two_bad_adapters")
def test_every_other_command_works(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "plan", "--platform", "cuda:sm90")[0] == 0
    code, out, err = run(capsys, "plan", "--engine", "sglang", "--", "--attention-backend", "triton",
                         "--platform", "cuda:sm90")
    assert code == 0 and "plan: valid" in out, err
    code, out, _ = run(capsys, "explain", "--engine", "vllm", "--", "--attention-backend", "TRITON_ATTN",
                       "--platform", "cuda:sm90")
    assert code == 0 and "fits this request" in out
    code, out, _ = run(capsys, "catalog", "--json")
    assert code == 0 and {e["engine"] for e in json.loads(out)} == {"sglang", "vllm"}
    code, out, _ = run(capsys, "advise", "--engine", "sglang", "--platform", "hip:gfx942", "--model", "mha", "--",
                       "--attention-backend", "aiter")
    assert code == 0 and out.startswith("advise: SGLang 0.5.23 on hip:gfx942")


@pytest.mark.usefixtures("two_bad_adapters")
@pytest.mark.parametrize("command", ["plan", "explain", "advise"])
@pytest.mark.parametrize("engine", ["broken", "misnamed"])
def test_a_bad_engine_asked_for_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], command: str,
                                                      engine: str) -> None:
    code, out, err = run(capsys, command, "--engine", engine, "--", "--attention-backend", "x")
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith(f"attnhal {command}: error: --engine={engine!r} is unavailable: ")


@pytest.mark.usefixtures("two_bad_adapters")
def test_the_python_api_says_the_same() -> None:
    assert registry.names() == ["broken", "misnamed", "sglang", "vllm"]
    assert [a.name for a in registry.adapters()] == ["sglang", "vllm"]
    assert sorted(registry.unavailable()) == ["broken", "misnamed"]
    assert dict(catalog.ENGINES).keys() == {"sglang", "vllm"} and "broken" not in catalog.ENGINES
    with pytest.raises(registry.EngineUnavailable, match="failed to import") as caught:
        advise("broken", {}, "cuda:sm90")
    assert isinstance(caught.value, LookupError) and caught.value.name == "broken"
    with pytest.raises(registry.UnknownEngine, match=r"--engine='nope' \(supported: broken, misnamed, sglang, vllm\)"):
        registry.get("nope")
    with pytest.raises(catalog.CatalogError, match="engine=broken"):
        catalog.entries("broken")


def test_the_shipped_engines_come_from_the_entry_points_alone() -> None:
    """No built-in list: SGLang's and vLLM's adapters are found as a third party's is."""
    assert not hasattr(registry, "SHIPPED")
    assert {ep.value for ep in registry._entry_points().values()} >= {"attnhal_sglang.adapter:ADAPTER",
                                                                        "attnhal_vllm.adapter:ADAPTER"}


def test_python_advise_goes_through_the_adapter() -> None:
    """``attnhal.engines.advise`` takes any registered engine that advises, by the same protocol."""
    advice = advise("vllm", {"attention_backend": "FLASH_ATTN"}, "cuda:sm90", "mha", trtllm_cubins=False)
    assert advice.engine.startswith("vLLM ")

