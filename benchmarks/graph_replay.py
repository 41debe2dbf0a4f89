"""Decode steps replayed from device graphs vs run eagerly, at batch 1, 8 and 32.

    python benchmarks/graph_replay.py [--backends torch,triton] [--new-tokens 64]

The reference worker (TinyLlama, no speculation) generates ``--new-tokens`` tokens
for each batch, once with graph capture disabled by policy and once with it
enabled (capture sizes 1, 8, 32), both after a warm-up generation. Prints tokens/s
of each, the speed-up, whether the tokens are equal, and the decode phase's
replays, eager runs and replay allocations (the allocator's count around each
replay, summed). Without a CUDA/HIP device it prints ``SKIP`` and exits 0.
"""

from __future__ import annotations

import argparse
import time

import torch

from attnhal.phases import Phase
from attnhal.planner import GraphPolicy
from attnhal.platform import detect
from attnhal.example_engine.model import ModelConfig, TinyLlama
from attnhal.example_engine.worker import Generation, SpecWorker
from attnhal.spec import SpecConfig

BATCHES = (1, 8, 32)


def generate(backend: str, graphs: bool, prompts: list[list[int]], new_tokens: int
             ) -> tuple[Generation, float, dict[str, object]]:
    worker = SpecWorker(TinyLlama(ModelConfig(seed=0)), None, SpecConfig(), platform=detect(), backend=backend,
                        policy=GraphPolicy(enabled=graphs, batch_sizes=BATCHES),
                        max_context_len=max(map(len, prompts)) + new_tokens + 8, max_requests=max(BATCHES))
    worker.generate(prompts, 4)  # warm-up: kernels compile, allocator grows
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = worker.generate(prompts, new_tokens)
    torch.cuda.synchronize()
    return out, time.perf_counter() - start, worker.runner.summary()[Phase.DECODE].to_dict()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="torch,triton")
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIP graph replay: no CUDA/HIP device")
        return 0
    ok = True
    gen = torch.Generator().manual_seed(0)
    for backend in args.backends.split(","):
        for bs in BATCHES:
            prompts = [torch.randint(0, 256, (int(n),), generator=gen).tolist()
                       for n in torch.randint(4, 32, (bs,), generator=gen)]
            eager, eager_s, _ = generate(backend, False, prompts, args.new_tokens)
            graphed, graph_s, stats = generate(backend, True, prompts, args.new_tokens)
            same = eager.tokens == graphed.tokens
            ok = ok and same and stats["replays"] > 0 and stats["replay_allocations"] == 0  # type: ignore[operator]
            tokens = bs * args.new_tokens
            print(f"{backend} bs {bs:>2}: eager {tokens / eager_s:8.0f} tok/s, graphs {tokens / graph_s:8.0f} tok/s "
                  f"({eager_s / graph_s:.2f}x); tokens equal: {same}; decode replays {stats['replays']}, "
                  f"eager runs {stats['eager_runs']}, replay allocations {stats['replay_allocations']}, "
                  f"captured {stats['captured_sizes']}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
