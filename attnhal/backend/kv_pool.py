"""Paged KV cache: flat slot storage plus a per-request page table.

Layout (the contract every backend reads):

* ``k[layer]``, ``v[layer]``: ``[num_pages_total * page_size, num_kv_heads, head_dim]``,
  indexed by *slot*. Page ``p`` owns slots ``p * page_size .. (p + 1) * page_size - 1``.
* ``req_to_page``: ``[max_reqs + 1, max_pages_per_req]`` int32; token position ``pos`` of
  request row ``r`` lives in slot
  ``req_to_page[r, pos // page_size] * page_size + pos % page_size``.
  With ``page_size == 1`` a page is a slot and ``req_to_page`` is the token table.

KV dtypes are the rows of :data:`attnhal.kv_format.KV_FORMATS` (the pool reads the row, never
the name): ``float32``/``float16``/``bfloat16`` are stored as is. ``fp8_e4m3`` is stored in the
platform's e4m3 flavour (:class:`~attnhal.platform.Fp8Flavor`: ``e4m3fn`` ->
``torch.float8_e4m3fn``, ``e4m3fnuz`` -> ``torch.float8_e4m3fnuz``) and ``fp8_e5m2`` as
``torch.float8_e5m2``; a format with per-layer scales (:attr:`KVFormat.scaled
<attnhal.kv_format.KVFormat.scaled>`) keeps ``k_scale``/``v_scale``: a write stores
``(x / scale).clamp(-max, max)`` (``max`` = the format's largest finite value), a read
computes ``stored.float() * scale``. The flavour is a fact of the stored bytes, recorded
on the pool: a pool of one e4m3 flavour refuses a platform whose hardware computes in the
other (:meth:`KVPool.platform_reasons`). A format whose scales the pool does not keep
(per-block) is refused when the pool is made.

Page 0 (slots ``0 .. page_size - 1``) and request row 0 are reserved for padding: a
captured graph's padded rows point at request 0 (whose row is all page 0) and write their
K/V to slot 0, so they never touch a real request's cache.
"""

from __future__ import annotations

import torch

from attnhal.bounds import Bound
from attnhal.errors import InvalidValue
from attnhal.kv_format import KV_FORMATS, KVFormat, Scales, kv_format
from attnhal.platform import Fp8Flavor, Platform
from attnhal.reasons import Reason, ReasonCode, fmt_set, reason
from attnhal.spec import PAGE_SIZE

__all__ = ["FP8_DTYPES", "KVPool", "PADDING_PAGE", "PADDING_REQ", "PADDING_SLOT", "kv_dtype_name",
           "kv_storage_dtype", "slot_of"]

PADDING_SLOT = 0
PADDING_PAGE = 0
PADDING_REQ = 0


#: The storage dtypes of the fp8 formats of :data:`~attnhal.kv_format.KV_FORMATS` (at import).
FP8_DTYPES = frozenset(getattr(torch, n) for f in KV_FORMATS.values() if f.fp8 for n in f.storage_names)
#: The scale granularities a pool keeps (per-block scales have no storage here yet).
POOL_SCALES = frozenset({Scales.NONE, Scales.PER_LAYER})
#: A count that sizes the pool (layers, slots, heads, requests, ...): at least 1.
_COUNT = Bound("count", 1, 1 << 40)


def _stored_as(dtype: torch.dtype) -> tuple[KVFormat, Fp8Flavor]:
    """The format and e4m3 flavour whose storage is ``dtype`` (read from the rows)."""
    name = str(dtype).removeprefix("torch.")
    for fmt in KV_FORMATS.values():
        if fmt.storage == name:
            return fmt, Fp8Flavor.NONE
        flavor = next((f for f, n in fmt.by_flavor.items() if n == name), None)
        if flavor is not None:
            return fmt, flavor
    raise InvalidValue("dtype", dtype, fmt_set(f"torch.{n}" for f in KV_FORMATS.values() for n in f.storage_names))


