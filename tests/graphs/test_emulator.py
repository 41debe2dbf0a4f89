"""The graph layer's capture primitives: the CPU emulator and the device graph."""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnhal.graphs import CaptureError, DeviceGraph, EmulatedGraph, Graph, new_graph
from attnhal.graphs.emulator import OpKind
from attnhal.platform import GraphKind, parse


@torch.library.custom_op("attnhal_graphs_test::affine_into", mutates_args=("out",))
def affine_into(out: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    # Several aten ops inside: the recorder must see only the custom op.
    out.copy_(x * scale + 1.0)


def _capture_fails(fn: Callable[[], object], op: str) -> None:
    with pytest.raises(CaptureError, match=op) as info:
        EmulatedGraph().capture(fn)
    assert "cannot be captured in a graph" in str(info.value)


# ---------------------------------------------------------------- host syncs

x4 = torch.arange(4.0)


@pytest.mark.parametrize(
    ("fn", "op"),
    [
        (lambda: x4.sum().item(), "_local_scalar_dense"),
        (lambda: int(x4[0]), "_local_scalar_dense"),
        (lambda: bool(x4.any()), "_local_scalar_dense"),
        (lambda: 1 if (x4 > 2).any() else 0, "_local_scalar_dense"),
        (lambda: torch.equal(x4, x4), "equal"),
        (lambda: x4.nonzero(), "nonzero"),
        (lambda: torch.where(x4 > 1), "nonzero"),
        (lambda: x4.masked_select(x4 > 1), "masked_select"),
        (lambda: torch.unique(x4), "unique"),
        (lambda: x4.repeat_interleave(torch.tensor([1, 2, 0, 1])), "repeat_interleave"),
        (lambda: x4[x4 > 1], "aten.index.Tensor"),
        (lambda: x4.clone().__setitem__(x4 > 1, torch.ones(2)), "index_put"),
    ],
    ids=["item", "int", "bool", "if-any", "equal", "nonzero", "where1", "masked_select",
         "unique", "repeat_interleave", "mask-index", "mask-store"],
)
def test_host_syncs_and_dynamic_shapes_raise(fn: Callable[[], object], op: str) -> None:
    _capture_fails(fn, op)


@pytest.mark.parametrize("name", ["tolist", "numpy"])
def test_host_copies_raise_and_patch_is_restored(name: str) -> None:
    original, own = getattr(torch.Tensor, name), torch.Tensor.__dict__.get(name)
    _capture_fails(lambda: getattr(x4, name)(), f"Tensor.{name}")
    assert getattr(torch.Tensor, name) is original
    assert torch.Tensor.__dict__.get(name) is own
    EmulatedGraph().capture(lambda: x4 + 1)  # a capture that succeeds restores it too
    assert getattr(torch.Tensor, name) is original
    assert x4.tolist() == [0.0, 1.0, 2.0, 3.0] and x4.numpy().shape == (4,)


def test_static_forms_are_accepted() -> None:
    t = x4.clone()

    def fn() -> None:
        t[t > 2] = 0.0  # ATen turns this into masked_fill_: no sync
        t.add_(x4[torch.tensor([0, 2, 1, 1])])
        t.sub_(x4.repeat_interleave(torch.tensor([1, 2, 0, 1]), output_size=4))

    g = EmulatedGraph()
    g.capture(fn)
    assert [op.name for op in g.recorded_ops if op.kind is OpKind.MUTATING] == [
        "aten::index_put_", "aten::add_", "aten::sub_"
    ]


def test_capture_runs_under_no_grad() -> None:
    w = torch.ones(3, requires_grad=True)
    seen: list[bool] = []

    def fn() -> torch.Tensor:
        seen.append(torch.is_grad_enabled())
        return w * 2

    out = EmulatedGraph().capture(fn)
    assert seen == [False] and not out.requires_grad


def test_new_graph_kinds() -> None:
    """The platform (or its name) decides; a kind string is no platform."""
    cuda = dataclasses.replace(parse("cuda:sm90"), graph_kind=GraphKind.DEVICE)
    assert isinstance(new_graph("cpu"), EmulatedGraph)
    assert isinstance(new_graph(cuda), DeviceGraph)  # constructing touches no GPU
    with pytest.raises(ValueError, match="graph_kind='none' on platform cpu"):
        new_graph(dataclasses.replace(parse("cpu"), graph_kind=GraphKind.NONE))
    with pytest.raises(ValueError, match="platform='emulated'"):
        new_graph("emulated")


# ------------------------------------------------------ replay equals eager


def _chain_inputs(
    b: int, d: int, k: int, slots: int, seed: int, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = {
        "x": torch.randn(b, d, generator=g),
        "w": torch.randn(d, 2 * k, generator=g),
        "idx": torch.randint(0, b, (b,), generator=g),
        "slot": torch.randperm(slots, generator=g)[:b],
    }
    return {name: v.to(device) for name, v in t.items()}


def _mlp_chain(s: dict[str, torch.Tensor], buf: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """matmul, softmax, views, index-tensor indexing, index_select, scatter,
    index_copy_ into a pre-allocated buffer."""
    x, w, idx, slot = s["x"], s["w"], s["idx"], s["slot"]
    b, k2 = x.shape[0], w.shape[1]
    h = torch.softmax(x @ w, dim=-1)
    h = h.view(b, k2 // 2, 2).transpose(1, 2).reshape(b, k2)
    gathered = h[idx] + torch.index_select(h, 0, idx.flip(0))
    scattered = torch.zeros_like(h).scatter_add(0, idx[:, None].expand(b, k2), gathered)
    buf.index_copy_(0, slot, scattered.relu())
    return h, gathered, scattered


def _check_replay_equals_eager(
    graph: Graph, b: int, d: int, k: int, seed: int, device: str
) -> None:
    slots = b + 2
    static = _chain_inputs(b, d, k, slots, seed, device)
    buf = torch.zeros(slots, 2 * k, device=device)
    outs = graph.capture(lambda: _mlp_chain(static, buf))

    for name, new in _chain_inputs(b, d, k, slots, seed + 1, device).items():
        static[name].copy_(new)  # the only way to feed a graph: in place
    buf.zero_()
    graph.replay()
    replayed = [o.clone() for o in outs] + [buf.clone()]

    buf.zero_()
    expected = list(_mlp_chain(static, buf)) + [buf]
    for got, want in zip(replayed, expected):
        torch.testing.assert_close(got, want)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 5), d=st.integers(1, 6), k=st.integers(1, 4), seed=st.integers(0, 2**16)
)
def test_replay_equals_eager(b: int, d: int, k: int, seed: int) -> None:
    _check_replay_equals_eager(EmulatedGraph(), b, d, k, seed, "cpu")


def test_outputs_are_static_and_views_follow_their_base() -> None:
    x = torch.zeros(2, 3)
    g = EmulatedGraph()
    out, view = g.capture(lambda: (x * 2, x.t()))
    x.copy_(torch.ones(2, 3))
    g.replay()
    assert torch.equal(out, torch.full((2, 3), 2.0)) and torch.equal(view, torch.ones(3, 2))
    kinds = {op.name: op.kind for op in g.recorded_ops}
    assert kinds == {"aten::mul": OpKind.FUNCTIONAL, "aten::t": OpKind.VIEW}


# ----------------------------------------------------------- stale metadata


def test_host_value_is_frozen_at_capture() -> None:
    """A length read on the host at capture is baked into the recorded slice,
    exactly as a real graph bakes it into the kernel's launch arguments."""
    x = torch.arange(8.0)
    lengths_cpu = torch.tensor([5])
    lengths_list = lengths_cpu.tolist()  # host metadata, read before capture
    g = EmulatedGraph()
    out = g.capture(lambda: x[: int(lengths_list[0])].sum(0, keepdim=True))

    x.copy_(torch.arange(8.0) * 10)
    lengths_cpu.fill_(3)
    lengths_list[0] = 3  # the engine updated its host metadata ...
    g.replay()
    # ... but the graph still sums 5 elements: the stale result a real graph gives.
    assert out.item() == (torch.arange(8.0) * 10)[:5].sum().item()
    assert out.item() != (torch.arange(8.0) * 10)[:3].sum().item()


# ------------------------------------------------------- replay allocations


def test_functional_ops_allocate_at_replay() -> None:
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    g = EmulatedGraph()
    g.capture(lambda: torch.relu(x @ w) + 1)
    assert g.replay_allocations == 0  # nothing replayed yet
    g.replay()
    assert g.replay_allocations == 3  # mm, relu, add


def test_out_and_in_place_writes_allocate_nothing() -> None:
    x, w, idx = torch.randn(3, 4), torch.randn(4, 5), torch.tensor([2, 0])
    mm_out, sel_out, buf = torch.empty(3, 5), torch.empty(2, 5), torch.empty(2, 5)

    def fn() -> None:
        torch.mm(x, w, out=mm_out)
        mm_out.relu_().add_(1)
        torch.index_select(mm_out, 0, idx, out=sel_out)
        buf.copy_(sel_out.view(2, 5))
        buf[:, :2].mul_(2)

    g = EmulatedGraph()
    g.capture(fn)
    x.copy_(torch.randn(3, 4))
    g.replay()
    assert g.replay_allocations == 0
    expected = (torch.relu(x @ w) + 1)[idx]
    expected[:, :2] *= 2
    torch.testing.assert_close(buf, expected)


def test_uninitialized_allocations_are_pool_not_replayed() -> None:
    x = torch.randn(4)
    g = EmulatedGraph()
    out = g.capture(lambda: torch.mul(x, 3, out=torch.empty(4)))
    x.copy_(torch.ones(4))
    g.replay()
    assert g.replay_allocations == 0 and torch.equal(out, torch.full((4,), 3.0))
    assert [op.kind for op in g.recorded_ops] == [OpKind.ALLOC, OpKind.MUTATING]


# ---------------------------------------------------------------- custom ops


def test_custom_op_is_one_op_and_reruns_at_replay() -> None:
    x, out = torch.randn(6), torch.zeros(6)
    g = EmulatedGraph()
    g.capture(lambda: affine_into(out, x, 2.0))
    assert [op.name for op in g.recorded_ops] == ["attnhal_graphs_test::affine_into"]
    assert g.recorded_ops[0].kind is OpKind.MUTATING

    x.copy_(torch.arange(6.0))
    g.replay()
    torch.testing.assert_close(out, torch.arange(6.0) * 2.0 + 1.0)
    assert g.replay_allocations == 0


def test_random_ops_are_redrawn() -> None:
    g = EmulatedGraph()
    out = g.capture(lambda: torch.rand(64))
    first = out.clone()
    g.replay()
    assert not torch.equal(out, first)


# -------------------------------------------------------------- device graph


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or HIP device")
@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 6, 3)])
def test_device_graph_replay_equals_eager(shape: tuple[int, int, int]) -> None:
    graph = new_graph(dataclasses.replace(parse("cuda:sm90"), graph_kind=GraphKind.DEVICE), device="cuda",
                      pool=torch.cuda.graph_pool_handle())
    _check_replay_equals_eager(graph, *shape, seed=7, device="cuda")
    assert graph.replay_allocations == 0 and graph.pool is not None
