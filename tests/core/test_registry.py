import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from attnhal.backend import AttentionBackend
from attnhal.capabilities import AttentionRequest, BackendCapabilities
from attnhal.platform import parse
from attnhal.reasons import ReasonCode
from attnhal.registry import BackendPlugin, BackendUnavailable, NoBackendFits, Registry


class Good(AttentionBackend):
    capabilities = BackendCapabilities(name="good", vendors={"cuda", "hip", "cpu"}, phases={"decode"},
                                       dtypes={"float16"})


class NeedsMissingModule(AttentionBackend):
    capabilities = BackendCapabilities(name="needy", vendors={"cuda", "hip", "cpu"}, phases={"decode"},
                                       requires=("attnhal_no_such_module",))


class NoDescriptor:
    pass


def ep(name, value):
    return EntryPoint(name=name, value=value, group="attnhal.backends")


def registry(*eps):
    return Registry(discover=lambda: list(eps))


def test_failed_plugin_is_listed_with_reason_and_does_not_affect_others():
    reg = registry(ep("broken", "attnhal_no_such_pkg:Backend"), ep("good", f"{__name__}:Good"),
                   ep("nodesc", f"{__name__}:NoDescriptor"))
    by_name = {e.name: e for e in reg.entries()}
    assert by_name["good"].available
    assert "ModuleNotFoundError" in by_name["broken"].unavailable_reasons()[0].message
    assert by_name["nodesc"].unavailable_reasons()[0].code is ReasonCode.LOAD_ERROR


def test_missing_required_module_makes_backend_unavailable():
    reg = registry(ep("needy", f"{__name__}:NeedsMissingModule"))
    reasons = reg.get("needy").unavailable_reasons()
    assert [r.code for r in reasons] == [ReasonCode.MODULE_MISSING]
    assert "module=attnhal_no_such_module" in reasons[0].message


def test_explicit_choice_that_does_not_fit_raises_with_every_reason():
    reg = registry(ep("good", f"{__name__}:Good"))
    with pytest.raises(BackendUnavailable) as exc:
        reg.select(parse("cpu"), AttentionRequest(dtype="float32", head_size=96), name="good")
    assert [r.code for r in exc.value.reasons] == [ReasonCode.DTYPE, ReasonCode.HEAD_SIZE]
    with pytest.raises(BackendUnavailable, match="backend=nope"):
        reg.select(parse("cpu"), name="nope")


def test_nothing_fits_lists_every_candidate():
    reg = registry(ep("good", f"{__name__}:Good"), ep("needy", f"{__name__}:NeedsMissingModule"))
    with pytest.raises(NoBackendFits) as exc:
        reg.select(parse("cpu"), AttentionRequest(dtype="bfloat16"))
    assert set(exc.value.candidates) == {"good", "needy"}
    assert "good:" in str(exc.value) and "needy:" in str(exc.value)


def test_selection_follows_priority_and_register_overrides():
    reg = registry(ep("good", f"{__name__}:Good"))
    assert reg.select(parse("cpu")).name == "good"

    class Torch(Good):
        capabilities = BackendCapabilities(name="torch", vendors={"cpu"}, phases={"decode"})

    reg.register(Torch)
    assert reg.select(parse("cpu")).name == "torch"  # cpu priority lists torch first
    assert reg.get("torch").backend is Torch


def test_capability_matrix_lists_conditional_claims():
    from attnhal.capabilities import Variant, When
    from attnhal.docgen import capability_matrix

    class Conditional(Good):
        capabilities = BackendCapabilities(
            name="cond", vendors={"cuda", "hip"}, phases={"decode", "prefill"}, models={"mha", "mla"},
            archs={"cuda": ("sm80..sm90",)},
            variants=(Variant(When(model={"mla"}), {"page_sizes": {64}}, note="mla pages"),))

    reg = registry()
    reg.register(Conditional)
    text = capability_matrix(reg)
    assert "| archs | cuda sm80..sm90 |" in text and "| conditional claims | 1 |" in text
    assert "- when model {mla}: page_sizes = {64} — mla pages" in text
    assert "| cuda:sm100 | invalid (arch) |" in text


# --- entry points that name a BackendPlugin -----------------------------------------------------

LAZY_CAPS = BackendCapabilities(name="lazy", vendors={"cpu"}, phases={"decode"})


