"""Toy decode backends for graph-safety tests: one correct, three each broken in one way.

All four compute the same real decode attention in plain torch (gather the row's
KV slots through ``pool.req_to_token``, masked softmax, weighted sum of V; GQA),
so eager results agree; they differ only in what happens under a graph:

* :class:`ToyDecode` — correct: a fixed context window (``pool.max_context_len``) and every
  op writing into buffers sized in ``init_graph_state`` (``out=``, in place).
  Caught by nothing: replay == eager and ``replay_allocations == 0``.
* :class:`HostSyncDecode` — reads the longest sequence with ``.item()`` inside ``forward``,
  a device-to-host sync. Caught at capture: ``CaptureError`` naming
  ``aten._local_scalar_dense`` (emulator) or ``"device graph capture"`` (real graph).
* :class:`StaleLenDecode` — computes the context length as a Python int in
  ``init_*_metadata`` (legal there) and slices with it in ``forward``: the graph freezes
  the capture-time value (``captured_len``, the fill value). Caught by replay != eager.
* :class:`AllocatingDecode` — functional ops (``torch.cat``, indexing, ``softmax``) make
  fresh tensors on every run. Caught by ``replay_allocations > 0`` (emulator only;
  replay == eager).

:data:`BROKEN` maps the check that must catch each broken backend to its class.

They are importable helpers (``from broken_backends import ...`` with ``tests/doubles/`` on
``sys.path``, as pytest arranges) for the graph runner tests and the conformance
kit. :func:`make_pool`, :func:`decode_batch` and :func:`phase_batch` build a KV
pool with random K/V and valid batches of every uniform phase over it;
:func:`release` gives a batch's rows and slots back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from attnhal.backend import PADDING_SLOT, AttentionBackend, AttentionConfig, ForwardBatch, KVPool, SpecInfo
from attnhal.capabilities import BackendCapabilities, SpecLimits
from attnhal.graphs.runner import tokens_per_row
from attnhal.phases import Phase
from attnhal.platform import Vendor
from attnhal.spec import SpecConfig

__all__ = [
    "BROKEN",
    "AllocatingDecode",
    "HostSyncDecode",
    "StaleLenDecode",
    "ToyDecode",
    "batch_to",
    "decode_batch",
    "make_pool",
    "phase_batch",
    "reference_decode",
    "release",
]


def _caps(name: str) -> BackendCapabilities:
    # The descriptor claims decode graphs: the claim the conformance kit must disprove.
    return BackendCapabilities(name=name, vendors=frozenset(Vendor), phases=frozenset({Phase.DECODE}),
                               graph={Phase.DECODE: SpecLimits()}, dtypes=frozenset({"float32"}),
                               head_sizes=frozenset({8, 16, 32, 64, 128}))


class _Workspace:
    """Flat buffers handing out contiguous views for ``bs`` rows and ``ctx`` positions.

    Eager forwards get a fresh exact-size workspace; graph mode gets one sized by
    ``init_graph_state`` and every captured size reads views of it.
    """

    def __init__(self, rows: int, ctx: int, config: AttentionConfig, pool: KVPool) -> None:
        kvh, d, g = config.num_kv_heads, config.head_size, config.group_size
        dev, dt = pool.device, config.dtype

        def flat(n: int, dtype: torch.dtype = dt) -> torch.Tensor:
            return torch.empty(n, dtype=dtype, device=dev)

        self.slots = flat(rows * ctx, torch.int32)
        self.k, self.v = flat(rows * ctx * kvh * d), flat(rows * ctx * kvh * d)
        self.prod = flat(rows * ctx * kvh * g * d)
        self.scores = flat(rows * ctx * kvh * g)
        self.pad = flat(rows * ctx, torch.bool)
        self.stat = flat(rows * kvh * g)
        self.out = [flat(rows * kvh * g * d) for _ in range(pool.num_layers)]
        self.pos = torch.arange(ctx, device=dev)


def _v(buf: torch.Tensor, *shape: int) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return buf[:n].view(shape)


def decode_into(ws: _Workspace, q: torch.Tensor, pool: KVPool, layer: int, batch: ForwardBatch,
                ctx: int, scale: float) -> torch.Tensor:
    """Decode attention writing only into ``ws`` (``out=`` and in-place ops: no allocation).

    ``q``: ``[bs, num_q_heads, head_size]``; attends positions ``[0, min(seq_lens, ctx))``.
    Returns ``[bs, num_q_heads, head_size]``, a view of ``ws``.
    """
    bs, (kvh, d) = batch.batch_size, pool.k[layer].shape[1:]
    g = q.shape[1] // kvh
    slots = _v(ws.slots, bs, ctx)
    torch.index_select(pool.req_to_token[:, :ctx], 0, batch.req_pool_indices, out=slots)
    k, v = _v(ws.k, bs * ctx, kvh, d), _v(ws.v, bs * ctx, kvh, d)
    torch.index_select(pool.k[layer], 0, slots.view(-1), out=k)
    torch.index_select(pool.v[layer], 0, slots.view(-1), out=v)
    prod = _v(ws.prod, bs, ctx, kvh, g, d)
    torch.mul(q.view(bs, 1, kvh, g, d), k.view(bs, ctx, kvh, 1, d), out=prod)
    scores = _v(ws.scores, bs, ctx, kvh, g)
    torch.sum(prod, dim=-1, out=scores)
    scores.mul_(scale)
    pad = _v(ws.pad, bs, ctx)
    torch.ge(ws.pos[:ctx].view(1, ctx), batch.seq_lens.view(bs, 1), out=pad)
    scores.masked_fill_(pad.view(bs, ctx, 1, 1), float("-inf"))
    stat = _v(ws.stat, bs, 1, kvh, g)
    torch.amax(scores, dim=1, keepdim=True, out=stat)
    scores.sub_(stat).exp_()
    torch.sum(scores, dim=1, keepdim=True, out=stat)
    scores.div_(stat)
    torch.mul(scores.view(bs, ctx, kvh, g, 1), v.view(bs, ctx, kvh, 1, d), out=prod)
    out = _v(ws.out[layer], bs, kvh, g, d)
    torch.sum(prod, dim=1, out=out)
    return out.view(bs, kvh * g, d)


class ToyDecode(AttentionBackend):
    """Correct and graph-safe: a fixed context window, all work in preallocated buffers."""

    capabilities = _caps("toy")

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        super().__init__(config, pool, **kwargs)
        self._static: _Workspace | None = None
        self._ws: _Workspace | None = None

    def context_len(self, batch: ForwardBatch) -> int:
        """Positions gathered per row. Fixed: a graph may bake it in."""
        return self.pool.max_context_len

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._ws = _Workspace(batch.batch_size, self.context_len(batch), self.config, self.pool)

    def init_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self._static = _Workspace(max_bs, self.pool.max_context_len, self.config, self.pool)

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        self._ws = self._static

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        self._ws = self._static  # the graph reads the runner's static batch directly

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        if self._ws is None:
            raise RuntimeError("forward before init_forward_metadata / init_capture_metadata")
        return decode_into(self._ws, q, self.pool, layer, batch, self.context_len(batch),
                           self.config.sm_scale)


class HostSyncDecode(ToyDecode):
    """Broken: sizes the context from ``seq_lens.max().item()`` inside ``forward``.

    Eager is correct. Capture raises: the emulator's :class:`~attnhal.graphs.CaptureError`
    names ``aten._local_scalar_dense``; a device graph fails in the driver (the
    stream is capturing), re-raised as ``CaptureError("device graph capture")``.
    """

    capabilities = _caps("toy-host-sync")

    def context_len(self, batch: ForwardBatch) -> int:
        # the bug: a device-to-host sync (an empty batch has no max: one column, no row)
        return int(batch.seq_lens.max().item()) if batch.batch_size else 1


class StaleLenDecode(ToyDecode):
    """Broken: the context length is a Python int computed from host metadata.

    ``init_*_metadata`` run outside the graph, so reading ``seq_lens_cpu`` there is
    legal; but ``forward`` slices with the resulting int, and a graph records that
    slice with the value it had at capture (``captured_len``, from the runner's
    fill value). Replays of longer sequences attend too few positions: replay !=
    eager, although ``init_replay_metadata`` dutifully updates ``self.ctx``.
    """

    capabilities = _caps("toy-stale-len")

    def __init__(self, config: AttentionConfig, pool: KVPool, **kwargs: Any) -> None:
        super().__init__(config, pool, **kwargs)
        self.ctx = pool.max_context_len
        self.captured_len: int | None = None

    def _host_len(self, batch: ForwardBatch) -> int:
        if batch.seq_lens_cpu is None:
            raise ValueError("seq_lens_cpu=None (supported: a host copy of seq_lens)")
        return int(batch.seq_lens_cpu.max()) if batch.batch_size else 1  # empty: one column, no row

    def context_len(self, batch: ForwardBatch) -> int:
        return self.ctx

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.ctx = self._host_len(batch)
        super().init_forward_metadata(batch)

    def init_capture_metadata(self, batch: ForwardBatch) -> None:
        self.ctx = self.captured_len = self._host_len(batch)
        super().init_capture_metadata(batch)

    def init_replay_metadata(self, batch: ForwardBatch) -> None:
        self.ctx = self._host_len(batch)  # too late: the graph holds the capture-time slice
        super().init_replay_metadata(batch)


class AllocatingDecode(ToyDecode):
    """Broken: functional torch ops make fresh tensors on every run.

    Results are right, and a device graph runs it (its allocations come from the
    graph's private pool at capture), but every run allocates and each captured
    size holds its own intermediates; the emulator counts them in
    ``Graph.replay_allocations`` (> 0), which the correct backend keeps at 0.
    """

    capabilities = _caps("toy-allocating")

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        return reference_decode(q, self.pool, layer, batch, self.config.sm_scale)


def reference_decode(q: torch.Tensor, pool: KVPool, layer: int, batch: ForwardBatch,
                     scale: float) -> torch.Tensor:
    """Decode attention with plain functional ops over the fixed context ``pool.max_context_len``.

    ``q``: ``[bs, num_q_heads, head_size]`` -> ``[bs, num_q_heads, head_size]``.
    """
    bs, ctx = batch.batch_size, pool.max_context_len
    kvh = pool.num_kv_heads
    g = q.shape[1] // kvh
    slots = pool.req_to_token[batch.req_pool_indices].long()  # [bs, ctx]
    k = torch.cat([pool.k[layer][slots]], dim=0)  # [bs, ctx, kvh, d], a fresh tensor
    v = pool.v[layer][slots]
    scores = torch.einsum("bhgd,bchd->bhgc", q.view(bs, kvh, g, -1), k) * scale
    pad = torch.arange(ctx, device=q.device)[None, :] >= batch.seq_lens[:, None]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf")).softmax(-1)
    return torch.einsum("bhgc,bchd->bhgd", scores, v).reshape(bs, kvh * g, -1)


#: The broken backends, each with the way a graph check must catch it.
BROKEN: dict[str, type[ToyDecode]] = {
    "capture_error": HostSyncDecode,
    "stale_replay": StaleLenDecode,
    "replay_allocations": AllocatingDecode,
}


# --- fixtures: a pool with random requests, decode batches over it --------------------

def make_pool(config: AttentionConfig, *, num_layers: int = 1, max_reqs: int = 16, max_context_len: int = 32,
              device: str | torch.device = "cpu", seed: int = 0) -> KVPool:
    """A pool of ``max_reqs`` request rows with random K/V in every slot."""
    pool = KVPool(num_layers=num_layers, num_slots=max_reqs * max_context_len, num_kv_heads=config.num_kv_heads,
                  head_dim=config.head_size, dtype=config.dtype, max_reqs=max_reqs,
                  max_context_len=max_context_len, device=device)
    gen = torch.Generator().manual_seed(seed)
    for layer in range(num_layers):
        for cache in (pool.k[layer], pool.v[layer]):
            cache[1:].copy_(torch.randn(cache[1:].shape, generator=gen, dtype=cache.dtype))
    return pool


def decode_batch(pool: KVPool, seq_lens: list[int], *, seed: int = 0) -> ForwardBatch:
    """A decode batch: row ``r`` is a fresh request of ``seq_lens[r]`` tokens, the last one new.

    Request rows and slots are taken from ``pool`` (call ``pool.free_req`` /
    ``free_slots`` to give them back, or make a fresh pool).
    """
    gen = torch.Generator().manual_seed(seed)
    rows, locs = [], []
    for n in seq_lens:
        if not 1 <= n <= pool.max_context_len:
            raise ValueError(f"seq_len={n} (supported: 1..{pool.max_context_len})")
        row = pool.alloc_req()
        slots = pool.alloc_slots(n)
        order = torch.randperm(n, generator=gen).to(pool.device)  # scattered slots, as in a real pool
        pool.req_to_token[row, :n] = slots[order].to(torch.int32)
        rows.append(row)
        locs.append(int(pool.req_to_token[row, n - 1]))
    dev = pool.device
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return ForwardBatch(phase=Phase.DECODE, req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
                        seq_lens=lens.to(dev), out_cache_loc=torch.tensor(locs, dtype=torch.int64, device=dev),
                        seq_lens_cpu=lens)


def phase_batch(pool: KVPool, phase: Phase, spec: SpecConfig, requests: int, *, seed: int = 0) -> ForwardBatch:
    """A valid batch of a uniform ``phase`` for ``requests`` fresh requests with random prefixes.

    Follows :mod:`attnhal.backend.batch`: ``target_verify`` rows hold ``num_draft_tokens``
    new tokens (a random tree ``custom_mask`` when ``topk > 1``); ``draft_extend`` rows
    accept ``1..draft_extend_len`` tokens, the rest of each row padded to
    ``PADDING_SLOT``; ``draft_decode`` has ``topk`` rows (branches) per request, each
    with its own ``draft_path`` slots and ``out_cache_loc = draft_path[:, 0]``.
    """
    gen = torch.Generator().manual_seed(seed)
    t = 1 if phase in (Phase.DECODE, Phase.DRAFT_DECODE) else tokens_per_row(phase, spec)
    room = {Phase.DECODE: 1, Phase.DRAFT_DECODE: 0}.get(phase, t)
    if pool.max_context_len - room < 1:
        raise ValueError(f"max_context_len={pool.max_context_len} (supported: > {room} for {phase.value})")
    rows, lens, locs, ext, paths = [], [], [], [], []
    for _ in range(requests):
        prefix = int(torch.randint(1, pool.max_context_len - room + 1, (1,), generator=gen))
        new = int(torch.randint(1, t + 1, (1,), generator=gen)) if phase is Phase.DRAFT_EXTEND else room
        row, n = pool.alloc_req(), prefix + new
        slots = pool.alloc_slots(n)
        pool.req_to_token[row, :n] = slots[torch.randperm(n, generator=gen).to(pool.device)].to(torch.int32)
        table = pool.req_to_token[row].tolist()
        if phase is Phase.DRAFT_DECODE:
            for _ in range(spec.topk):
                path = pool.alloc_slots(spec.num_steps)
                rows.append(row)
                lens.append(prefix)
                paths.append(path)
                locs.append(int(path[0]))
            continue
        rows.append(row)
        lens.append(n)
        ext.append(new)
        locs += table[prefix:n] + [PADDING_SLOT] * (t - new)
    dev = pool.device
    info = None if phase is Phase.DECODE else SpecInfo(
        topk=spec.topk, num_draft_tokens=spec.num_draft_tokens, draft_extend_len=spec.draft_extend_len,
        draft_path=torch.stack(paths) if paths else None,
        custom_mask=_tree_masks(len(rows), t, gen).to(dev) if phase is Phase.TARGET_VERIFY and spec.topk > 1
        else None)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return ForwardBatch(phase=phase, req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
                        seq_lens=lens_t.to(dev), out_cache_loc=torch.tensor(locs, dtype=torch.int64, device=dev),
                        extend_lens=torch.tensor(ext, dtype=torch.int32, device=dev)
                        if phase is Phase.DRAFT_EXTEND else None,
                        seq_lens_cpu=lens_t, spec=info)


def _tree_masks(rows: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """Random tree masks ``[rows, t, t]``: each draft token sees itself and some earlier ones."""
    return (torch.rand(rows, t, t, generator=gen) < 0.5).tril() | torch.eye(t, dtype=torch.bool)


def release(pool: KVPool, batch: ForwardBatch) -> None:
    """Give ``batch``'s request rows, their slots and any draft-path slots back to ``pool``."""
    longest: dict[int, int] = {}
    for row, n in zip(batch.req_pool_indices.tolist(), batch.seq_lens.tolist()):
        longest[row] = max(n, longest.get(row, 0))
    for row, n in longest.items():
        pool.free_slots(pool.req_to_token[row, :n].long())
        pool.free_req(row)
    if batch.spec is not None and batch.spec.draft_path is not None:
        pool.free_slots(batch.spec.draft_path.flatten())


def batch_to(batch: ForwardBatch, device: str | torch.device) -> ForwardBatch:
    """``batch`` with its device tensors moved to ``device`` (host copies stay on the host)."""
    def to(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    spec = batch.spec and replace(batch.spec, custom_mask=to(batch.spec.custom_mask),
                                  draft_path=to(batch.spec.draft_path))
    return replace(batch, req_pool_indices=batch.req_pool_indices.to(device), seq_lens=batch.seq_lens.to(device),
                   out_cache_loc=batch.out_cache_loc.to(device), extend_lens=to(batch.extend_lens), spec=spec)
