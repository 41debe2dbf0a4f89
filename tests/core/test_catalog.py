"""The engine catalogue: every file loads, cites its source, and is addressable by name."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from attnhal import catalog, lookup
from attnhal.cli import main
from attnhal.engines import registry
from attnhal.registry import BackendUnavailable, default_registry

CITATION = re.compile(r"[\w/]+\.py:\d+")


def folder(engine: str):  # type: ignore[no-untyped-def]
    """The folder of the package the engine's adapter names as its catalogue."""
    return resources.files(str(registry.get(engine).catalog))


def files() -> list[tuple[str, str]]:
    return [(engine, f.name) for engine in catalog.ENGINES for f in folder(engine).iterdir()
            if f.name.endswith(".toml")]


def test_every_file_loads_with_its_engine_release_and_summary() -> None:
    found = catalog.entries()
    assert {(e.engine, f"{e.name}.toml") for e in found} == set(files())
    for entry in found:
        assert entry.version == catalog.ENGINES[entry.engine]
        assert entry.summary and entry.descriptor.name == entry.qualified_name


@pytest.mark.parametrize("engine,name", files())
def test_every_file_cites_the_engine_source(engine: str, name: str) -> None:
    text = (folder(engine) / name).read_text(encoding="utf-8")
    assert CITATION.search(text), f"{engine}/{name} cites no path.py:LINE"
    # Every graph and run-limit claim sits in a table whose header or line cites a source.
    for header in re.findall(r"^\[(?:graph|run_limits|phase_fill)\].*$", text, flags=re.MULTILINE):
        assert CITATION.search(header), f"{engine}/{name}: {header!r} cites nothing"


def test_required_backends_are_catalogued() -> None:
    sglang = {e.name for e in catalog.entries("sglang")}
    assert {"triton", "flashinfer", "fa3", "fa4", "aiter", "trtllm_mha", "trtllm_mla", "cutedsl_mla", "flashmla",
            "dsa", "torch_native", "wave", "intel_amx"} <= sglang
    vllm = {e.name for e in catalog.entries("vllm")}
    assert {"FLASH_ATTN", "TRITON_ATTN", "FLASHINFER", "ROCM_ATTN", "ROCM_AITER_FA", "FLASHMLA", "CUTLASS_MLA",
            "CPU_ATTN"} <= vllm


def test_unknown_names_list_the_known_ones() -> None:
    assert catalog.is_catalog_name("sglang:aiter") and not catalog.is_catalog_name("torch")
    assert not catalog.is_catalog_name("docs/examples/x.toml")
    with pytest.raises(catalog.CatalogError, match=r"backend=sglang:nope \(supported: .*sglang:aiter"):
        catalog.load("sglang:nope")
    with pytest.raises(catalog.CatalogError, match=r"engine=trt \(supported: sglang, vllm\)"):
        catalog.entries("trt")


def test_catalogue_names_resolve_through_lookup() -> None:
    assert lookup.describe("sglang:aiter") is catalog.load("sglang:aiter").descriptor
    with pytest.raises(lookup.NotAnImplementation) as exc:  # a descriptor to plan with, not a backend to run
        lookup.backend_class("sglang:aiter")
    assert "catalogue" in exc.value.reasons[0].message
    with pytest.raises(BackendUnavailable, match="backend=sglang:aiter"):  # the registry holds implementations only
        default_registry().get("sglang:aiter")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_catalog_command_lists_every_entry(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "catalog")
    assert code == 0
    for entry in catalog.entries():
        assert entry.qualified_name in out
    assert "sglang 0.5.23" in out and "vllm 0.33.0" in out
    code, out, _ = run(capsys, "catalog", "--engine", "vllm")
    assert code == 0 and "sglang:" not in out
    assert run(capsys, "catalog", "--engine", "trt")[0] == 2


def test_explain_fa3_on_sm100_says_no_with_the_arch_reason(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", "--backend", "sglang:fa3", "--platform", "cuda:sm100")
    assert code == 1
    assert "does not fit: [arch] arch=sm100" in out


def test_plan_with_a_vllm_catalogue_backend(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "--backend", "vllm:CUTLASS_MLA", "--platform", "cuda:sm100",
                       "--spec-steps", "3")
    assert code == 0
    verify = next(line for line in out.splitlines() if line.startswith("target_verify"))
    assert verify.split()[1:4] == ["yes", "no", "vllm:CUTLASS_MLA"]  # UNIFORM_SINGLE_TOKEN_DECODE