def _storage(dtype: torch.dtype | None, fmt: KVFormat | str | None,
             flavor: Fp8Flavor) -> tuple[KVFormat, Fp8Flavor, torch.dtype]:
    """The pool's format row, e4m3 flavour and storage dtype, from exactly one of ``dtype`` and
    ``fmt`` (a row is kept as given: no name -> dtype -> name walk)."""
    if (dtype is None) == (fmt is None):
        raise TypeError(f"dtype={dtype!r}, kv_format={fmt!r} (supported: exactly one of them)")
    if dtype is not None:
        row, stored_flavor = _stored_as(dtype)
        return row, stored_flavor, dtype
    row = fmt if isinstance(fmt, KVFormat) else kv_format(str(fmt))
    storage: torch.dtype = row.storage_dtype(flavor)
    return row, flavor if row.needs_flavor else Fp8Flavor.NONE, storage


def kv_storage_dtype(kv_dtype: str, fp8_flavor: Fp8Flavor) -> torch.dtype:
    """The torch dtype a KV cache named ``kv_dtype`` is stored in, under ``fp8_flavor``.

    ``fp8_e4m3`` needs a flavour: a platform whose flavour is ``none`` (the CPU, pre-fp8
    GPUs) has no native one, so the caller must name one (e.g. the flavour of the
    platform the cache is for) — this function never picks one for it.
    """
    dtype: torch.dtype = kv_format(kv_dtype).storage_dtype(fp8_flavor)
    return dtype


def kv_dtype_name(dtype: torch.dtype) -> str:
    """The KV dtype name of storage ``dtype`` (``torch.float8_e4m3fnuz`` -> ``"fp8_e4m3"``)."""
    return _stored_as(dtype)[0].name


def slot_of(req_to_page: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
            page_size: int) -> torch.Tensor:
    """KV slots of token ``positions`` of request ``rows`` (broadcast together), int64."""
    pages = req_to_page[rows, torch.div(positions, page_size, rounding_mode="floor")].long()
    return pages * page_size + positions % page_size


