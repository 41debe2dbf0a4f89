"""``attnhal demo``: the reference worker end to end, checked lossless against plain greedy."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from attnhal.example_engine.limits import worker_tree_tokens
from attnhal.example_engine.model import ModelConfig, TinyLlama, draft_of
from attnhal.example_engine.worker import Generation, SpecWorker
from attnhal.planner import GraphPlan, GraphPolicy
from attnhal.platform import Platform
from attnhal.spec import ModelKind, SpecConfig

__all__ = ["MODEL_LAYOUTS", "DemoConfig", "DemoReport", "run_demo"]

#: The demo target's attention per layout (``ModelConfig`` fields over its defaults: 4 query
#: heads of 64); the draft is derived from it. MLA is DeepSeek's absorbed form: q/k 576 (latent
#: 512 + rope 64), V and output the latent 512, one latent KV head; 16 query heads, as a
#: 128-head model has per rank at TP 8.
MODEL_LAYOUTS: Mapping[ModelKind, Mapping[str, Any]] = MappingProxyType({
    ModelKind.MHA: {"num_kv_heads": 4},
    ModelKind.GQA: {},
    ModelKind.MLA: {"mla": True, "num_q_heads": 16},
})


@dataclass(frozen=True)
class DemoConfig:
    """One ``attnhal demo`` run; every field is a flag of the command."""

    spec: SpecConfig
    platform: Platform
    backend: str | None = None
    batch_size: int = 4
    max_new_tokens: int = 32
    graphs: bool = True
    seed: int = 0  # the prompts (and the model, unless model_seed is given)
    max_prompt_len: int = 16  # prompt lengths are drawn in min(3, max)..max
    max_bs: int | None = None  # largest capture batch size; default batch_size
    model_seed: int | None = None
    page_size: int = 1
    kv_dtype: str = "float32"
    model: ModelKind = ModelKind.GQA

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        return GraphPolicy(max_batch_size=self.max_bs or self.batch_size).capture_sizes()

    def models(self) -> tuple[TinyLlama, TinyLlama]:
        """The target and its draft."""
        target = TinyLlama(ModelConfig(seed=self.seed if self.model_seed is None else self.model_seed,
                                       **MODEL_LAYOUTS[self.model]))
        return target, draft_of(target)

    def prompts(self, vocab: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed)
        shortest = min(3, self.max_prompt_len)
        lengths = torch.randint(shortest, self.max_prompt_len + 1, (self.batch_size,), generator=generator).tolist()
        return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]

    def context_len(self, prompts: list[list[int]]) -> int:
        """Tokens per request the KV pool must hold: prompt, generation and draft tokens (the
        most this worker's tree holds, not the larger trees engines verify)."""
        tree = worker_tree_tokens(self.spec.num_steps, self.spec.topk)
        return max(map(len, prompts)) + self.max_new_tokens + 2 * tree + 8


@dataclass
class DemoReport:
    """What ``attnhal demo`` prints; ``runs`` maps "eager" / "graphs" to their numbers."""

    plan: GraphPlan
    model: dict[str, Any]
    backends: dict[str, str]
    kv_cache: dict[str, Any]
    capture: dict[str, dict[str, Any]]
    greedy_tokens_per_s: float
    runs: dict[str, dict[str, Any]]

    @property
    def lossless(self) -> bool:
        return all(r["lossless"] for r in self.runs.values())

    def to_dict(self) -> dict[str, Any]:
        spec = self.plan.spec
        return {"platform": self.plan.platform, "model": self.model, "backends": self.backends,
                "kv_cache": self.kv_cache,
                "spec": {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens},
                "plan": self.plan.to_dict(), "capture": self.capture,
                "greedy_tokens_per_s": self.greedy_tokens_per_s, "runs": self.runs, "lossless": self.lossless}


def _timed(worker: SpecWorker, prompts: list[list[int]], max_new: int) -> tuple[Generation, float]:
    """The generation and its seconds, timed after one untimed identical generation.

    The warm-up takes every first call out of the timed region: JIT compiles (Triton,
    the CPU backend's build), lazy allocations and library handles. Timing a cold greedy
    run against warm speculative ones once made graphs look 34x faster than greedy.
    """
    worker.generate(prompts, max_new)
    start = time.perf_counter()
    out = worker.generate(prompts, max_new)
    return out, time.perf_counter() - start


def run_demo(cfg: DemoConfig) -> DemoReport:
    """Plain greedy, then speculative decoding eager and with graphs; returns the report."""
    target, draft = cfg.models()
    prompts = cfg.prompts(target.cfg.vocab_size)
    sizes = cfg.capture_sizes
    common: dict[str, Any] = dict(platform=cfg.platform, backend=cfg.backend,
                                  max_context_len=cfg.context_len(prompts),
                                  max_requests=max(cfg.batch_size, 2 * sizes[-1]),
                                  page_size=cfg.page_size, kv_dtype=cfg.kv_dtype)

    greedy = SpecWorker(target, None, SpecConfig(), policy=GraphPolicy(enabled=False, batch_sizes=sizes), **common)
    reference, greedy_s = _timed(greedy, prompts, cfg.max_new_tokens)
    runs: dict[str, Any] = {}
    modes = (("eager", False), ("graphs", True)) if cfg.graphs else (("eager", False),)
    worker = None
    for mode, enabled in modes:
        start = time.perf_counter()
        worker = SpecWorker(target, draft, cfg.spec, policy=GraphPolicy(enabled=enabled, batch_sizes=sizes),
                            **common)
        build_s = time.perf_counter() - start
        out, seconds = _timed(worker, prompts, cfg.max_new_tokens)
        tokens = cfg.batch_size * cfg.max_new_tokens
        runs[mode] = {"tokens_per_s": tokens / seconds, "seconds": seconds, "capture_s": build_s,
                      "mean_accept_length": out.mean_accept_length, "verify_steps": out.verify_steps,
                      "lossless": out.tokens == reference.tokens}
    assert worker is not None
    attention = target.cfg.attention
    return DemoReport(
        plan=worker.plan,
        model={"kind": cfg.model.value, "q_heads": attention.num_q_heads, "kv_heads": attention.num_kv_heads,
               "head_size": attention.head_size, "v_head_size": attention.v_head_size or attention.head_size},
        backends={role: cls.capabilities.name for role, cls in worker.classes.items()},
        kv_cache={"page_size": cfg.page_size, "kv_dtype": cfg.kv_dtype, "storage": str(worker.cache_dtype)},
        capture={p.value: st.to_dict() for p, st in worker.runner.summary().items()},
        greedy_tokens_per_s=cfg.batch_size * cfg.max_new_tokens / greedy_s,
        runs=runs,
    )
