from importlib.metadata import EntryPoint

import pytest

from attnhal.backend import AttentionBackend
from attnhal.capabilities import AttentionRequest, BackendCapabilities, ReasonCode
from attnhal.platform import parse
from attnhal.registry import BackendUnavailable, NoBackendFits, Registry


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
