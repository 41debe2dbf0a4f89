"""The device paths' test doubles follow the code they stand for, checked on CPU.

Device tests (tests/graphs/test_device_gpu.py) run only where a GPU is, and a double that
drifted from its real function fails there first (issue 34: a ``new_graph`` spy without
the ``device=`` keyword the runner passes). Function doubles are built by
:func:`doubles.stand_in` and :func:`doubles.spy` (bound to the real signature by
construction); class doubles are compared here, method by method, with the class or
protocol they replace.
"""

from __future__ import annotations

import warnings

import broken_backends
import lying_backends
import mutants
import pytest
from doubles import attnhal_warnings, signature_drift, spy, stand_in
from fake_device import FakeDevice
from graph_steps import Meta

from attnhal.backend import AttentionBackend
from attnhal.graphs import GraphCaptureWarning, device as device_module, runner as runner_module
from attnhal.graphs.step import MetadataOwner

#: Class doubles of device paths, and what each stands for.
CLASS_DOUBLES = {
    "FakeDevice": (FakeDevice, device_module.DeviceAPI),
    "TorchCudaAPI": (device_module.TorchCudaAPI, device_module.DeviceAPI),  # the real ones, same protocol
    "TorchXpuAPI": (device_module.TorchXpuAPI, device_module.DeviceAPI),
    "graph_steps.Meta": (Meta, MetadataOwner),
}


@pytest.mark.parametrize("name", sorted(CLASS_DOUBLES))
def test_class_doubles_match_what_they_replace(name: str) -> None:
    double, real = CLASS_DOUBLES[name]
    assert signature_drift(double, real) == []


def _backend_doubles() -> list[type[AttentionBackend]]:
    modules = (broken_backends, lying_backends, mutants)
    return [cls for m in modules for cls in vars(m).values()
            if isinstance(cls, type) and issubclass(cls, AttentionBackend) and cls.__module__ == m.__name__]


def test_backend_doubles_override_with_the_contracts_signatures() -> None:
    """Every backend double's override of a public contract method takes its parameters."""
    contract = {n for n in vars(AttentionBackend) if not n.startswith("_")}
    doubles = _backend_doubles()
    assert len(doubles) >= 4
    drift = {cls.__name__: signature_drift(cls, AttentionBackend, sorted(contract & set(vars(cls))))
             for cls in doubles}
    assert {name: d for name, d in drift.items() if d} == {}


def test_signature_drift_catches_a_planted_double() -> None:
    """A fake device whose ``capture_begin`` lost ``mode`` (as the ``new_graph`` spy lacked ``device=``)."""
    class OldDevice(FakeDevice):
        def capture_begin(self, graph: object, pool: object | None) -> None:  # type: ignore[override]
            pass

    drift = signature_drift(OldDevice, device_module.DeviceAPI)
    assert len(drift) == 1 and drift[0].startswith("capture_begin: OldDevice(self, graph") and "mode" in drift[0]


def test_stand_ins_refuse_what_the_real_function_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound to ``new_graph``'s signature: defaults applied, an unknown keyword a TypeError."""
    calls = stand_in(monkeypatch, runner_module, "new_graph", lambda bound: bound.arguments["platform"])
    assert runner_module.new_graph("cpu", device="cpu") == "cpu"
    assert calls[0].arguments["pool"] is None and calls[0].arguments["warmup_iters"] == 1
    with pytest.raises(TypeError, match="stream"):
        runner_module.new_graph("cpu", stream=None)


def test_a_spy_forwards_to_the_real_function(monkeypatch: pytest.MonkeyPatch) -> None:
    real = runner_module.new_graph
    calls = spy(monkeypatch, runner_module, "new_graph")
    graph = runner_module.new_graph("cpu", device="cpu")
    assert type(graph) is type(real("cpu")) and calls[0].arguments["device"] == "cpu"


def test_only_attnhal_warnings_are_kept() -> None:
    """torch 2.11 warns "Synchronization debug mode is a prototype feature" during capture."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("Synchronization debug mode is a prototype feature", UserWarning)
        warnings.warn("phase=decode: capture failed", GraphCaptureWarning)
        warnings.warn("deprecated", DeprecationWarning)
    assert attnhal_warnings(caught) == [GraphCaptureWarning]