class KVPool:
    """Per-layer K and V buffers plus the request-to-page table.

    Attributes
    ----------
    k, v: per layer, ``[num_slots + page_size, num_kv_heads, head_dim]`` (the padding page first).
    req_to_page: ``[max_reqs + 1, ceil(max_context_len / page_size)]`` int32.
    page_size: tokens per page.
    dtype: the storage dtype; ``kv_dtype``: its name (``"fp8_e4m3"`` for both e4m3 flavours);
    fp8_flavor: the e4m3 flavour of the stored bytes (``Fp8Flavor.NONE`` unless ``fp8_e4m3``).
    k_scale, v_scale: ``[num_layers]`` float32 dequantization scales, 1.0 at start; set a
        layer's with ``pool.k_scale[layer] = s`` (before its K/V are written). Read only
        for fp8 storage.
    head_dim, v_head_dim: head sizes of K and of V (``v_head_dim`` = ``head_dim`` unless
        given; MLA stores V = the latent part, e.g. 576 and 512).
    v_in_k: MLA's latent cache: one tensor per layer, ``v[layer]`` the view of the first
        ``v_head_dim`` columns of ``k[layer]`` (a V write lands in K's row; MLA writes the
        latent as both). Kernels may then read each row once for K and V. ``v_scale`` is then
        ``k_scale`` itself: the latent is stored once, with one scale.
    """

    def __init__(self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype | None = None, max_reqs: int, max_context_len: int, page_size: int = 1,
                 device: str | torch.device = "cpu", v_head_dim: int | None = None,
                 v_in_k: bool = False, kv_format: KVFormat | str | None = None,
                 fp8_flavor: Fp8Flavor = Fp8Flavor.NONE) -> None:
        """Give the storage as the KV format row (``kv_format``: a :class:`KVFormat` or its name,
        with the platform's ``fp8_flavor`` for ``fp8_e4m3``): the pool keeps that row. Or give a
        torch ``dtype`` (``torch.float16``): the pool reads the row whose storage it is."""
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("max_reqs", max_reqs), ("max_context_len", max_context_len),
                            ("page_size", page_size),
                            ("v_head_dim", head_dim if v_head_dim is None else v_head_dim)):
            _COUNT.check(value, name)
        PAGE_SIZE.check(page_size)
        if num_slots % page_size:
            raise InvalidValue("num_slots", num_slots, f"a multiple of page_size={page_size}")
        self.kv_format, self.fp8_flavor, dtype = _storage(dtype, kv_format, fp8_flavor)
        if self.kv_format.scales not in POOL_SCALES:
            raise InvalidValue("kv_dtype", self.kv_format.name, f"a format with scales "
                               f"{fmt_set(s.value for s in POOL_SCALES)} (this one's are {self.kv_format.scales.value}: "
                               "the pool keeps no such scales yet)")
        self.kv_dtype = self.kv_format.name
        v_dim = head_dim if v_head_dim is None else v_head_dim
        slots = num_slots + page_size  # + the padding page
        self.k = [torch.zeros((slots, num_kv_heads, head_dim), dtype=dtype, device=device) for _ in range(num_layers)]
        if v_in_k and v_dim > head_dim:
            raise InvalidValue("v_head_dim", v_dim, f"<= head_dim={head_dim} with v_in_k (V is part of K's row)")
        self.v = [k[..., :v_dim] if v_in_k else torch.zeros((slots, num_kv_heads, v_dim), dtype=dtype, device=device)
                  for k in self.k]
        self.v_in_k = v_in_k
        self.k_scale = torch.ones(num_layers, dtype=torch.float32, device=device)
        # A V inside K's rows is K's bytes: one latent, one scale (setting either sets both; two
        # scales would leave the latent quantized by V's and read by K's in the QK dot).
        self.v_scale = self.k_scale if v_in_k else torch.ones(num_layers, dtype=torch.float32, device=device)
        self.v_head_dim = v_dim
        self._scratch = (torch.empty(0, device=device), torch.empty(0, dtype=dtype, device=device))
        pages_per_req = -(-max_context_len // page_size)
        self.req_to_page = torch.zeros((max_reqs + 1, pages_per_req), dtype=torch.int32, device=device)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device, self.page_size = dtype, torch.device(device), page_size
        self.max_context_len = max_context_len
        num_pages = num_slots // page_size
        self._free_pages = list(range(num_pages, 0, -1))
        self._free_reqs = list(range(max_reqs, 0, -1))

    @property
    def req_to_token(self) -> torch.Tensor:
        """The token table ``[max_reqs + 1, max_context_len]``: ``req_to_page`` when ``page_size == 1``."""
        if self.page_size != 1:
            raise AttributeError(f"req_to_token exists for page_size=1 only (page_size={self.page_size}); "
                                 "read req_to_page")
        return self.req_to_page

    @property
    def num_slots(self) -> int:
        """Usable slots (the padding page excluded)."""
        return self.k[0].shape[0] - self.page_size

    @property
    def max_slot(self) -> int:
        """The largest slot index: the last of page ``num_slots / page_size`` (pages count from 1)."""
        return self.num_slots + self.page_size - 1

    def slots(self, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """KV slots of token ``positions`` of request ``rows``; see :func:`slot_of`."""
        return slot_of(self.req_to_page, rows, positions, self.page_size)

    def token_table(self) -> torch.Tensor:
        """``[max_reqs + 1, max_context_len]`` int64: the slot of every position of every row.

        Allocates: for host-side readers (the reference, validation), never in a forward.
        """
        rows = torch.arange(self.req_to_page.shape[0], device=self.device).view(-1, 1)
        positions = torch.arange(self.max_context_len, device=self.device).view(1, -1)
        return self.slots(rows, positions)

    def platform_reasons(self, platform: Platform) -> list[Reason]:
        """Why a backend running on ``platform`` must not read this pool: an e4m3 cache
        whose flavour differs from the one ``platform``'s hardware computes in."""
        theirs = platform.fp8_flavor
        if self.fp8_flavor is Fp8Flavor.NONE or theirs is Fp8Flavor.NONE or theirs is self.fp8_flavor:
            return []
        return [reason(ReasonCode.KV_DTYPE, "kv_dtype", f"fp8_e4m3 stored as {self.fp8_flavor.value}",
                       f"fp8_e4m3 as {theirs.value}, the flavour of platform {platform.name}")]

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K ``[num_tokens, num_kv_heads, head_dim]`` and V (``v_head_dim``) at
        slots ``loc`` ``[num_tokens]``; fp8 pools quantize with the layer's scales."""
        self._store(self.k[layer], loc, k, self.k_scale[layer])
        self._store(self.v[layer], loc, v, self.v_scale[layer])

    def _store(self, cache: torch.Tensor, loc: torch.Tensor, x: torch.Tensor, scale: torch.Tensor) -> None:
        if not self.kv_format.scaled:
            cache.index_copy_(0, loc, x.to(self.dtype))
            return
        wide, narrow = self._quant_scratch(x.numel())
        wide, narrow = wide.view(x.shape), narrow.view(x.shape)
        top = torch.finfo(self.dtype).max
        torch.div(x, scale, out=wide)
        wide.clamp_(-top, top)
        narrow.copy_(wide)
        # torch has no fp8 index_copy on every device: move the bytes.
        cache.view(torch.uint8).index_copy_(0, loc, narrow.view(torch.uint8))

    def _quant_scratch(self, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 and storage-dtype scratch of ``numel`` elements for quantizing a write.

        Grown on demand and kept: a captured graph's replay reuses the buffers its
        capture took instead of allocating (a later, larger eager write grows new ones;
        the graph keeps the old).
        """
        if self._scratch[0].numel() < numel:
            self._scratch = (torch.empty(numel, dtype=torch.float32, device=self.device),
                             torch.empty(numel, dtype=self.dtype, device=self.device))
        return self._scratch[0][:numel], self._scratch[1][:numel]

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy every layer's K/V from slots ``src`` to ``dst`` (``[n]`` int64), as stored
        (bytes: no requantization). The sources are read before any destination is written."""
        # A V inside K's rows (MLA) moves with K: a second pass over it would read sources that
        # the K pass already overwrote wherever a destination is also a source (a tree's path).
        for cache in (*self.k, *(() if self.v_in_k else self.v)):
            raw = cache.view(torch.uint8) if self.kv_format.scaled else cache
            raw.index_copy_(0, dst, raw.index_select(0, src))

    def dequantized(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s K and V as the attention reads them: float32 ``stored * scale``
        for fp8, the stored tensors otherwise (allocates for fp8; host-side readers)."""
        k, v = self.k[layer], self.v[layer]
        if not self.kv_format.scaled:
            return k, v
        return k.float() * self.k_scale[layer], v.float() * self.v_scale[layer]

    def layer_copy(self, layer: int) -> KVPool:
        """A one-layer pool holding a copy of layer ``layer`` (cache and scales); it shares
        the page table. For host-side readers that must not touch the pool (the reference)."""
        copy = KVPool.__new__(KVPool)
        copy.__dict__.update(self.__dict__)
        k = self.k[layer].clone()
        copy.k, copy.v = [k], [k[..., :self.v_head_dim] if self.v_in_k else self.v[layer].clone()]
        copy._scratch = (torch.empty(0, device=self.device), torch.empty(0, dtype=self.dtype, device=self.device))
        copy.k_scale = self.k_scale[layer:layer + 1].clone()
        copy.v_scale = copy.k_scale if self.v_in_k else self.v_scale[layer:layer + 1].clone()
        copy.num_layers = 1
        return copy

    # Host-side bookkeeping for the engine (never called inside a captured region).
    def alloc_pages(self, n: int) -> torch.Tensor:
        """Take ``n`` free pages; returns ``[n]`` int64 page ids on the pool's device."""
        if n > len(self._free_pages):
            raise RuntimeError(f"KV pool out of pages: asked {n}, free {len(self._free_pages)}")
        taken = [self._free_pages.pop() for _ in range(n)]
        return torch.tensor(taken, dtype=torch.int64, device=self.device)

    def free_pages(self, pages: torch.Tensor) -> None:
        self._free_pages.extend(int(p) for p in pages.tolist() if p != PADDING_PAGE)

    def alloc_slots(self, n: int) -> torch.Tensor:
        """Take ``n`` free slots (``page_size == 1`` pools: a slot is a page)."""
        self._require_token_pages("alloc_slots")
        return self.alloc_pages(n)

    def free_slots(self, slots: torch.Tensor) -> None:
        self._require_token_pages("free_slots")
        self.free_pages(slots)

    def alloc_req(self) -> int:
        if not self._free_reqs:
            raise RuntimeError("KV pool out of request rows")
        return self._free_reqs.pop()

    def free_req(self, row: int) -> None:
        self.req_to_page[row].zero_()
        self._free_reqs.append(row)

    @property
    def free_page_count(self) -> int:
        return len(self._free_pages)

    @property
    def free_slot_count(self) -> int:
        return len(self._free_pages) * self.page_size

    def _require_token_pages(self, what: str) -> None:
        if self.page_size != 1:
            raise RuntimeError(f"{what} needs page_size=1 (page_size={self.page_size}); use alloc_pages/free_pages")
