"""A reference speculative worker: EAGLE-style draft/verify/extend over attnhal backends.

The worker holds no capability or vendor logic of its own. The backend of each
role comes from the registry; whether each phase is captured comes only from
:func:`attnhal.plan`; :class:`~attnhal.graphs.GraphRunner` captures and replays.

One speculative step for a batch of requests (greedy):

1. ``draft_extend``: the draft model reads the tokens committed since its last
   step (padded to ``draft_extend_len``) and proposes ``topk`` first tokens.
2. ``draft_decode`` (``num_steps > 1``): ``num_steps - 1`` forwards grow a tree of
   ``topk`` branches per level, all captured as one graph.
3. ``target_verify``: the target scores the best ``num_draft_tokens - 1`` nodes plus
   the root under the tree mask.
4. Greedy acceptance; the accepted nodes' target K/V slots are kept, the rest freed.

KV bookkeeping: the target's cache holds every committed token but the last (the
root of the next tree); the draft's holds every committed token after its
extend. Draft-decode K/V go to scratch slots owned by the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import cast

import torch

from attnhal.backend import (
    PADDING_SLOT,
    AttentionBackend,
    ForwardBatch,
    KVPool,
    MultiStepDraft,
    SpecInfo,
    kv_storage_dtype,
    new_backend,
)
from attnhal.capabilities import AttentionRequest
from attnhal.errors import AttnhalError
from attnhal.example_engine.limits import check_tree_size
from attnhal.example_engine.model import TinyLlama
from attnhal.example_engine.requests import Request, admit, append_slots, free_row
from attnhal.example_engine.steps import decode_step, draft_decode_step, extend_step
from attnhal.example_engine.tree import DraftTree, VerifyTree, accept, first_level, select
from attnhal.graphs import GraphRunner
from attnhal.lookup import backend_class
from attnhal.phases import Phase
from attnhal.planner import GraphPlan, GraphPolicy, PhaseBackends, plan
from attnhal.platform import Platform, as_platform
from attnhal.registry import BackendEntry, Registry, default_registry
from attnhal.spec import SpecConfig

__all__ = ["Generation", "PlanInvalid", "SpecWorker", "check_tree_size"]

BackendClass = type[AttentionBackend]


class PlanInvalid(AttnhalError, RuntimeError):
    """The plan has a running phase without a capable backend."""

    def __init__(self, graph_plan: GraphPlan) -> None:
        self.plan = graph_plan
        lines = [f"  {p.value}: {r}" for p, d in graph_plan.phases.items() if d.blocking for r in d.reasons]
        super().__init__("the plan is invalid:\n" + "\n".join(lines))


@dataclass
class Generation:
    """Generated tokens per request and what it took."""

    tokens: list[list[int]]
    accepted: list[int] = field(default_factory=list)  # accepted draft tokens per verify, per request
    verify_steps: int = 0
    #: Requests stopped before ``max_new_tokens`` (index -> why): their KV did not fit.
    #: Their tokens are every token committed so far (a prefix of the full answer).
    stopped: dict[int, str] = field(default_factory=dict)

    @property
    def mean_accept_length(self) -> float:
        """Tokens committed per verify step (accepted draft tokens + the bonus token)."""
        return 1.0 + sum(self.accepted) / len(self.accepted) if self.accepted else 0.0


def _request(model: TinyLlama, page_size: int, kv_dtype: str) -> AttentionRequest:
    """What ``model`` asks of its attention backend: its layout, shapes and KV cache."""
    return AttentionRequest.of(config=model.cfg.attention, dtype="float32", kv_dtype=kv_dtype, page_size=page_size,
                               model=model.cfg.kind)


def _pick(registry: Registry, platform: Platform, model: TinyLlama, name: str | None, page_size: int,
          kv_dtype: str) -> BackendClass:
    request = _request(model, page_size, kv_dtype)
    if name is None:
        entry = registry.select(platform, request)
    else:  # a registered name or module:attr (attnhal.lookup), checked with every reason it does not fit
        entry = BackendEntry.of(backend_class(name, platform, registry=registry)).require(request, platform)
    backend = entry.backend
    assert backend is not None
    return backend


def _int(values: list[int], device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


class SpecWorker:
    """Greedy generation with (or, for ``SpecConfig()``, without) speculative decoding.

    Parameters
    ----------
    target, draft: the models (``draft`` unused without speculation).
    spec: the speculative config.
    platform: a Platform or spec string (``"hip:gfx942"``); detected when None.
    backend: the backend of every role, a registered name or ``module:attr`` (:mod:`attnhal.lookup`);
        the registry's choice when None.
    role_backends: per role (``"target"``, ``"draft_decode"``, ``"draft_extend"``), over ``backend``.
    policy: graph policy (capture sizes).
    max_context_len: the longest prompt + generation + draft tokens per request.
    max_requests: requests one ``generate`` call may hold (KV pool rows); default twice
        the largest capture size.
    page_size: tokens per KV page. Accepted draft tokens are moved to their positions'
        slots (a page table cannot point a position at a scattered slot).
    kv_dtype: the KV-cache dtype name (``"float32"``, ``"fp8_e4m3"`` in the platform's
        flavour, ``"fp8_e5m2"``...); the model computes in float32.
    """

    def __init__(self, target: TinyLlama, draft: TinyLlama | None, spec: SpecConfig, *,
                 platform: Platform | str | None = None, backend: str | None = None,
                 role_backends: Mapping[str, str] | None = None,
                 policy: GraphPolicy | None = None, max_context_len: int = 512,
                 max_requests: int | None = None, registry: Registry | None = None, page_size: int = 1,
                 kv_dtype: str = "float32") -> None:
        check_tree_size(spec)
        self.target, self.draft, self.spec = target, draft, spec
        self.platform = as_platform(platform)
        self.page_size, self.kv_dtype = page_size, kv_dtype
        self.cache_dtype = kv_storage_dtype(kv_dtype, self.platform.fp8_flavor)
        self.policy = policy or GraphPolicy(max_batch_size=8)
        self.device = torch.device(self.platform.torch_device)
        self.max_requests = max_requests or 2 * self.policy.capture_sizes()[-1]
        registry = registry or default_registry()
        names = {**dict.fromkeys(("target", "draft_decode", "draft_extend"), backend), **(role_backends or {})}
        speculative = spec.speculative and draft is not None
        pick = partial(_pick, registry, self.platform, page_size=page_size, kv_dtype=kv_dtype)
        self.classes: dict[str, BackendClass] = {"target": pick(target, names.get("target"))}
        if speculative:
            assert draft is not None
            self.classes["draft_extend"] = pick(draft, names.get("draft_extend"))
            if spec.num_steps > 1:
                self.classes["draft_decode"] = pick(draft, names.get("draft_decode"))
        caps = {role: cls.capabilities for role, cls in self.classes.items()}
        # Planned for this model and cache, so claims that hold only for some layouts, page sizes or
        # KV dtypes (a descriptor's variants) decide as they do for a server's request.
        self.initial_plan = plan(spec, self.platform, PhaseBackends(
            caps["target"], caps.get("draft_decode"), caps.get("draft_extend")), self.policy,
            context=_request(target, page_size, kv_dtype).context)
        if not self.initial_plan.valid:
            raise PlanInvalid(self.initial_plan)
        self._build(max_context_len)

    # --- construction ------------------------------------------------------------------------
    def _pool(self, model: TinyLlama, max_context_len: int, extra_slots: int = 0) -> KVPool:
        cfg, max_reqs, P = model.cfg, self.max_requests, self.page_size
        att = cfg.attention
        pages = max_reqs * -(-max_context_len // P) + -(-extra_slots // P)
        # MLA: one latent tensor per layer (V = K's first columns).
        return KVPool(num_layers=cfg.num_layers, num_slots=pages * P, num_kv_heads=att.num_kv_heads,
                      head_dim=att.head_size, kv_format=self.kv_dtype, fp8_flavor=self.platform.fp8_flavor,
                      max_reqs=max_reqs,
                      max_context_len=max_context_len, device=self.device, page_size=P,
                      v_head_dim=att.out_head_size, v_in_k=cfg.mla)

    def _build(self, max_context_len: int) -> None:
        self.target.to(self.device)
        self.target_pool = self._pool(self.target, max_context_len)
        self.target_backend = new_backend(self.classes["target"], self.target.cfg.attention, self.target_pool,
                                          self.platform)
        decode = decode_step(self.target, self.target_backend)
        steps = {Phase.DECODE: decode, Phase.TARGET_VERIFY: decode}
        if "draft_extend" in self.classes:
            assert self.draft is not None
            self.draft.to(self.device)
            max_rows = self.policy.capture_sizes()[-1] * self.spec.topk
            self.draft_pool = self._pool(self.draft, max_context_len, extra_slots=max_rows * self.spec.num_steps)
            self.extend_backend = new_backend(self.classes["draft_extend"], self.draft.cfg.attention,
                                              self.draft_pool, self.platform)
            # Scratch slots for draft-decode K/V, one per (row, step); never committed.
            n, P = max_rows * self.spec.num_steps, self.page_size
            pages = self.draft_pool.alloc_pages(-(-n // P))
            slots = (pages.view(-1, 1) * P + torch.arange(P, device=self.device)).view(-1)
            self.scratch = slots[:n].view(max_rows, -1)
            steps[Phase.DRAFT_EXTEND] = extend_step(self.draft, self.extend_backend)
            if "draft_decode" in self.classes:
                self.multi_step = MultiStepDraft(self.classes["draft_decode"], self.draft.cfg.attention,
                                                 self.draft_pool, self.spec, platform=self.platform)
                steps[Phase.DRAFT_DECODE] = draft_decode_step(self.draft, self.multi_step, self.spec.topk)
        self.runner = GraphRunner(self.initial_plan, self.platform,
                                  {p: s for p, s in steps.items() if self.initial_plan[p].runs})

    @property
    def plan(self) -> GraphPlan:
        """The plan as run: capture failures, if any, are recorded in it."""
        return self.runner.plan

    # --- generation ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> Generation:
        """Greedy continuation of each prompt by ``max_new_tokens`` tokens."""
        if not prompts or any(not p for p in prompts) or len(prompts) > self.max_requests:
            raise ValueError(f"prompts: {len(prompts)} (supported: 1..{self.max_requests} non-empty token lists; "
                             "raise max_requests for more)")
        reqs = [Request(list(p), len(p), self.target_pool.alloc_req(), index=i) for i, p in enumerate(prompts)]
        result = Generation(tokens=[])
        try:
            admitted = self._admit(reqs, result, self._prefill_end)
            if admitted:
                self._prefill(admitted)
            active = [r for r in admitted if len(r.tokens) - r.prompt_len < max_new_tokens]
            while active:
                for chunk in self._chunks(active):
                    chunk = self._admit(chunk, result, self._step_end)
                    if chunk and "draft_extend" in self.classes:
                        self._speculate(chunk, result)
                    elif chunk:
                        self._decode(chunk)
                active = [r for r in active if r.index not in result.stopped
                          and len(r.tokens) - r.prompt_len < max_new_tokens]
        finally:
            self._release(reqs)
        result.tokens = [r.tokens[r.prompt_len: r.prompt_len + max_new_tokens] for r in reqs]
        return result

    # --- KV room: a request whose next step does not fit stops with a reason ------------------
    def _prefill_end(self, r: Request) -> tuple[int, int]:
        """(target, draft) positions ``r`` holds after its prefill."""
        return r.prompt_len, r.prompt_len if "draft_extend" in self.classes else 0

    def _step_end(self, r: Request) -> tuple[int, int]:
        """(target, draft) positions ``r`` may hold during its next step: the verified nodes,
        and every token committed since the draft's last extend."""
        if "draft_extend" not in self.classes:
            return r.target_len + 1, 0
        return r.target_len + self.spec.num_draft_tokens, len(r.tokens)

    def _admit(self, reqs: list[Request], result: Generation,
               end: Callable[[Request], tuple[int, int]]) -> list[Request]:
        pools = [self.target_pool] + ([self.draft_pool] if "draft_extend" in self.classes else [])
        return admit(reqs, pools, end, result.stopped)

    def _append(self, pool: KVPool, row: int, start: int, count: int, cap: int) -> tuple[torch.Tensor, int]:
        return append_slots(pool, row, start, count, cap, self.device)

    def _chunks(self, reqs: list[Request]) -> list[list[Request]]:
        size = self.policy.capture_sizes()[-1]
        return [reqs[i: i + size] for i in range(0, len(reqs), size)]

    def _release(self, reqs: list[Request]) -> None:
        for r in reqs:
            free_row(self.target_pool, r.target_row, r.target_cap)
            if r.draft_row:
                free_row(self.draft_pool, r.draft_row, r.draft_cap)

    def _prefill(self, reqs: list[Request]) -> None:
        """Target (and draft) prefill of the prompts; the target's argmax is the first new token."""
        prompts = [r.tokens for r in reqs]
        logits, caps = self._prefill_model(self.target, self.target_backend, self.target_pool,
                                           [r.target_row for r in reqs], prompts)
        for r, tok, cap in zip(reqs, logits.argmax(-1).tolist(), caps):
            r.target_len, r.target_cap = r.prompt_len, cap
            r.tokens.append(tok)
        if "draft_extend" in self.classes:
            assert self.draft is not None
            for r in reqs:
                r.draft_row = self.draft_pool.alloc_req()
            _, caps = self._prefill_model(self.draft, self.extend_backend, self.draft_pool,
                                          [r.draft_row for r in reqs], [r.tokens[: r.prompt_len] for r in reqs])
            for r, cap in zip(reqs, caps):
                r.draft_len, r.draft_cap = r.prompt_len, cap

    def _prefill_model(self, model: TinyLlama, backend: AttentionBackend, pool: KVPool, rows: list[int],
                       prompts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """Logits of each prompt's last token, and each row's page capacity."""
        lens = [len(p) for p in prompts]
        taken = [self._append(pool, row, 0, n, 0) for row, n in zip(rows, lens)]
        loc = torch.cat([slots for slots, _ in taken])
        batch = ForwardBatch(Phase.PREFILL, _int(rows, self.device), _int(lens, self.device, torch.int32), loc,
                             extend_lens=_int(lens, self.device, torch.int32), extend_lens_cpu=lens,
                             seq_lens_cpu=torch.tensor(lens, dtype=torch.int32))
        ids = _int([t for p in prompts for t in p], self.device)
        positions = _int([i for n in lens for i in range(n)], self.device)
        backend.init_forward_metadata(batch)
        last = torch.tensor(lens).cumsum(0) - 1
        return model(ids, positions, batch, backend)[last.to(self.device)], [cap for _, cap in taken]

    def _decode(self, reqs: list[Request]) -> None:
        """Plain greedy decode: one token per request."""
        locs = []
        for r in reqs:
            slot, r.target_cap = self._append(self.target_pool, r.target_row, r.target_len, 1, r.target_cap)
            locs.append(slot)
        rows = _int([r.target_row for r in reqs], self.device)
        seq = [r.target_len + 1 for r in reqs]
        loc = torch.cat(locs)
        batch = ForwardBatch(Phase.DECODE, rows, _int(seq, self.device, torch.int32), loc,
                             seq_lens_cpu=torch.tensor(seq, dtype=torch.int32))
        inputs = {"input_ids": _int([r.tokens[-1] for r in reqs], self.device),
                  "positions": _int([r.target_len for r in reqs], self.device)}
        out = cast(torch.Tensor, self.runner.run(Phase.DECODE, batch, inputs))
        for r, tok in zip(reqs, out.tolist()):
            r.target_len += 1
            r.tokens.append(tok)

    # --- one speculative step -----------------------------------------------------------------
    def _speculate(self, reqs: list[Request], result: Generation) -> None:
        tree = first_level(self._draft_extend(reqs), self.spec.topk)
        if "draft_decode" in self.classes:
            tree = self._draft_decode(reqs, tree)
        roots = _int([r.tokens[-1] for r in reqs], self.device)
        verify = select(tree, roots, self.spec.num_draft_tokens, self.spec.num_steps)
        slots, target_next = self._verify(reqs, verify)
        node_tokens = verify.tokens.tolist()
        for r, toks, row_slots, (path, bonus) in zip(reqs, node_tokens, slots, accept(verify, target_next)):
            self._commit(r, toks, row_slots, path, bonus)
            result.accepted.append(len(path) - 1)
        result.verify_steps += 1

    def _draft_extend(self, reqs: list[Request]) -> torch.Tensor:
        """The draft reads the tokens committed since its last step; logits ``[bs, vocab]``."""
        width = self.spec.draft_extend_len
        new = [r.tokens[r.draft_len:] for r in reqs]
        ids, positions, locs = [], [], []
        for r, toks in zip(reqs, new):
            taken, r.draft_cap = self._append(self.draft_pool, r.draft_row, r.draft_len, len(toks), r.draft_cap)
            slots = taken.tolist()
            pad = width - len(toks)
            ids += toks + [0] * pad
            positions += list(range(r.draft_len, r.draft_len + width))
            locs += slots + [PADDING_SLOT] * pad
            r.draft_len += len(toks)
        batch = ForwardBatch(
            Phase.DRAFT_EXTEND, _int([r.draft_row for r in reqs], self.device),
            _int([r.draft_len for r in reqs], self.device, torch.int32), _int(locs, self.device),
            extend_lens=_int([len(t) for t in new], self.device, torch.int32),
            seq_lens_cpu=torch.tensor([r.draft_len for r in reqs], dtype=torch.int32),
            spec=SpecInfo(topk=self.spec.topk, num_draft_tokens=self.spec.num_draft_tokens, draft_extend_len=width))
        inputs = {"input_ids": _int(ids, self.device), "positions": _int(positions, self.device)}
        return cast(torch.Tensor, self.runner.run(Phase.DRAFT_EXTEND, batch, inputs))

    def _draft_decode(self, reqs: list[Request], tree: DraftTree) -> DraftTree:
        k, bs = self.spec.topk, len(reqs)
        rows = torch.arange(bs * k, device=self.device)
        batch = ForwardBatch(
            Phase.DRAFT_DECODE, _int([r.draft_row for r in reqs for _ in range(k)], self.device),
            _int([r.draft_len for r in reqs for _ in range(k)], self.device, torch.int32),
            self.scratch[rows, 0].clone(),
            seq_lens_cpu=torch.tensor([r.draft_len for r in reqs for _ in range(k)], dtype=torch.int32),
            spec=SpecInfo(topk=k, num_draft_tokens=self.spec.num_draft_tokens,
                          draft_extend_len=self.spec.draft_extend_len, draft_path=self.scratch[rows].clone()))
        out = cast(tuple[torch.Tensor, ...], self.runner.run(Phase.DRAFT_DECODE, batch, {"tokens": tree.tokens.reshape(-1),
                                                           "scores": tree.scores.reshape(-1)}))
        tokens, scores, parents = (t.view(bs, k, -1) for t in out)
        for s in range(tokens.shape[-1]):
            tree = tree.add_level(tokens[:, :, s], scores[:, :, s], parents[:, :, s])
        return tree

    def _verify(self, reqs: list[Request], tree: VerifyTree) -> tuple[list[list[int]], torch.Tensor]:
        n = tree.tokens.shape[1]
        slots = []
        for r in reqs:
            taken, r.target_cap = self._append(self.target_pool, r.target_row, r.target_len, n, r.target_cap)
            slots.append(taken)
        base = _int([r.target_len for r in reqs], self.device)
        batch = ForwardBatch(
            Phase.TARGET_VERIFY, _int([r.target_row for r in reqs], self.device),
            (base + n).to(torch.int32), torch.cat(slots),
            seq_lens_cpu=(base + n).to(torch.int32).cpu(),
            spec=SpecInfo(topk=self.spec.topk, num_draft_tokens=n, draft_extend_len=self.spec.draft_extend_len,
                          custom_mask=tree.mask if self.spec.topk > 1 else None))
        inputs = {"input_ids": tree.tokens.reshape(-1), "positions": (base[:, None] + tree.depth).reshape(-1)}
        out = cast(torch.Tensor, self.runner.run(Phase.TARGET_VERIFY, batch, inputs))
        return [s.tolist() for s in slots], out.view(len(reqs), n)

    def _commit(self, r: Request, tokens: list[int], slots: list[int], path: list[int], bonus: int) -> None:
        """Move the accepted nodes' target K/V to the positions they now hold, append the tokens.

        Node ``path[j]`` (``>= j``: ancestors come first) becomes position ``target_len + j``,
        whose slot is ``slots[j]``; ascending ``j`` never overwrites a node still to move.
        """
        moves = [(slots[i], slots[j]) for j, i in enumerate(path) if i != j]
        if moves:
            src, dst = (_int(list(x), self.device) for x in zip(*moves))
            self.target_pool.copy_slots(src, dst)
        r.target_len += len(path)
        r.tokens += [tokens[i] for i in path[1:]] + [bonus]
