import pytest
from doubles import attnhal_warnings, signature_drift

from attnhal.platform import Fp8Flavor, GraphKind, PlatformSpecError, Vendor, arch_at_least, detect, parse


@pytest.mark.parametrize("spec, vendor, arch, warp, fp8, family", [
    ("cuda:sm90", Vendor.CUDA, "sm90", 32, Fp8Flavor.OCP, "sm90"),
    ("cuda:80", Vendor.CUDA, "sm80", 32, Fp8Flavor.NONE, "sm80"),
    ("cuda:sm_89", Vendor.CUDA, "sm89", 32, Fp8Flavor.OCP, "sm89"),
    ("hip:gfx942", Vendor.HIP, "gfx942", 64, Fp8Flavor.FNUZ, "gfx94"),
    ("hip:gfx90a", Vendor.HIP, "gfx90a", 64, Fp8Flavor.NONE, "gfx90"),
    ("hip:gfx950", Vendor.HIP, "gfx950", 64, Fp8Flavor.OCP, "gfx95"),
    ("hip:gfx1100", Vendor.HIP, "gfx1100", 32, Fp8Flavor.NONE, "gfx110"),
    ("cpu", Vendor.CPU, "cpu", 1, Fp8Flavor.NONE, "cpu"),
])
def test_parse_facts(spec, vendor, arch, warp, fp8, family):
    p = parse(spec)
    assert (p.vendor, p.arch, p.warp_size, p.fp8_flavor, p.arch_family) == (vendor, arch, warp, fp8, family)
    assert p.has_graph_api and p.graph_kind is GraphKind.EMULATED
    assert p.torch_device == "cpu"
    assert parse(p.name) == p


def test_nographs_option_round_trips():
    p = parse("hip:gfx942,nographs")
    assert not p.has_graph_api and p.graph_kind is GraphKind.NONE
    assert p.name == "hip:gfx942,nographs" and parse(p.name) == p
    assert p.name == str(p)


@pytest.mark.parametrize("spec, needle", [
    ("rocm:gfx942", "platform='rocm:gfx942'"),
    ("cuda:sm9x", "arch='sm9x'"),
    ("hip:mi300", "arch='mi300'"),
    ("cpu:x86", "takes no arch"),
    ("cuda:sm90,fast", "option='fast'"),
])
def test_bad_specs_name_the_value(spec, needle):
    with pytest.raises(PlatformSpecError, match="supported") as exc:
        parse(spec)
    assert needle in str(exc.value)


def test_arch_ordering():
    assert arch_at_least(Vendor.CUDA, "sm90", "sm80")
    assert not arch_at_least(Vendor.CUDA, "sm80", "sm90")
    assert arch_at_least(Vendor.HIP, "gfx942", "gfx90a")
    assert not arch_at_least(Vendor.HIP, "gfx90a", "gfx942")
    assert arch_at_least(Vendor.CPU, "cpu", "anything")


def test_env_override(monkeypatch):
    monkeypatch.setenv("ATTNHAL_PLATFORM", "hip:gfx90a")
    assert detect() == parse("hip:gfx90a")


def test_detect_without_gpu_does_not_initialize_cuda(monkeypatch):
    import torch

    monkeypatch.delenv("ATTNHAL_PLATFORM", raising=False)
    p = detect()
    if not torch.cuda.is_available():
        assert p.vendor is Vendor.CPU and p.graph_kind is GraphKind.EMULATED and not p.simulated
        assert not torch.cuda.is_initialized()


@pytest.mark.parametrize("spec, vendor, arch, warp, device", [
    ("xpu:pvc", Vendor.XPU, "pvc", None, "xpu"),
    ("xpu:BMG", Vendor.XPU, "bmg", None, "xpu"),
    ("npu:910b", Vendor.NPU, "910b", None, "npu"),
    ("npu:ascend910_93", Vendor.NPU, "910_93", None, "npu"),
    ("musa:mp31", Vendor.MUSA, "mp31", None, "musa"),
    ("musa:mp_22", Vendor.MUSA, "mp22", None, "musa"),
])
def test_new_vendor_rows(spec, vendor, arch, warp, device):
    from attnhal.platform import VENDORS

    p = parse(spec)
    assert (p.vendor, p.arch, p.warp_size, p.fp8_flavor, p.known_arch) == (vendor, arch, warp, Fp8Flavor.NONE, True)
    assert p.has_graph_api and p.graph_kind is GraphKind.EMULATED and p.simulated
    assert VENDORS[vendor].torch_device == device and p.graph_api == VENDORS[vendor].graph_api
    assert parse(p.name) == p


@pytest.mark.parametrize("spec, needle", [
    ("", "platform=''"),
    ("cuda:", "cuda:ARCH with an arch"),
    ("hip:", "hip:ARCH with an arch"),
    ("cuda", "cuda:ARCH with an arch"),
    ("xpu", "xpu:ARCH with an arch"),
    ("cuda:sm1000", "2-3 digits"),
    ("hip:gfx94", "arch='gfx94'"),
    ("npu:abc", "arch='abc'"),
    ("musa:mp3", "arch='mp3'"),
])
def test_empty_or_malformed_archs_are_errors(spec, needle):
    with pytest.raises(PlatformSpecError) as exc:
        parse(spec)
    assert needle in str(exc.value) and "supported" in str(exc.value)


