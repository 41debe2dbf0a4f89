"""The kernel's microarchitecture-dependent parameters: what they are, their defaults, and how
they are written down.

Which values are fastest depends on the CPU (how many misses it keeps in flight, how big its
caches are), not on the instruction set alone: a prefetch distance that suited a Zen 4 left
a Zen 3 at half its read bandwidth (docs/cpu.md). So they are runtime arguments of the op,
measured on the host (:mod:`attnhal_cpu.tuning`), never compile-time constants.

This module is plain data: no torch, no file access.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

__all__ = ["DEFAULTS", "HOST_DEFAULTS", "HostParams", "KernelParams", "MIN_SPLIT_LEN", "TILE_VECTORS", "WIDTH_NAMES",
           "WIDTHS", "parse_host_params", "parse_params", "split_count", "width_of"]

#: Tile widths the kernel is compiled for, in vectors (``tile_vectors``).
TILE_VECTORS = (1, 2, 4)

#: Shortest KV range worth a split of its own (shorter ones cost more to merge than they save).
MIN_SPLIT_LEN = 256


@dataclass(frozen=True)
class KernelParams:
    """The tunable parameters of one kernel build.

    prefetch: KV positions read ahead of the tile being computed (rounded up to whole tiles;
        0: no software prefetch). The op's ``prefetch`` argument.
    prefetch_burst: 1: every head's K and V rows of the tile ahead are prefetched in one burst
        per tile (the kernel before 2026-12-04); 0: one head's K rows just before its scores,
        its V rows just before its ``P·V`` (spread through the arithmetic; what freed the
        AVX-512 host's miss buffers). The op's ``prefetch_burst`` argument.
    max_vectors: query vectors one task holds at most; with ``G`` query heads per KV head and
        ``T`` tokens per row a task groups the most KV heads ``h`` with ``h * T * G <= max_vectors``
        (heads per block: more heads share each page walk, fewer keep q in L1). The op's
        ``max_vectors`` argument.
    tasks_per_thread: how finely a batch is split over the threads (KV splits per row aim at
        this many tasks per thread; :func:`attnhal_cpu.backend.split_count`).
    tile_vectors: positions per tile, in vectors of the build (a tile is ``tile_vectors × W``
        KV positions, ``W`` = 8 floats on AVX2, 16 on AVX-512, 4 otherwise; 1, 2 or 4). A wider
        tile loads, rescales and stores each accumulator and runs the softmax's bookkeeping
        once per more positions, but keeps more rows in flight and masks more past a split's
        end. 1 is the kernel before 2026-12-06. The op's ``tile_vectors`` argument.
    """

    prefetch: int = 16
    prefetch_burst: int = 0
    max_vectors: int = 64
    tasks_per_thread: int = 4
    tile_vectors: int = 1

    def __post_init__(self) -> None:
        checks = {"prefetch": (0, 1024), "prefetch_burst": (0, 1), "max_vectors": (1, 4096),
                  "tasks_per_thread": (1, 64), "tile_vectors": (1, 4)}
        for name, (low, high) in checks.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name}={value!r} (supported: an int in [{low}, {high}])")
        if self.tile_vectors not in TILE_VECTORS:
            raise ValueError(f"tile_vectors={self.tile_vectors!r} (supported: one of {list(TILE_VECTORS)})")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def op_args(self) -> tuple[int, int, bool, int]:
        """The op's last arguments: ``prefetch, max_vectors, prefetch_burst, tile_vectors``."""
        return self.prefetch, self.max_vectors, bool(self.prefetch_burst), self.tile_vectors

    def __str__(self) -> str:
        how = "one burst per tile" if self.prefetch_burst else "spread over the heads"
        return (f"prefetch {self.prefetch} positions ({how}), {self.max_vectors} query vectors per task, "
                f"{self.tasks_per_thread} tasks per thread, tiles of {self.tile_vectors} vector"
                f"{'s' if self.tile_vectors > 1 else ''}")


DEFAULTS = KernelParams()

#: The cache widths parameters are measured for: 4-byte (fp32) and 2-byte (bf16, fp16) elements.
#: They differ: on the Zen 3 host the burst prefetch was faster for fp32 and slower for bf16
#: (docs/cpu.md), since a 2-byte row is half the cache lines per slot.
WIDTHS = ("fp32", "half")
#: How each width is named in what is printed.
WIDTH_NAMES = {"fp32": "fp32", "half": "bf16/fp16"}


@dataclass(frozen=True)
class HostParams:
    """One :class:`KernelParams` per cache width: ``fp32`` (4-byte caches) and ``half`` (bf16, fp16)."""

    fp32: KernelParams = DEFAULTS
    half: KernelParams = DEFAULTS

    def for_itemsize(self, itemsize: int) -> KernelParams:
        """The parameters for a KV cache of ``itemsize``-byte elements."""
        return self.half if width_of(itemsize) == "half" else self.fp32

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {"fp32": self.fp32.to_dict(), "half": self.half.to_dict()}

    def __str__(self) -> str:
        if self.fp32 == self.half:
            return f"fp32 and bf16/fp16: {self.fp32}"
        return f"{WIDTH_NAMES['fp32']}: {self.fp32}; {WIDTH_NAMES['half']}: {self.half}"


HOST_DEFAULTS = HostParams()


def width_of(itemsize: int) -> str:
    """The cache width (:data:`WIDTHS`) of ``itemsize``-byte KV elements."""
    return "half" if itemsize == 2 else "fp32"


def parse_params(text: str) -> KernelParams:
    """``"prefetch=32,max_vectors=16"`` (any subset; the rest default) -> :class:`KernelParams`.

    Raises ValueError naming the item and what is allowed.
    """
    names = [f.name for f in fields(KernelParams)]
    values: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, raw = item.partition("=")
        if not sep or name.strip() not in names or not raw.strip().lstrip("-").isdigit():
            raise ValueError(f"{item!r} (supported: NAME=INT with NAME in {names})")
        values[name.strip()] = int(raw)
    return KernelParams(**values)


def parse_host_params(text: str) -> HostParams:
    """``"prefetch=8,fp32.prefetch_burst=1"`` -> :class:`HostParams`: a plain ``NAME=INT`` sets both
    widths, ``fp32.NAME=INT`` / ``half.NAME=INT`` one of them (the rest default).

    Raises ValueError naming the item and what is allowed.
    """
    items: dict[str, list[str]] = {w: [] for w in WIDTHS}
    for item in (part.strip() for part in text.split(",")):
        width, dot, rest = item.partition(".")
        if dot and width not in WIDTHS:
            raise ValueError(f"{item!r} (supported: NAME=INT, or WIDTH.NAME=INT with WIDTH in {list(WIDTHS)})")
        for w in ([width] if dot else WIDTHS):
            items[w].append(rest if dot else item)
    return HostParams(**{w: parse_params(",".join(parts)) for w, parts in items.items()})


def split_count(rows: int, length: int, threads: int, tasks_per_thread: int = DEFAULTS.tasks_per_thread) -> int:
    """KV splits per row: about ``tasks_per_thread`` tasks per thread, and no split shorter
    than :data:`MIN_SPLIT_LEN` positions of a ``length``-long row.

    A task is (row, KV-head group, split); the kernel groups the KV heads of a row into one
    task when their query vectors fit (``max_vectors``, see ``csrc/attention.cpp``), so rows ×
    splits is the task count to aim at. More tasks balance uneven rows; fewer cost less to merge.
    """
    want = -(-tasks_per_thread * threads // max(1, rows))
    return max(1, min(want, -(-length // MIN_SPLIT_LEN)))
