"""Debug-mode validation of a :class:`~attnhal.backend.ForwardBatch`.

Off by default: the checks read tensors on the host (a device sync), which a
hot loop cannot afford and a captured graph cannot contain. Turn them on with
``attnhal.backend.set_debug(True)`` or ``ATTNHAL_DEBUG=1``. The base
``AttentionBackend`` then calls :func:`maybe_validate_forward` in ``forward`` and
:func:`maybe_validate_batch` in ``init_capture_metadata``; a backend calls
:func:`maybe_validate_batch` in its ``init_forward_metadata``. Both stay silent
while a graph is being captured.

Every error is a :class:`BatchValidationError` written ``field=value (supported: ...)``,
naming the offending element, e.g. ``seq_lens[3]=-1 (supported: >= 0)``.

An empty batch (``bs = 0``, no query tokens) is valid in every phase: an idle
data-parallel rank runs forwards without requests; ``forward`` returns an empty output.

Padded rows of a captured batch (``req_pool_indices[r] == PADDING_REQ``) only get
the range checks: their seq len is the backend's fill value and their tokens
write to the padding slot, whatever the phase would ask of a real row.
"""

from __future__ import annotations

import os

import torch

from attnhal.backend.batch import ForwardBatch
from attnhal.backend.config import AttentionConfig
from attnhal.backend.kv_pool import PADDING_REQ, KVPool
from attnhal.errors import AttnhalError
from attnhal.phases import Phase

__all__ = [
    "ENV_VAR",
    "BatchValidationError",
    "debug_enabled",
    "maybe_validate_batch",
    "maybe_validate_forward",
    "set_debug",
    "validate_batch",
    "validate_forward",
]

ENV_VAR = "ATTNHAL_DEBUG"
_override: bool | None = None


def set_debug(enabled: bool | None) -> None:
    """Turn debug validation on or off; ``None`` defers to ``ATTNHAL_DEBUG`` again."""
    global _override
    _override = enabled


def debug_enabled() -> bool:
    """Whether debug validation is on (``set_debug`` wins over ``ATTNHAL_DEBUG``)."""
    if _override is not None:
        return _override
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on")