@pytest.mark.parametrize("spec, warp", [("cuda:sm999", 32), ("hip:gfx943", 64), ("hip:gfx1250", 32),
                                        ("hip:gfx000", None), ("xpu:xe9", None)])
def test_unknown_well_formed_archs_warn_and_get_conservative_facts(spec, warp):
    from attnhal.platform import UnknownArchWarning

    with pytest.warns(UnknownArchWarning, match="conservative facts"):
        p = parse(spec)
    # Warp size only where the vendor or the arch family fixes it; never an invented one. No fp8.
    assert p.warp_size == warp and p.fp8_flavor is Fp8Flavor.NONE and not p.known_arch


def test_known_archs_do_not_warn(recwarn):
    for spec in ("cuda:sm80", "cuda:sm120", "hip:gfx90a", "hip:gfx1201", "xpu:pvc", "npu:910b", "musa:mp21"):
        parse(spec)
    assert not attnhal_warnings(recwarn.list)  # torch or Python may warn of their own


def test_parse_and_as_platform_refuse_non_strings():
    from attnhal.platform import as_platform

    with pytest.raises(TypeError, match="spec=None"):
        parse(None)
    with pytest.raises(TypeError, match="platform=42"):
        as_platform(42)
    assert as_platform("hip:gfx942") == parse("hip:gfx942")


def test_arch_sets_and_unknown_arch_ordering():
    import warnings

    from attnhal.platform import ArchSet, UnknownArchWarning

    s = ArchSet(Vendor.CUDA, ("sm80..sm90", "sm120"))
    assert "sm86" in s and "sm90" in s and "sm120" in s and "sm100" not in s and "sm75" not in s
    assert "gfx942" in ArchSet(Vendor.HIP, ("..gfx942",)) and "gfx950" not in ArchSet(Vendor.HIP, ("..gfx942",))
    assert "910b" in ArchSet(Vendor.NPU, ("910..",)) and "310p" not in ArchSet(Vendor.NPU, ("910..",))
    with pytest.raises(PlatformSpecError, match="arch='gfx9'"):
        ArchSet(Vendor.HIP, ("gfx9..",))
    with pytest.raises(PlatformSpecError, match="arch range"):
        ArchSet(Vendor.CUDA, ("..",))
    # An unordered vendor's unknown arch is at least nothing but itself (conservative).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownArchWarning)
        assert not arch_at_least(Vendor.XPU, "xe9", "pvc") and arch_at_least(Vendor.XPU, "xe9", "xe9")


#: What detection calls on ``torch.npu`` / ``torch.musa`` / ``torch.xpu``.
VENDOR_API = ("is_available", "current_device", "get_device_name")


def fake_vendor_api(device_name: str) -> type:
    """A stand-in for what torch_npu / torch_musa / torch.xpu expose: one device named
    ``device_name``, with torch.xpu's signatures (checked below)."""
    class FakeApi:
        is_available = staticmethod(lambda: True)
        current_device = staticmethod(lambda: 0)
        get_device_name = staticmethod(lambda device=None: device_name)

    return FakeApi


def test_the_fake_vendor_api_follows_torch_xpu():
    import torch

    assert signature_drift(fake_vendor_api("x"), torch.xpu, VENDOR_API) == []


@pytest.mark.parametrize("module, name, expected, no_graphs", [
    ("npu", "Ascend910B3", "npu:910b", "the npu vendor row names none"),
    ("musa", "MTT S4000", "musa:mp22", "the musa vendor row names none"),
    # the stand-in torch.xpu has no XPUGraph, so TorchXpuAPI cannot capture
    ("xpu", "Intel(R) Data Center GPU Max 1550", "xpu:pvc", "has no torch.xpu.XPUGraph"),
])
def test_detect_reads_out_of_tree_vendors_only_through_torch(monkeypatch, module, name, expected, no_graphs):
    import torch

    monkeypatch.delenv("ATTNHAL_PLATFORM", raising=False)
    monkeypatch.setattr(torch, module, fake_vendor_api(name), raising=False)
    p = detect()
    assert p.name == expected and p.has_graph_api and not p.simulated
    assert p.torch_device == f"{module}:0" and p.device_name == name
    # A device graph kind only where the row names an implementation that loads here.
    assert p.graph_kind is GraphKind.NONE and no_graphs in (p.graph_device_error or "")


def test_detect_names_the_fix_for_an_unknown_device(monkeypatch):
    import torch

    monkeypatch.delenv("ATTNHAL_PLATFORM", raising=False)
    monkeypatch.setattr(torch, "npu", fake_vendor_api("Mystery 1"), raising=False)
    with pytest.raises(PlatformSpecError, match="device name='Mystery 1' names no known npu arch.*ATTNHAL_PLATFORM"):
        detect()
