"""Every tensor a Triton launch reads is on ``q``'s device, checked in every mode.

On a GPU, prefill with sinks failed inside Triton's launcher ("Pointer argument (at 15)
cannot be accessed from Triton (cpu tensor?)"): the config's sinks stayed on the host.
The interpreter reads host tensors, so CPU CI never saw it. These tests run the check
the ops carry (:mod:`attnhal_triton.arg_devices`) on CPU: each tensor argument of each
op moved to another device (``meta``) is named with both devices, and the issue's
failing example runs through the check.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch
from triton_cases import TritonCase, assert_close, build, expected, record_launches, run, shape

from attnhal.phases import Phase
from attnhal.testing.cases import CaseRecipe
from attnhal_triton import arg_devices, ops

#: Each op's launches come from these phases: prefill (one-pass extend with sinks), decode
#: (partials, then the reduce with sinks), target_verify (split extend with its tree).
PHASES = (Phase.PREFILL, Phase.DECODE, Phase.TARGET_VERIFY)
ANCHORS = {"decode_partial": "q", "decode_reduce": "out", "extend": "q"}

#: The example that falsified ``feature[sinks]`` on an H200 (issue 34).
ISSUE_34 = CaseRecipe(Phase.PREFILL, prefix_lens=(0, 9, 5), new_lens=(6, 3, 0), num_layers=2, layer=1,
                      slot_seed=7, seed=1, sinks=True)


def _launches() -> list[tuple[str, dict[str, Any]]]:
    """(op name, bound arguments) of each launch of one forward per phase in :data:`PHASES`."""
    out = []
    for phase in PHASES:
        case, backend = build(shape(phase, sinks=True, lens=(9, 3)))
        for op, args, kwargs in record_launches(case, backend):
            name = op._name.split("::")[-1]
            out.append((name, dict(inspect.signature(op._init_fn).bind(*args, **kwargs).arguments)))
    return out


LAUNCHES = _launches()


def test_every_op_launches_in_these_phases() -> None:
    assert {name for name, _ in LAUNCHES} == set(ANCHORS) == set(ops.__all__)


@pytest.mark.parametrize("index", range(len(LAUNCHES)))
def test_each_tensor_argument_elsewhere_is_named_with_both_devices(index: int) -> None:
    """Every tensor argument, moved alone to ``meta``: the op refuses, naming it, ``meta``
    and ``q``'s device. The op's signature lists the arguments: none can be left out."""
    name, arguments = LAUNCHES[index]
    op, anchor = getattr(ops, name), ANCHORS[name]
    tensors = [arg for arg, value in arguments.items() if isinstance(value, torch.Tensor)]
    assert anchor in tensors and len(tensors) >= 5
    for arg in tensors:
        moved = {**arguments, arg: arguments[arg].to("meta")}
        if arg == anchor:  # the anchor moved: the first other tensor is the one named
            first = next(a for a in tensors if a != anchor)
            want = f"{first}.device=cpu (supported: {anchor}'s device meta"
        else:
            want = f"{arg}.device=meta (supported: {anchor}'s device cpu"
        with pytest.raises(ValueError, match=rf"^{name}: {want.replace('(', '[(]')}"):
            op(**moved)  # mixed devices dispatch to the fake: it checks too (torch.compile's route)
        with pytest.raises(ValueError, match=rf"^{name}: {want.replace('(', '[(]')}"):
            op._init_fn(**moved)  # the real launch's own check, before any kernel


def test_the_check_compares_devices_only() -> None:
    """Devices are compared as objects (no sync); ``None`` and scalars pass."""
    cpu = torch.zeros(1)
    arg_devices.check_one_device("op", "q", {"q": cpu, "sinks": None, "window": -1, "k": torch.ones(2)})
    with pytest.raises(ValueError, match=r"^op: k.device=meta \(supported: q's device cpu"):
        arg_devices.check_one_device("op", "q", {"q": cpu, "k": torch.ones(2, device="meta")})
    with pytest.raises(TypeError, match="no argument 'q'"):
        arg_devices.on_one_device("q")(lambda out: None)


def test_issue_34_sinks_example_runs_through_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's failing prefill: every launch checked (all on ``q``'s device), the output
    the oracle's; with the sinks left on another device (the defect), the op names them."""
    case, backend = build(TritonCase(ISSUE_34))
    checked: list[tuple[str, set[torch.device]]] = []
    real = arg_devices.check_one_device

    def spy(op: str, anchor: str, arguments: Any) -> None:
        checked.append((op, {v.device for v in arguments.values() if isinstance(v, torch.Tensor)}))
        real(op, anchor, arguments)

    monkeypatch.setattr(arg_devices, "check_one_device", spy)
    assert_close(backend, run(case, backend), expected(case, backend))
    assert checked == [("extend", {torch.device("cpu")})]

    assert backend.config.sinks is not None
    backend.config = dataclasses.replace(backend.config, sinks=backend.config.sinks.to("meta"))
    with pytest.raises(ValueError, match=r"^extend: sinks.device=meta \(supported: q's device cpu"):
        run(case, backend)
