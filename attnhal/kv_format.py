"""KV-cache formats as data: one :class:`KVFormat` row per ``kv_dtype`` name.

A format says how a KV cache of that name is stored: the torch dtype of its bytes (fixed,
or picked by the platform's fp8 flavour), its fp8 encoding if it is fp8, and the
granularity of its dequantization scales. Code asks the row (``kv_format(name).scaled``)
instead of reading the format out of its name, so a new format is a row in
:data:`KV_FORMATS` plus its oracle (how the fp64 reference reads it back), not a grep.

Importing this module imports no torch: storage dtypes are torch attribute names, resolved
when a pool is made (:meth:`KVFormat.storage_dtype`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from attnhal.errors import InvalidValue
from attnhal.platform import Fp8Flavor

__all__ = ["KV_FORMATS", "KVFormat", "Scales", "kv_format", "register_kv_format", "unregister_kv_format"]


class Scales(str, Enum):
    """How a KV cache's stored values are scaled back to real ones."""

    NONE = "none"  # stored as the values themselves (float32, float16, bfloat16)
    PER_LAYER = "per_layer"  # one K and one V scale per layer (attnhal's fp8 caches)
    PER_BLOCK = "per_block"  # a scale per block of values (FP4 formats); no pool stores it yet


@dataclass(frozen=True)
class KVFormat:
    """One KV-cache format.

    Attributes
    ----------
    name: the ``kv_dtype`` name descriptors, requests and the CLI use (``"fp8_e4m3"``).
    storage: the torch dtype of the stored bytes, by attribute name (``"float8_e5m2"``);
        ``None`` when the platform's fp8 flavour picks it (:attr:`by_flavor`).
    by_flavor: the storage per :class:`~attnhal.platform.Fp8Flavor` when ``storage`` is None.
    fp8: the fp8 encoding (``"e4m3"``, ``"e5m2"``), None for a format that is not fp8.
    scales: the granularity of the dequantization scales.
    """

    name: str
    storage: str | None = None
    by_flavor: Mapping[Fp8Flavor, str] = field(default_factory=dict)
    fp8: str | None = None
    scales: Scales = Scales.NONE

    def __post_init__(self) -> None:
        if (self.storage is None) == (not self.by_flavor):
            raise InvalidValue("storage", self.storage, f"one torch dtype name, or by_flavor only ({self.name})")
        object.__setattr__(self, "by_flavor", MappingProxyType(dict(self.by_flavor)))
        object.__setattr__(self, "scales", Scales(self.scales))

    @property
    def scaled(self) -> bool:
        """Whether stored values are quantized: written divided by a scale, read multiplied by it."""
        return self.scales is not Scales.NONE

    @property
    def needs_flavor(self) -> bool:
        """Whether the storage dtype depends on the platform's fp8 flavour (``fp8_e4m3``)."""
        return self.storage is None

    @property
    def storage_names(self) -> tuple[str, ...]:
        """Every torch dtype name this format may be stored in."""
        return (self.storage,) if self.storage is not None else tuple(self.by_flavor.values())

    def storage_name(self, flavor: Fp8Flavor = Fp8Flavor.NONE) -> str:
        """The torch dtype name of the stored bytes under ``flavor``; :class:`InvalidValue`
        when the format needs a flavour ``flavor`` is not one of."""
        if self.storage is not None:
            return self.storage
        try:
            return self.by_flavor[flavor]
        except KeyError:
            flavours = ", ".join(f.value for f in self.by_flavor)
            raise InvalidValue("fp8_flavor", flavor.value,
                               f"{flavours} for kv_dtype={self.name}; a platform without fp8 names no flavour: "
                               "pass the flavour of the platform the cache is for, e.g. Fp8Flavor.OCP for CUDA "
                               "sm89+, Fp8Flavor.FNUZ for gfx942") from None

    def storage_dtype(self, flavor: Fp8Flavor = Fp8Flavor.NONE) -> Any:
        """The ``torch.dtype`` of the stored bytes under ``flavor`` (imports torch)."""
        import torch

        return getattr(torch, self.storage_name(flavor))


_FORMATS: dict[str, KVFormat] = {}
#: Every known KV format by name, in the order messages list them.
KV_FORMATS: Mapping[str, KVFormat] = MappingProxyType(_FORMATS)


def register_kv_format(fmt: KVFormat) -> KVFormat:
    """Add ``fmt`` to :data:`KV_FORMATS` (a name may be registered once)."""
    if fmt.name in _FORMATS:
        raise InvalidValue("kv_dtype", fmt.name, "a name not yet in KV_FORMATS")
    _FORMATS[fmt.name] = fmt
    return fmt


def unregister_kv_format(name: str) -> None:
    """Remove a format :func:`register_kv_format` added (tests of a format row)."""
    _FORMATS.pop(name, None)


def kv_format(name: str) -> KVFormat:
    """The format named ``name``; :class:`InvalidValue` (field ``kv_dtype``) listing the known ones."""
    try:
        return _FORMATS[name]
    except (KeyError, TypeError):
        raise InvalidValue("kv_dtype", name, ", ".join(_FORMATS)) from None


for _row in (
    KVFormat("float32", "float32"),
    KVFormat("float16", "float16"),
    KVFormat("bfloat16", "bfloat16"),
    # e4m3 is stored in the encoding the platform's fp8 instructions compute in.
    KVFormat("fp8_e4m3", by_flavor={Fp8Flavor.OCP: "float8_e4m3fn", Fp8Flavor.FNUZ: "float8_e4m3fnuz"},
             fp8="e4m3", scales=Scales.PER_LAYER),
    KVFormat("fp8_e5m2", "float8_e5m2", fp8="e5m2", scales=Scales.PER_LAYER),
):
    register_kv_format(_row)
