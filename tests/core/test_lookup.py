"""Backend references (attnhal.lookup): each shape, each error, and the commands that take them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from attnhal import catalog, lookup
from attnhal.backend import AttentionBackend
from attnhal.capabilities import BackendCapabilities
from attnhal.capabilities.files import DescriptorError, load_descriptor
from attnhal.cli import main
from attnhal.lookup import DescriptorFileError, NotAnImplementation, RefShape, UnknownBackend
from attnhal.platform import parse
from attnhal.reasons import ReasonCode
from attnhal.registry import GROUP, BackendPlugin, BackendUnavailable, Registry
from repo import ROOT

TRITON_LIKE = "docs/examples/triton-like.toml"

CAPS = BackendCapabilities(name="ref-good", vendors={"cuda", "hip", "cpu"}, phases={"decode"})
ON_CUDA = BackendCapabilities(name="split", vendors={"cuda"}, phases={"decode"})
ON_HIP = BackendCapabilities(name="split", vendors={"hip"}, phases={"decode", "prefill"})


class RefGood(AttentionBackend):
    capabilities = CAPS


class NotABackend:
    capabilities = CAPS


PLUGIN = BackendPlugin(CAPS, f"{__name__}:RefGood")


def registry(*entry_points: tuple[str, str]) -> Registry:
    eps = [EntryPoint(name, value, GROUP) for name, value in entry_points]
    return Registry(discover=lambda: eps)


@pytest.fixture
def reg() -> Registry:
    return registry(("ref-good", f"{__name__}:PLUGIN"), ("broken", "attnhal_no_such_pkg:Backend"))


# --- the grammar ------------------------------------------------------------------------------

@pytest.mark.parametrize("ref,kind", [
    ("my.toml", RefShape.FILE), ("conf/b.json", RefShape.FILE), ("./no-suffix", RefShape.FILE),
    ("sglang:aiter", RefShape.CATALOGUE), ("vllm:FLASH_ATTN", RefShape.CATALOGUE), ("sglang:nope", RefShape.CATALOGUE),
    ("attnhal_torch:TorchBackend", RefShape.MODULE_ATTR), ("sglang.sub:X", RefShape.MODULE_ATTR),
    ("sglangx:aiter", RefShape.MODULE_ATTR), ("torch", RefShape.REGISTERED), ("cpu", RefShape.REGISTERED),
])
def test_each_shape_is_told_by_its_spelling(ref: str, kind: RefShape) -> None:
    assert lookup.shape(ref) is kind


def test_a_file_under_a_bare_name_does_not_hide_a_registered_name(tmp_path: Path, monkeypatch, reg) -> None:
    (tmp_path / "ref-good").write_text("not a descriptor")
    monkeypatch.chdir(tmp_path)
    assert lookup.describe("ref-good", registry=reg) is CAPS


# --- describe: every shape ----------------------------------------------------------------------

def test_describe_reads_a_file_the_catalogue_an_object_and_the_registry(reg) -> None:
    assert lookup.describe(str(ROOT / TRITON_LIKE), registry=reg) == load_descriptor(ROOT / TRITON_LIKE)
    assert lookup.describe("vllm:FLASH_ATTN", registry=reg) is catalog.load("vllm:FLASH_ATTN").descriptor
    assert lookup.describe(f"{__name__}:RefGood", registry=reg) is CAPS
    assert lookup.describe(f"{__name__}:PLUGIN", registry=reg) is CAPS
    assert lookup.describe(f"{__name__}:CAPS", registry=reg) is CAPS
    assert lookup.describe("ref-good", registry=reg) is CAPS


def test_describe_takes_the_platforms_descriptor_of_a_per_vendor_name() -> None:
    reg = Registry(discover=lambda: [])
    reg.register(BackendPlugin(ON_CUDA, f"{__name__}:RefGood"))
    reg.register(BackendPlugin(ON_HIP, f"{__name__}:RefGood"))
    assert lookup.describe("split", parse("hip:gfx942"), registry=reg) is ON_HIP
    assert lookup.describe("split", parse("cuda:sm90"), registry=reg) is ON_CUDA


# --- describe: every error ----------------------------------------------------------------------

def test_a_file_that_cannot_be_read_is_a_value_error_naming_it(tmp_path: Path, reg) -> None:
    with pytest.raises(DescriptorFileError) as exc:
        lookup.describe("missing.toml", registry=reg)
    assert isinstance(exc.value, (ValueError, DescriptorError))
    assert str(exc.value).startswith("backend=missing.toml: ") and "No such file" in exc.value.detail
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 3\n")
    with pytest.raises(DescriptorFileError, match=r"backend=.*bad\.toml: .*name") as exc:
        lookup.describe(str(bad), registry=reg)
    assert "\n" not in exc.value.detail


def test_unknown_names_list_what_each_shape_supports(reg) -> None:
    with pytest.raises(UnknownBackend, match=r"backend=sglang:nope \(supported: .*sglang:aiter"):
        lookup.describe("sglang:nope", registry=reg)
    with pytest.raises(UnknownBackend) as exc:
        lookup.describe("nope", registry=reg)
    message = exc.value.reasons[0].message
    assert isinstance(exc.value, LookupError) and exc.value.reasons[0].code is ReasonCode.NO_BACKEND
    assert message.startswith("backend=nope (supported: a registered name (broken, ref-good), ENGINE:NAME with "
                              "ENGINE in {sglang, vllm}") and "module:attr" in message and ".toml" in message
    assert str(exc.value) == message  # one line, the reason itself


@pytest.mark.parametrize("ref,cause", [
    ("attnhal_no_such_pkg:Thing", "ModuleNotFoundError: No module named 'attnhal_no_such_pkg'"),
    (f"{__name__}:Missing", "AttributeError"),
])
def test_a_module_attr_that_does_not_import_is_unknown_with_the_cause(ref: str, cause: str, reg) -> None:
    for resolve in (lookup.describe, lookup.backend_class):
        with pytest.raises(UnknownBackend, match=rf"backend={ref} \(supported: .*module:attr.*\): .*{cause}"):
            resolve(ref, registry=reg)


def test_a_module_that_crashes_while_importing_is_a_load_error(tmp_path: Path, monkeypatch, reg) -> None:
    (tmp_path / "crashing_ref_module.py").write_text("raise RuntimeError('injected at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendUnavailable) as exc:
        lookup.describe("crashing_ref_module:Backend", registry=reg)
    assert exc.value.reasons[0].code is ReasonCode.LOAD_ERROR
    assert "RuntimeError: injected at import" in exc.value.reasons[0].message
    sys.modules.pop("crashing_ref_module", None)


def test_an_object_that_is_not_a_descriptor_is_named_with_what_is_supported(reg) -> None:
    with pytest.raises(UnknownBackend, match=r"backend=os:sep \(supported: module:attr naming a BackendCapabilities"):
        lookup.describe("os:sep", registry=reg)


def test_a_registered_backend_that_failed_to_load_gives_its_load_error(reg) -> None:
    with pytest.raises(BackendUnavailable) as exc:
        lookup.describe("broken", registry=reg)
    assert not isinstance(exc.value, UnknownBackend)
    assert exc.value.reasons[0].code is ReasonCode.LOAD_ERROR and "ModuleNotFoundError" in exc.value.reasons[0].message


# --- backend_class ------------------------------------------------------------------------------

def test_backend_class_takes_a_class_module_attr_a_plugin_and_a_registered_name(reg) -> None:
    assert lookup.backend_class(RefGood, registry=reg) is RefGood
    assert lookup.backend_class(f"{__name__}:RefGood", registry=reg) is RefGood
    assert lookup.backend_class(f"{__name__}:PLUGIN", registry=reg) is RefGood
    assert lookup.backend_class("ref-good", registry=reg) is RefGood


@pytest.mark.parametrize("ref,what", [
    ("sglang:aiter", "sglang:aiter is in the sglang engine catalogue (ENGINE:NAME with ENGINE in {sglang, vllm} is "
                     "never read as module:attr)"),
    ("sglang:nope", "is in the sglang engine catalogue"),  # the prefix decides, not whether the entry exists
    (TRITON_LIKE, f"{TRITON_LIKE} is a descriptor file"),
    (f"{__name__}:CAPS", "is a BackendCapabilities"),
])
def test_a_descriptor_is_not_an_implementation(ref: str, what: str, reg) -> None:
    with pytest.raises(NotAnImplementation) as exc:
        lookup.backend_class(ref, registry=reg)
    message = str(exc.value)
    assert isinstance(exc.value, LookupError)
    assert message.startswith(f"backend={ref} (supported: a registered name (broken, ref-good) or module:attr "
                              "naming an AttentionBackend subclass or BackendPlugin): ")
    assert what in message and "a descriptor to plan with, not an implementation" in message
    assert f"attnhal plan --backend {ref}" in message  # what to do with it instead


def test_backend_class_refuses_what_is_not_a_backend(reg) -> None:
    for ref in (NotABackend, f"{__name__}:NotABackend"):
        with pytest.raises(UnknownBackend, match=r"\(supported: an AttentionBackend subclass with class attribute"):
            lookup.backend_class(ref, registry=reg)  # type: ignore[arg-type]
    with pytest.raises(UnknownBackend, match=r"backend=nope \(supported: a registered name \(broken, ref-good\) or "
                                             "module:attr"):
        lookup.backend_class("nope", registry=reg)
    with pytest.raises(BackendUnavailable, match="load=attnhal_no_such_pkg:Backend"):
        lookup.backend_class("broken", registry=reg)


def test_a_plugin_whose_class_fails_to_load_is_a_load_error(reg) -> None:
    broken = BackendPlugin(CAPS, "attnhal_no_such_pkg:Backend")
    reg.register(broken)
    assert lookup.describe("ref-good", registry=reg) is CAPS  # the descriptor still plans
    with pytest.raises(BackendUnavailable) as exc:
        lookup.backend_class("ref-good", registry=reg)
    assert exc.value.reasons[0].code is ReasonCode.LOAD_ERROR and "attnhal_no_such_pkg" in str(exc.value)


# --- the commands that take references ----------------------------------------------------------

def test_conformance_of_a_catalogue_name_is_a_usage_error_not_an_import(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "sglang:aiter", "--platform", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "catalogue" in err and "not an implementation" in err and "No module named" not in err
    assert err.count("\n") == 1


def test_conformance_of_module_attr_still_runs() -> None:
    from attnhal.testing.report import resolve_backend, run_conformance
    from attnhal_torch import TorchBackend

    assert resolve_backend("attnhal_torch:TorchBackend") is TorchBackend
    report = run_conformance("attnhal_torch:TorchBackend", max_examples=0, platform="cpu",
                             only=["phase[decode, float32"])
    assert report.backend == "torch" and report.ok and report.counts()["verified"] == 1


def test_plan_accepts_module_attr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--backend", "attnhal_triton.descriptor:PLUGIN", "--platform", "hip:gfx942"]) == 0
    assert "triton" in capsys.readouterr().out


def test_worker_takes_module_attr_and_refuses_a_catalogue_name() -> None:
    from attnhal.example_engine.model import ModelConfig, TinyLlama
    from attnhal.example_engine.worker import SpecWorker
    from attnhal.spec import SpecConfig
    from attnhal_torch import TorchBackend

    model = TinyLlama(ModelConfig(num_layers=1, hidden_size=32, ffn_size=64, vocab_size=64, head_dim=16))
    worker = SpecWorker(model, None, SpecConfig(), platform="cpu", backend="attnhal_torch:TorchBackend",
                        max_context_len=32)
    assert worker.classes["target"] is TorchBackend
    with pytest.raises(NotAnImplementation, match="catalogue"):
        SpecWorker(model, None, SpecConfig(), platform="cpu", backend="sglang:aiter", max_context_len=32)
    with pytest.raises(BackendUnavailable, match="vendor=cpu"):  # module:attr is checked like a registered name
        SpecWorker(model, None, SpecConfig(), platform="cpu", backend="attnhal_triton:TritonBackend",
                   max_context_len=32)


# --- planning with a registered descriptor imports no implementation ----------------------------

LIGHT = textwrap.dedent("""
    import sys
    from attnhal.cli import main
    code = main({argv!r})
    heavy = sorted(m for m in ("torch", "triton", "attnhal_torch.backend", "attnhal_triton.backend",
                               "attnhal_cpu.backend") if m in sys.modules)
    print(code, heavy)
""")


@pytest.mark.parametrize("command,backend,platform", [
    ("plan", "triton", "hip:gfx942"), ("plan", "torch", "hip:gfx942"), ("plan", "cpu", "cpu"),
    ("explain", "triton", "cuda:sm90"),
])
def test_planning_with_a_registered_backend_does_not_import_torch(command: str, backend: str, platform: str) -> None:
    argv = [command, "--backend", backend, "--platform", platform, "--spec-steps", "2", "--json"]
    out = subprocess.run([sys.executable, "-c", LIGHT.format(argv=argv)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0 []"


def test_descriptor_modules_import_no_torch() -> None:
    code = ("import sys, attnhal.lookup, attnhal_torch.descriptor, attnhal_triton.descriptor, attnhal_cpu.descriptor; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_a_reference_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"backend=3 \(supported: a str backend reference"):
        lookup.describe(3)  # type: ignore[arg-type]
