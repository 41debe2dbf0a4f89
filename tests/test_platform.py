import pytest

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
    assert parse(p.spec) == p


def test_nographs_option_round_trips():
    p = parse("hip:gfx942,nographs")
    assert not p.has_graph_api and p.graph_kind is GraphKind.NONE
    assert p.spec == "hip:gfx942,nographs" and parse(p.spec) == p


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
