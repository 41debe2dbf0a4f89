"""``attnhal demo`` times no first call: each timed generation follows an untimed identical one.

On a GPU the greedy reference was once timed with its Triton JIT compile inside
(57 tok/s, "graphs 33.9x vs greedy"). The timed regions are the spans between the demo's
clock reads; every generation inside one must be a repeat of an earlier, identical call
of the same worker.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from attnhal.example_engine import demo
from attnhal.example_engine.worker import SpecWorker
from attnhal.platform import parse
from attnhal.spec import SpecConfig


def test_every_timed_generation_is_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[Any, ...]] = []
    generate = SpecWorker.generate

    def spy_generate(self: SpecWorker, prompts: list[list[int]], max_new_tokens: int) -> Any:
        events.append(("generate", id(self), repr(prompts), max_new_tokens))
        return generate(self, prompts, max_new_tokens)

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            events.append(("clock",))
            return time.perf_counter()

    monkeypatch.setattr(SpecWorker, "generate", spy_generate)
    monkeypatch.setattr(demo, "time", Clock)
    report = demo.run_demo(demo.DemoConfig(spec=SpecConfig.eagle(num_steps=1), platform=parse("cpu"),
                                           backend="torch", batch_size=2, max_new_tokens=4))
    assert report.lossless

    seen: set[tuple[Any, ...]] = set()
    timed, clocks = [], 0
    for event in events:
        if event[0] == "clock":
            clocks += 1
            continue
        if clocks % 2:  # between a start and a stop read
            timed.append(event)
            assert event[1:] in seen, f"timed generation without an identical warm-up first: {event}"
        seen.add(event[1:])
    assert len(timed) == 3  # greedy, speculative eager, speculative with graphs
