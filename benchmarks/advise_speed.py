"""``attnhal advise`` speed: seconds per answer over every kind of input, the planner's cache cold.

    python benchmarks/advise_speed.py [--engine sglang|vllm|both]

Inputs: per engine, every platform (SGLang: ``cuda:sm90``, ``cuda:sm100``, ``hip:gfx942``, ``cpu``;
vLLM: the same less ``cpu``'s MLA, which no backend serves) x model kind (MHA, MLA) x speculative
configuration (none; EAGLE 1 step; EAGLE 3 steps; an EAGLE tree of 3 steps x topk 4; SGLang's
n-gram tree) x the user's backend (every catalogued one of the platform's vendor, and none:
the engine's default). Each answer is timed with the planner's cache cleared first, so every
one pays for its own plans (the first ``advise`` of a process). Prints the median and the
worst answer, with the worst input, and the answers per second; the goal is < 1 s for any input.
The combinatorial limit (``attnhal.engines.advice.MAX_COMBINATIONS``) bounds the worst case:
an input over it is refused before any planning.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from attnhal import catalog  # noqa: E402
from attnhal.engines import advise  # noqa: E402
from attnhal.engines.flags import EngineArgError  # noqa: E402
from attnhal.planner import decide  # noqa: E402
from attnhal.platform import parse  # noqa: E402

PLATFORMS = ("cuda:sm90", "cuda:sm100", "hip:gfx942", "cpu")
MODELS = ("mha", "mla")
SGLANG_SPECS: tuple[dict[str, Any], ...] = (
    {},
    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
     "speculative_num_draft_tokens": 2},
    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
     "speculative_num_draft_tokens": 4},
    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 4,
     "speculative_num_draft_tokens": 8},
    {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8, "speculative_ngram_max_bfs_breadth": 4},
)
VLLM_SPECS: tuple[dict[str, Any], ...] = ({}, {"spec_method": "eagle", "spec_tokens": "1"},
                                           {"spec_method": "eagle", "spec_tokens": "3"})


def inputs(engine: str) -> Iterator[tuple[str, dict[str, Any], str, str]]:
    specs = SGLANG_SPECS if engine == "sglang" else VLLM_SPECS
    for platform in PLATFORMS:
        vendor = parse(platform).vendor
        names = [e.name for e in catalog.entries(engine) if vendor in e.descriptor.vendors]
        for model in MODELS:
            for spec in specs:
                for name in [None, *names]:
                    args = {**spec, **({"attention_backend": name} if name else {})}
                    yield engine, args, platform, model


def timed(engine: str, args: dict[str, Any], platform: str, model: str) -> tuple[float, str]:
    """Seconds for one answer (cold planner cache) and what it came to."""
    decide._resolved.cache_clear()  # private: the benchmark measures the uncached path
    start = time.perf_counter()
    try:
        advice = advise(engine, args, platform, model)
        outcome = f"{advice.considered} planned"
    except EngineArgError as exc:
        outcome = f"refused: {exc.flag}"
    return time.perf_counter() - start, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sglang", "vllm", "both"), default="both")
    chosen = parser.parse_args().engine
    engines = ("sglang", "vllm") if chosen == "both" else (chosen,)
    for engine in engines:
        results = [(timed(*case), case) for case in inputs(engine)]
        seconds = [s for (s, _), _ in results]
        (worst, outcome), case = max(results, key=lambda r: r[0][0])
        refused = sum(1 for (_, o), _ in results if o.startswith("refused"))
        print(f"{engine}: {len(results)} inputs ({refused} refused as bad input), "
              f"median {statistics.median(seconds):.4f} s, worst {worst:.4f} s "
              f"({outcome}: {case[2]} {case[3]} {case[1]}), {len(results) / sum(seconds):.0f} answers/s")


if __name__ == "__main__":
    main()