def _capturing() -> bool:
    """True while a graph is (or may be) recording: host reads must not happen.

    A device graph is seen through torch's capture query (also on ROCm); the CPU
    emulator and other tracers run under a TorchDispatchMode.
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is not None:
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class BatchValidationError(AttnhalError, ValueError):
    """A batch field with a value the backend does not accept.

    Attributes: ``field`` (e.g. ``"seq_lens[3]"``), ``value``, ``supported``.
    """

    def __init__(self, field: str, value: object, supported: str) -> None:
        self.field, self.value, self.supported = field, value, supported
        super().__init__(f"{field}={value} (supported: {supported})")


def maybe_validate_batch(batch: ForwardBatch, pool: KVPool, config: AttentionConfig | None = None) -> None:
    """:func:`validate_batch` when debug is on and no graph is being captured."""
    if debug_enabled() and not _capturing():
        validate_batch(batch, pool, config)


def maybe_validate_forward(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                           layer: int, batch: ForwardBatch, pool: KVPool,
                           config: AttentionConfig) -> None:
    """:func:`validate_forward` when debug is on and no graph is being captured."""
    if debug_enabled() and not _capturing():
        validate_forward(q, k, v, layer, batch, pool, config)


# --- forward -------------------------------------------------------------------------

def validate_forward(q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                     layer: int, batch: ForwardBatch, pool: KVPool, config: AttentionConfig) -> None:
    """Check one ``forward`` call: layer, q/k/v shapes, dtypes, devices, then the batch.

    ``q``: ``[num_tokens, num_q_heads, head_size]``; ``k``: ``[num_tokens, num_kv_heads, head_size]``
    and ``v``: ``[num_tokens, num_kv_heads, v_head_size]``, or both None.
    """
    if not 0 <= layer < pool.num_layers:
        raise BatchValidationError("layer", layer, f"0..{pool.num_layers - 1}, layers of the pool")
    for name, have, want in (("config.num_kv_heads", config.num_kv_heads, pool.num_kv_heads),
                             ("config.head_size", config.head_size, pool.head_dim),
                             ("config.v_head_size", config.out_head_size, pool.v_head_dim)):
        if have != want:
            raise BatchValidationError(name, have, f"{want}, as the KV pool")
    n = batch.num_tokens
    _check_tensor("q", q, (n, config.num_q_heads, config.head_size), _FLOATS, pool.device)
    if (k is None) != (v is None):
        raise BatchValidationError("k" if k is None else "v", None, "k and v both tensors or both None")
    if k is not None and v is not None:
        for name, t, size in (("k", k, config.head_size), ("v", v, config.out_head_size)):
            _check_tensor(name, t, (n, config.num_kv_heads, size), _FLOATS, pool.device)
    validate_batch(batch, pool, config)


# --- batch ------------------------------------------------------------------------------

_INTS = (torch.int32, torch.int64)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def validate_batch(batch: ForwardBatch, pool: KVPool, config: AttentionConfig | None = None) -> None:
    """Check shapes, dtypes, devices and value ranges of ``batch`` against ``pool``.

    Follows the per-phase layout of :mod:`attnhal.backend.batch`; raises
    :class:`BatchValidationError` on the first problem. Reads tensors on the host.
    """
    if not isinstance(batch.phase, Phase):
        raise BatchValidationError("phase", batch.phase, ", ".join(p.value for p in Phase))
    _check_tensor("req_pool_indices", batch.req_pool_indices, None, _INTS, pool.device, ndim=1)
    bs = batch.batch_size  # 0 is a batch too: an idle data-parallel rank runs forwards without requests
    rows = pool.req_to_page.shape[0]
    _check_range("req_pool_indices", batch.req_pool_indices, 0, rows - 1,
                 f"0..{rows - 1}, rows of pool.req_to_page")
    _check_tensor("seq_lens", batch.seq_lens, (bs,), _INTS, pool.device)
    _check_range("seq_lens", batch.seq_lens, 0, pool.max_context_len, f"0..{pool.max_context_len}")
    if batch.seq_lens_cpu is not None:
        _check_host_copy("seq_lens_cpu", batch.seq_lens_cpu, batch.seq_lens)
    _check_tensor("out_cache_loc", batch.out_cache_loc, None, _INTS, pool.device, ndim=1)
    _check_range("out_cache_loc", batch.out_cache_loc, 0, pool.max_slot,
                 f"0..{pool.max_slot}, slots of the pool")
    if batch.phase in _SPEC_PHASES and batch.spec is None:
        raise BatchValidationError("spec", None, f"a SpecInfo for phase={batch.phase.value}")
    _PHASE_CHECKS[batch.phase](batch, pool, bs)


def _check_prefill(batch: ForwardBatch, pool: KVPool, bs: int) -> None:
    ext = _extend_lens(batch, bs)
    seq = batch.seq_lens.tolist()
    for r in range(bs):
        if not 0 <= ext[r] <= seq[r]:
            raise BatchValidationError(f"extend_lens[{r}]", ext[r], f"0..seq_lens[{r}]={seq[r]}")
    if batch.extend_lens_cpu is not None:
        if list(batch.extend_lens_cpu) != ext:
            raise BatchValidationError("extend_lens_cpu", list(batch.extend_lens_cpu),
                                       f"{ext}, equal to extend_lens")
    _check_num_tokens(batch, sum(ext), f"sum(extend_lens) = {sum(ext)} for prefill")
    _check_new_slots(batch, pool, [s - e for s, e in zip(seq, ext)], ext)


def _check_decode(batch: ForwardBatch, pool: KVPool, bs: int) -> None:
    _check_num_tokens(batch, bs, f"bs = {bs}, one token per row for decode")
    seq = _at_least("seq_lens", batch.seq_lens, 1, "the new token is part of the row", batch)
    _check_new_slots(batch, pool, [s - 1 for s in seq], [1] * bs)


def _check_target_verify(batch: ForwardBatch, pool: KVPool, bs: int) -> None:
    spec = batch._spec()
    T = spec.num_draft_tokens
    if T < 1:
        raise BatchValidationError("spec.num_draft_tokens", T, ">= 1")
    _check_num_tokens(batch, bs * T, f"bs {bs} x num_draft_tokens {T} for target_verify")
    seq = _at_least("seq_lens", batch.seq_lens, T,
                    f"num_draft_tokens={T}: the draft tokens are part of the row", batch)
    mask = spec.custom_mask
    if mask is None and spec.topk > 1:
        raise BatchValidationError("spec.custom_mask", None, f"a [bs, T, T] bool tree mask when topk={spec.topk} > 1")
    if mask is not None:
        _check_tensor("spec.custom_mask", mask, (bs, T, T), (torch.bool,), pool.device)
    _check_new_slots(batch, pool, [s - T for s in seq], [T] * bs, per_row=T)


def _check_draft_extend(batch: ForwardBatch, pool: KVPool, bs: int) -> None:
    spec = batch._spec()
    T = spec.draft_extend_len
    if T < 1:
        raise BatchValidationError("spec.draft_extend_len", T, ">= 1")
    _check_num_tokens(batch, bs * T, f"bs {bs} x draft_extend_len {T} for draft_extend (padded)")
    ext = _extend_lens(batch, bs)
    seq = batch.seq_lens.tolist()
    for r in range(bs):
        top = min(T, seq[r])
        if not 1 <= ext[r] <= top:
            raise BatchValidationError(f"extend_lens[{r}]", ext[r],
                                       f"1..{top}: accepted tokens, at most draft_extend_len={T} "
                                       f"and seq_lens[{r}]={seq[r]}")
    _check_new_slots(batch, pool, [s - e for s, e in zip(seq, ext)], ext, per_row=T)


def _check_draft_decode(batch: ForwardBatch, pool: KVPool, bs: int) -> None:
    spec = batch._spec()
    _check_num_tokens(batch, bs, f"bs = {bs}, one token per row (branch) for draft_decode")
    step = spec.draft_step
    if step < 0:
        raise BatchValidationError("spec.draft_step", step, ">= 0")
    path = spec.draft_path
    if path is None:
        raise BatchValidationError("spec.draft_path", None, "a [rows, num_steps] int64 tensor for draft_decode")
    _check_tensor("spec.draft_path", path, None, _INTS, pool.device, ndim=2)
    if path.shape[0] != bs or path.shape[1] < step + 1:
        raise BatchValidationError("spec.draft_path.shape", tuple(path.shape),
                                   f"[{bs}, n] with n >= draft_step + 1 = {step + 1}")
    _check_range("spec.draft_path", path, 0, pool.max_slot, f"0..{pool.max_slot}, slots of the pool")
    if not torch.equal(batch.out_cache_loc.to(path.dtype), path[:, step]):
        r = int((batch.out_cache_loc.to(path.dtype) != path[:, step]).nonzero()[0, 0])
        raise BatchValidationError(f"out_cache_loc[{r}]", int(batch.out_cache_loc[r]),
                                   f"spec.draft_path[{r}, {step}]={int(path[r, step])}, the slot of the step's token")
    _check_table(batch, pool, batch.seq_lens.tolist())


_SPEC_PHASES = (Phase.TARGET_VERIFY, Phase.DRAFT_EXTEND, Phase.DRAFT_DECODE)
_PHASE_CHECKS = {
    Phase.PREFILL: _check_prefill,
    Phase.DECODE: _check_decode,
    Phase.TARGET_VERIFY: _check_target_verify,
    Phase.DRAFT_EXTEND: _check_draft_extend,
    Phase.DRAFT_DECODE: _check_draft_decode,
}


# --- helpers --------------------------------------------------------------------------------

def _check_tensor(name: str, t: object, shape: tuple[int, ...] | None, dtypes: tuple[torch.dtype, ...],
                  device: torch.device, ndim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise BatchValidationError(name, type(t).__name__, "a torch.Tensor")
    if shape is not None and tuple(t.shape) != shape:
        raise BatchValidationError(f"{name}.shape", list(t.shape), str(list(shape)))
    if ndim is not None and t.dim() != ndim:
        raise BatchValidationError(f"{name}.shape", list(t.shape), f"{ndim}-D")
    if t.dtype not in dtypes:
        raise BatchValidationError(f"{name}.dtype", t.dtype, ", ".join(str(d) for d in dtypes))
    if t.device != device:
        raise BatchValidationError(f"{name}.device", t.device, f"{device}, the pool's device")


def _check_range(name: str, t: torch.Tensor, low: int, high: int, supported: str) -> None:
    bad = ((t < low) | (t > high)).nonzero()
    if bad.numel():
        index = tuple(int(i) for i in bad[0])
        shown = ", ".join(str(i) for i in index)
        raise BatchValidationError(f"{name}[{shown}]", int(t[index]), supported)


def _at_least(name: str, t: torch.Tensor, low: int, why: str, batch: ForwardBatch) -> list[int]:
    values = [int(x) for x in t.tolist()]
    for r, x in enumerate(values):
        if x < low and not _padded(batch, r):
            raise BatchValidationError(f"{name}[{r}]", x, f">= {low}; {why}")
    return values


def _padded(batch: ForwardBatch, r: int) -> bool:
    return int(batch.req_pool_indices[r]) == PADDING_REQ


def _check_host_copy(name: str, host: torch.Tensor | list[int], device: torch.Tensor) -> None:
    values = host.tolist() if isinstance(host, torch.Tensor) else list(host)
    if values != device.tolist():
        raise BatchValidationError(name, values, f"{device.tolist()}, equal to its device tensor")


def _check_num_tokens(batch: ForwardBatch, want: int, why: str) -> None:
    if batch.num_tokens != want:
        raise BatchValidationError("num_tokens", batch.num_tokens, f"{want} = {why}; num_tokens is len(out_cache_loc)")


def _extend_lens(batch: ForwardBatch, bs: int) -> list[int]:
    if batch.extend_lens is None:
        raise BatchValidationError("extend_lens", None, f"a [bs] int tensor for {batch.phase.value}")
    _check_tensor("extend_lens", batch.extend_lens, (bs,), _INTS, batch.seq_lens.device)
    return [int(x) for x in batch.extend_lens.tolist()]


def _check_table(batch: ForwardBatch, pool: KVPool, seq: list[int]) -> None:
    """Every slot a row attends (positions < seq_lens) is a slot of the pool."""
    table = pool.token_table()
    for r, req in enumerate(batch.req_pool_indices.tolist()):
        if req == PADDING_REQ:
            continue
        row = table[req, :seq[r]]
        bad = ((row < 0) | (row > pool.max_slot)).nonzero()
        if bad.numel():
            p = int(bad[0, 0])
            raise BatchValidationError(f"slot of position {p} of request row {req}", int(row[p]),
                                       f"0..{pool.max_slot}, slots of the pool (req_to_page)")


def _check_new_slots(batch: ForwardBatch, pool: KVPool, prefix: list[int], real: list[int],
                     per_row: int | None = None) -> None:
    """The new tokens' slots are where the page table puts their positions.

    Row ``r``'s real new tokens sit at positions ``prefix[r] + i``; with
    ``per_row`` the rows are uniform (padded), else packed.
    """
    _check_table(batch, pool, [p + n for p, n in zip(prefix, real)])
    table, loc = pool.token_table(), batch.out_cache_loc.tolist()
    start = 0
    for r, req in enumerate(batch.req_pool_indices.tolist()):
        for i in range(0 if req == PADDING_REQ else real[r]):
            want = int(table[req, prefix[r] + i])
            if loc[start + i] != want:
                raise BatchValidationError(
                    f"out_cache_loc[{start + i}]", loc[start + i],
                    f"{want}, the slot of position {prefix[r] + i} of request row {req} (req_to_page)")
        start += per_row if per_row is not None else real[r]
