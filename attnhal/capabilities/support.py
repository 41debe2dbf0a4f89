"""Request matching: can this backend serve this request on this platform, and if not, why.

:func:`not_supported_reasons` lists every reason a descriptor cannot serve an
:class:`AttentionRequest` on a platform; an empty list means supported, which is
all :func:`supports` says. Each "no" is a :class:`~attnhal.reasons.Reason` with a
stable code.

The reason producers of attnhal, each answering one question:

=============================================  ==============================================
producer                                       why a backend cannot be used ...
=============================================  ==============================================
``BackendCapabilities.platform_reasons``       on this vendor / arch (the descriptor's claims)
(:mod:`attnhal.capabilities.descriptor`)
:func:`request_reasons`,                       for this phase, model, dtypes, head and page
:func:`not_supported_reasons` (here)           size, features, head ratio (+ the platform)
``attnhal.backend.contract.config_reasons``    with this attention config over this KV pool
``AttentionBackend.runtime_reasons``           by this process, although the descriptor fits
(``attnhal.backend.contract``)                 (e.g. Triton on a simulated platform)
``KVPool.platform_reasons``                    on a pool whose fp8 flavour is not the
(``attnhal.backend.kv_pool``)                  platform's
``BackendEntry.unavailable_reasons``           here at all: load failure, missing module,
(``attnhal.registry``)                         a descriptor without an implementation
``attnhal.backend.multi_step``                 as the multi-step draft of this spec config
``.multi_step_reasons``
=============================================  ==============================================

The planner (:mod:`attnhal.planner`) combines the first two with the spec config's
run limits and graph limits for each phase.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from attnhal.capabilities.conditions import Facts
from attnhal.capabilities.descriptor import BackendCapabilities
from attnhal.kv_format import KV_FORMATS
from attnhal.phases import Feature, Phase
from attnhal.platform import Fp8Flavor, Platform
from attnhal.reasons import Reason, ReasonCode, fmt_set, reason
from attnhal.spec import ModelKind, RequestContext

__all__ = ["AttentionRequest", "fp8_reasons", "not_supported_reasons", "request_reasons", "supports"]


class _Shapes(Protocol):
    """What :meth:`AttentionRequest.of` reads of an attention config (``attnhal.backend.AttentionConfig``)."""

    @property
    def num_q_heads(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_size(self) -> int: ...

    @property
    def dtype(self) -> Any: ...

    @property
    def features(self) -> frozenset[Feature]: ...


class _Pool(Protocol):
    """What :meth:`AttentionRequest.of` reads of a KV pool (``attnhal.backend.KVPool``)."""

    @property
    def kv_dtype(self) -> str: ...

    @property
    def page_size(self) -> int: ...


@dataclass(frozen=True)
class AttentionRequest:
    """What an engine asks of a backend; ``None`` fields are not checked.

    Build one from the facts at hand with :meth:`of` (a request context, an attention
    config, a KV pool), so each fact is copied into a request in one place.
    """

    phase: Phase | None = None
    dtype: str | None = None
    kv_dtype: str | None = None
    head_size: int | None = None
    page_size: int | None = None
    num_q_heads: int | None = None
    num_kv_heads: int | None = None
    features: frozenset[Feature] = frozenset()
    model: ModelKind | None = None

    @classmethod
    def of(cls, context: RequestContext | None = None, config: _Shapes | None = None, pool: _Pool | None = None,
           **given: Any) -> AttentionRequest:
        """The request of ``context`` (model, dtypes, head and page size), then ``config``
        (compute dtype, head size, heads, features) and ``pool`` (KV dtype, page size): a
        later source's fact replaces an earlier one's, and ``given`` fields (``phase=...``)
        replace them all. A missing source leaves its fields unchecked."""
        out: dict[str, Any] = {}
        if context is not None:
            out.update(model=context.model, dtype=context.dtype, kv_dtype=context.kv_dtype,
                       head_size=context.head_size, page_size=context.page_size)
        if config is not None:
            out.update(dtype=str(config.dtype).removeprefix("torch."), head_size=config.head_size,
                       num_q_heads=config.num_q_heads, num_kv_heads=config.num_kv_heads, features=config.features)
        if pool is not None:
            out.update(kv_dtype=pool.kv_dtype, page_size=pool.page_size)
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"{sorted(unknown)[0]}= (supported: {', '.join(f.name for f in fields(cls))})")
        return cls(**{**out, **given})

    @property
    def context(self) -> RequestContext:
        """The model and KV-cache facts of this request, which variants resolve against."""
        return RequestContext(model=self.model, dtype=self.dtype, kv_dtype=self.kv_dtype,
                              head_size=self.head_size, page_size=self.page_size)


def not_supported_reasons(
    caps: BackendCapabilities, request: AttentionRequest, platform: Platform
) -> list[Reason]:
    """Every reason ``caps`` cannot serve ``request`` on ``platform``; empty means supported.

    Variants are resolved against the platform and the request first.
    """
    if not isinstance(platform, Platform):
        raise TypeError(f"platform={platform!r} (supported: a Platform, e.g. attnhal.platform.parse('cuda:sm90'); "
                        "the arguments are (caps, request, platform))")
    if not isinstance(request, AttentionRequest):
        raise TypeError(f"request={request!r} (supported: an AttentionRequest; the arguments are (caps, request, platform))")
    if caps.variants:
        caps = caps.resolve(Facts.of(platform, request.context))
    return caps.platform_reasons(platform) + fp8_reasons(platform, request.kv_dtype) + request_reasons(caps, request)


def fp8_reasons(platform: Platform, kv_dtype: str | None) -> list[Reason]:
    """A format stored in the platform's fp8 flavour (``fp8_e4m3``): on a platform without one (a pre-fp8 GPU
    such as sm80 or gfx90a, the CPU) no cache of that name can be made for it."""
    fmt = KV_FORMATS.get(kv_dtype) if kv_dtype is not None else None
    if fmt is None or not fmt.needs_flavor or platform.fp8_flavor is not Fp8Flavor.NONE:
        return []
    return [reason(ReasonCode.KV_DTYPE, "kv_dtype", kv_dtype,
                   f"a platform with an fp8 flavour; {platform.name} has none (no fp8_e4m3 encoding to store)")]


def supports(caps: BackendCapabilities, request: AttentionRequest, platform: Platform) -> bool:
    """True if ``caps`` can serve ``request`` on ``platform``: :func:`not_supported_reasons` is empty."""
    return not not_supported_reasons(caps, request, platform)


def request_reasons(caps: BackendCapabilities, request: AttentionRequest) -> list[Reason]:
    """The request checks of :func:`not_supported_reasons` (no platform, no variants resolved)."""
    out: list[Reason] = []
    checks: list[tuple[ReasonCode, str, object, Iterable[object]]] = [
        (ReasonCode.PHASE, "phase", request.phase, caps.phases),
        (ReasonCode.MODEL, "model", request.model, caps.models or ()),
        (ReasonCode.DTYPE, "dtype", request.dtype, caps.dtypes),
        (ReasonCode.KV_DTYPE, "kv_dtype", request.kv_dtype, caps.kv_dtypes or ()),
        (ReasonCode.HEAD_SIZE, "head_size", request.head_size, caps.head_sizes),
        (ReasonCode.PAGE_SIZE, "page_size", request.page_size, caps.page_sizes),
    ]
    for code, name, value, allowed in checks:
        if value is not None and value not in allowed:
            out.append(reason(code, name, value, fmt_set(allowed)))
    for feature in sorted(request.features - caps.features, key=lambda f: f.value):
        out.append(reason(ReasonCode.FEATURE, "feature", feature, fmt_set(caps.features)))
    q, kv = request.num_q_heads, request.num_kv_heads
    if q is not None and kv is not None and (kv < 1 or q % kv):
        out.append(reason(ReasonCode.HEAD_RATIO, "num_q_heads/num_kv_heads", f"{q}/{kv}",
                          "num_kv_heads >= 1 dividing num_q_heads"))
    return out