@pytest.fixture
def plugin_modules(tmp_path, monkeypatch):
    """A descriptor module and its implementation module, written fresh: whether the
    implementation was imported is whether it is in sys.modules."""
    (tmp_path / "lazy_descriptor.py").write_text(textwrap.dedent("""
        from attnhal.capabilities import BackendCapabilities
        from attnhal.registry import BackendPlugin

        CAPS = BackendCapabilities(name="lazy", vendors={"cpu"}, phases={"decode"})
        PLUGIN = BackendPlugin(CAPS, "lazy_impl:LazyBackend")
        NEEDY = BackendPlugin(BackendCapabilities(name="lazy-needy", vendors={"cpu"}, phases={"decode"},
                                                  requires=("attnhal_no_such_module",)), "lazy_impl:Needy")
        MISMATCH = BackendPlugin(BackendCapabilities(name="lazy-mismatch", vendors={"cpu"}, phases={"decode"}),
                                 "lazy_impl:LazyBackend")
        BROKEN = BackendPlugin(BackendCapabilities(name="lazy-broken", vendors={"cpu"}, phases={"decode"}),
                               "lazy_impl_missing:LazyBackend")
        """))
    (tmp_path / "lazy_impl.py").write_text(textwrap.dedent("""
        from attnhal.backend import AttentionBackend
        from attnhal.capabilities import Reason, ReasonCode
        from lazy_descriptor import CAPS

        class LazyBackend(AttentionBackend):
            capabilities = CAPS

            @classmethod
            def runtime_reasons(cls, platform):
                return [Reason(ReasonCode.RUNTIME, "runtime=lazy (supported: never, in this test)")]
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("lazy_descriptor", "lazy_impl"):
        sys.modules.pop(name, None)


def test_plugin_descriptor_is_read_without_importing_the_class(plugin_modules):
    reg = registry(ep("lazy", "lazy_descriptor:PLUGIN"), ep("good", f"{__name__}:Good"))
    entry = reg.get("lazy")
    assert entry.capabilities.name == "lazy" and reg.names() == ["good", "lazy"]
    assert "lazy_impl" not in sys.modules
    assert entry.source.startswith("lazy_impl:LazyBackend via lazy_descriptor:PLUGIN")
    # availability needs the class: asking loads it, and its runtime reasons count in selection
    assert entry.available and "lazy_impl" in sys.modules
    assert entry.backend is sys.modules["lazy_impl"].LazyBackend
    assert [r.code for r in entry.reasons(AttentionRequest(), parse("cpu"))] == [ReasonCode.RUNTIME]
    with pytest.raises(NoBackendFits) as exc:
        reg.select(parse("cpu"), AttentionRequest(dtype="float32"))
    assert [r.code for r in exc.value.candidates["lazy"]] == [ReasonCode.RUNTIME]


def test_plugin_with_a_missing_required_module_is_unavailable_without_importing_the_class(plugin_modules):
    entry = registry(ep("needy", "lazy_descriptor:NEEDY")).get("lazy-needy")
    assert [r.code for r in entry.unavailable_reasons()] == [ReasonCode.MODULE_MISSING]
    assert "lazy_impl" not in sys.modules


def test_plugin_whose_class_fails_keeps_its_descriptor_and_is_unavailable(plugin_modules):
    reg = registry(ep("broken", "lazy_descriptor:BROKEN"), ep("mismatch", "lazy_descriptor:MISMATCH"))
    broken = reg.get("lazy-broken")
    assert broken.capabilities is not None and broken.load_error is None  # nothing loaded yet
    assert not broken.available and broken.backend is None
    reason = broken.unavailable_reasons()[0]
    assert reason.code is ReasonCode.LOAD_ERROR and "ModuleNotFoundError" in reason.message
    assert "lazy_impl_missing:LazyBackend" in reason.message
    mismatch = reg.get("lazy-mismatch")
    assert mismatch.backend is None and "differ from the plugin's descriptor" in mismatch.load_error


def test_class_and_plugin_entry_points_live_side_by_side(plugin_modules):
    reg = registry(ep("good", f"{__name__}:Good"), ep("lazy", "lazy_descriptor:PLUGIN"))
    good = reg.get("good")
    assert good.backend is Good and good.capabilities is Good.capabilities  # loaded with the entry point
    assert reg.select(parse("cpu"), AttentionRequest(dtype="float16")).name == "good"


def test_register_takes_a_plugin_too(plugin_modules):
    from lazy_descriptor import PLUGIN

    reg = registry()
    reg.register(PLUGIN)
    assert reg.get("lazy").capabilities is PLUGIN.descriptor and "lazy_impl" not in sys.modules
    assert reg.get("lazy").backend.__name__ == "LazyBackend"


def test_plugin_record_is_checked_when_made():
    with pytest.raises(ValueError, match=r"implementation='my_pkg.MyBackend' \(supported: 'module:Class'\)"):
        BackendPlugin(LAZY_CAPS, "my_pkg.MyBackend")
    with pytest.raises(TypeError, match=r"descriptor=dict \(supported: BackendCapabilities\)"):
        BackendPlugin({"name": "x"}, "my_pkg:MyBackend")


def test_entry_point_naming_neither_plugin_nor_class_says_so():
    reg = registry(ep("odd", "attnhal.registry:GROUP"))
    (entry,) = reg.entries()
    assert entry.name == "odd" and "is not a BackendPlugin" in entry.load_error
