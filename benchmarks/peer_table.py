"""Results of the peers benchmark: per contender, per shape row, the ratios and the markdown table."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Result", "Row", "fp8_speedup", "markdown", "ratio"]



@dataclass
class Result:
    """One contender on one shape. status: ``ok``, ``n/a`` (does not serve it), ``WRONG``
    (disagrees with fp32; excluded from ratios) or ``FAILED`` (raised)."""

    status: str
    err: float | None = None  # max over query rows of |out - ref| / |ref| (peer_gate)
    seconds: float | None = None  # per call; None when not timed (no GPU)
    note: str = ""
    setting: str = "default"  # the contender's setting this result is (its fastest)
    default_seconds: float | None = None  # its default setting's time, beside the best
    settings: int = 1  # how many settings were checked (and timed)


@dataclass
class Row:
    key: str
    title: str
    unit: str
    kv_bytes: int
    flops: float
    results: dict[str, Result] = field(default_factory=dict)
    ratio: float | None = None  # attnhal's speed / the fastest other contender's
    versus: str = ""

    def speed(self, name: str) -> float | None:
        """In :attr:`unit`: GB/s of K/V, or TFLOP/s for prefill."""
        seconds = self.results[name].seconds if name in self.results else None
        if seconds is None or self.results[name].status != "ok":
            return None
        return self.flops / seconds / 1e12 if self.unit == "TFLOP/s" else self.kv_bytes / seconds / 1e9

    def cell(self, name: str, timed: bool) -> str:
        result = self.results.get(name)
        if result is None:
            return "-"
        if result.status == "ok":
            speed = self.speed(name)
            if not timed or speed is None:
                return f"ok (err {result.err:.1e}, {result.settings} settings)"
            beside = "" if result.setting == "default" or not result.default_seconds else \
                f" [{result.setting}; default {speed * result.seconds / result.default_seconds:,.0f}]"
            return f"{speed:,.0f}{beside}"
        if result.status == "WRONG":
            return f"WRONG (err {result.err:.1e})"
        return result.status


def ratio(row: Row) -> tuple[float | None, str]:
    """attnhal's speed over the fastest other contender's of the row (engines and SDPA alike),
    and that contender."""
    mine = row.speed("attnhal")
    speeds = {n: s for n in row.results if n != "attnhal" and (s := row.speed(n)) is not None}
    if mine is None or not speeds:
        return None, ""
    best = max(speeds, key=lambda n: speeds[n])
    return mine / speeds[best], best


def markdown(rows: list[Row], contenders: tuple[str, ...], timed: bool) -> str:
    head = ["shape (bs x context)", "unit", *contenders, "fastest other", "attnhal / fastest other"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        value, versus = ratio(row)
        versus += " (causal)" if versus == "vllm" and row.key.startswith("tree") else ""
        cells = [row.title, row.unit, *(row.cell(n, timed) for n in contenders), versus or "-",
                 f"{value:.2f}x" if value is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    if not timed:
        lines.append("\ninterpreter: plumbing only, no speed (cells: agreement with the fp32 reference)")
    return "\n".join(lines)


def fp8_speedup(rows: list[Row]) -> tuple[str, float] | None:
    """attnhal's fp8 decode tokens/s over its bf16 decode at the same ``bs x ctx`` (first match)."""
    by_key = {r.key: r for r in rows}
    for row in rows:
        if row.key.startswith("fp8:"):
            bf16 = by_key.get("decode:" + row.key.split(":", 1)[1])
            fast, slow = row.speed("attnhal"), bf16.speed("attnhal") if bf16 else None
            if fast is not None and slow is not None:
                # tokens/s ratio = time ratio; speeds are bytes/s with half the bytes per token in fp8
                return row.key.split(":", 1)[1], (fast / row.kv_bytes) / (slow / bf16.kv_bytes)
    return None
