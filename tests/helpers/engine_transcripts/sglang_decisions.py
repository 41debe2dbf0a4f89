"""SGLang 0.5.23's own speculative-decoding graph decisions, transcribed by hand.

These functions restate what the *engine's code* decides — its server-argument
checks, its backend constructors and its ``isinstance`` allowlists — so the
acceptance grid can compare attnhal's plan with the engine cell by cell. They
import nothing from attnhal on purpose: they must stay a second, independent
reading of the engine.

Every rule cites ``path:line`` in the ``sglang-0.5.23`` wheel (paths are under
``sglang/srt/``). Read from ``pip download --no-deps sglang==0.5.23``.
"""

from __future__ import annotations

from dataclasses import dataclass

SGLANG_VERSION = "0.5.23"

#: Phases the engine may capture in a speculative run.
DRAFT_DECODE, DRAFT_EXTEND, TARGET_VERIFY = "draft_decode", "draft_extend", "target_verify"

#: ``--speculative-algorithm`` values with EAGLE's phases. NEXTN is an alias of EAGLE
#: (spec_info.py:39-47); STANDALONE's worker subclasses EAGLE's (standalone_worker_v2.py:37,138).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


@dataclass(frozen=True)
class Case:
    """One engine configuration: one platform, one spec setting, and the backends:
    ``backend`` is ``--attention-backend`` (the prefill backend), ``decode_backend``
    ``--decode-attention-backend`` (default: the same)."""

    backend: str
    vendor: str  # "cuda" | "hip" | "cpu"
    arch: str  # "sm90", "gfx942", "cpu"
    model: str  # "mha" | "mla"
    num_steps: int
    topk: int
    page_size: int
    algorithm: str = "EAGLE"
    graphs: bool = True  # not --disable-cuda-graph / --disable-decode-cuda-graph
    draft_extend_graph_env_off: bool = False  # SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1
    decode_backend: str | None = None
    attention_mode: str = "prefill"  # --speculative-attention-mode

    @property
    def decode(self) -> str:
        """The decode backend: it also builds the multi-step draft (draft_utils.py:55-61, 115-120)."""
        return self.decode_backend or self.backend

    @property
    def extend(self) -> str:
        """The draft-extend backend: prefill or decode, as the mode says (draft_utils.py:145-149)."""
        return self.decode if self.attention_mode == "decode" else self.backend


@dataclass(frozen=True)
class Decision:
    """What the engine does: refuses (with the cited reason), or which phases it captures."""

    refused: str | None
    page_size: int  # after the engine's own page-size adjustments
    runs: frozenset[str] = frozenset()
    captured: frozenset[str] = frozenset()


# --- which classes the engine builds --------------------------------------------------

#: Draft-extend backend class per ``--attention-backend`` and model kind
#: (speculative/draft_utils.py:126-144 and the builders at draft_utils.py:436-538).
_EXTEND_CLASS = {
    ("flashinfer", "mha"): "FlashInferAttnBackend",  # draft_utils.py:437-445
    ("flashinfer", "mla"): "FlashInferMLAAttnBackend",  # draft_utils.py:446-454
    "triton": "TritonAttnBackend",  # draft_utils.py:456-462
    "aiter": "AiterAttnBackend",  # draft_utils.py:477-480
    "fa3": "FlashAttentionBackend",  # draft_utils.py:482-499
    "fa4": "FlashAttentionBackend",  # draft_utils.py:501-502
    "flashmla": "FlashMLABackend",  # draft_utils.py:532-538
    "trtllm_mha": "TRTLLMHAAttnBackend",  # draft_utils.py:504-510
    "trtllm_mla": "TRTLLMMLABackend",  # draft_utils.py:512-523
    "cutedsl_mla": "TRTLLMMLABackend",  # draft_utils.py:137-138: decode-only, extend on trtllm-gen
    "dsa": "DeepseekSparseAttnBackend",  # draft_utils.py:214-224
    "intel_amx": "IntelAMXAttnBackend",  # draft_utils.py:464-467
}

#: Base classes that matter for the allowlist's ``isinstance`` checks.
_BASES = {
    "TRTLLMHAAttnBackend": "FlashInferAttnBackend",  # layers/attention/trtllm_mha_backend.py:176
    "TRTLLMMLABackend": "FlashInferMLAAttnBackend",  # layers/attention/trtllm_mla_backend.py:199
    "FlashMLABackend": "FlashInferMLAAttnBackend",  # layers/attention/flashmla_backend.py:64
}

#: Names with a multi-step draft builder (draft_utils.py:96-113) and a draft-extend
#: builder (draft_utils.py:126-144); any other name raises "EAGLE is not supported".
_DRAFT_BACKENDS = frozenset(("flashinfer", "triton", "intel_amx", "aiter", "fa3", "flashmla", "trtllm_mha",
                             "trtllm_mla", "cutedsl_mla", "dsa", "fa4"))

#: CUDA's draft-extend allowlist (speculative/eagle_worker_v2.py:567-599); QwenSparse and
#: DeepseekV4 entries are left out: no catalogued backend builds them.
_CUDA_EXTEND_GRAPH = frozenset(("TritonAttnBackend", "TRTLLMMLABackend", "TRTLLMHAAttnBackend",
                                "FlashInferAttnBackend", "DeepseekSparseAttnBackend",
                                "FlashAttentionBackend", "FlashMLABackend"))

#: HIP's draft-extend rule (eagle_worker_v2.py:546-565): the *draft-decode* backend is an
#: AiterMultiStepDraftBackend, or the draft-extend backend is one of these classes.
_HIP_EXTEND_GRAPH = frozenset(("DeepseekSparseAttnBackend",))

#: Backends that accept topk > 1 with page_size > 1 (arg_groups/speculative_hook.py:1271).
_PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")


def _isinstance(cls: str, allowed: frozenset[str]) -> bool:
    while cls:
        if cls in allowed:
            return True
        cls = _BASES.get(cls, "")
    return False


# --- the engine's adjustments and refusals ----------------------------------------------

def engine_page_size(case: Case) -> int:
    """The page size after SGLang's own snaps (it changes the user's value, with a warning)."""
    page, name = case.page_size, case.backend
    if name == "flashmla":
        return 64  # arg_groups/overrides.py:1147-1154
    if name in ("trtllm_mla", "cutedsl_mla") and page not in (32, 64):
        return 64  # overrides.py:1155-1173
    if name == "trtllm_mha" and page not in (16, 32, 64, 128):
        return 64  # overrides.py:1174-1187
    if name == "fa4" and case.model == "mha" and case.arch == "sm100" and case.topk <= 1:
        return 128  # overrides.py:1274-1296
    return page


def _arch_refusal(case: Case, name: str) -> str | None:
    arch = case.arch
    if name == "fa3" and case.vendor == "cuda":
        ok = (arch.startswith("sm8") and case.model == "mha") or arch.startswith("sm9")
        return None if ok else "fa3 needs SM 8.x (non-MLA) or 9.x (layers/attention/attention_registry.py:241-246)"
    if name == "trtllm_mha" and arch not in ("sm90", "sm100", "sm120"):
        return "trtllm_mha needs SM90/SM100/SM120 (arg_groups/attention_hook.py:198-227)"
    if name == "trtllm_mla" and not arch.startswith(("sm10", "sm11", "sm12")):
        return "trtllm_mla needs Blackwell, SM 10.x-12.x (overrides.py:1210-1213; utils/common.py:297-303)"
    if name == "cutedsl_mla" and arch != "sm100":
        return "cutedsl_mla needs SM100 (arg_groups/overrides.py:1244-1247)"
    return None


def _model_refusal(case: Case, name: str) -> str | None:
    mla_only = ("trtllm_mla", "cutedsl_mla", "flashmla", "dsa")
    if name in mla_only and case.model != "mla":
        return f"{name} needs an MLA model (layers/attention/attention_registry.py:94-125; draft_utils.py:358-393)"
    if name == "trtllm_mha" and case.model == "mla":
        return "trtllm_mha needs a non-MLA model (layers/attention/attention_registry.py:277-283)"
    return None


def _platform_refusal(case: Case) -> str | None:
    for name in dict.fromkeys((case.backend, case.decode)):
        why = _arch_refusal(case, name) or _model_refusal(case, name)
        if why:
            return why
    return None


def refusal(case: Case, page_size: int) -> str | None:
    """Why the engine stops before serving (server args, constructors, first draft extend)."""
    if case.algorithm == "NGRAM":
        # The device check (arg_groups/speculative_hook.py:1287-1290) passes on ROCm: its device is "cuda".
        if case.topk > 1 and page_size > 1 and case.backend != "flashinfer":
            return "NGRAM topk > 1 with page_size > 1 only on flashinfer (speculative_hook.py:1355-1364)"
        return _platform_refusal(case)
    why = _platform_refusal(case)
    if why:
        return why
    builders = ([case.decode] if case.num_steps > 1 else []) + [case.extend]  # draft_utils.py:84-168
    for name in builders:
        if name not in _DRAFT_BACKENDS:
            return f"EAGLE is not supported in attention backend {name} (speculative/draft_utils.py:63-64, 96-154)"
    if "trtllm_mha" in (case.backend, case.decode) and case.topk > 1:
        return "trtllm_mha only supports topk = 1 (arg_groups/speculative_hook.py:1176-1180)"
    if case.topk > 1 and page_size > 1 and case.backend not in _PAGE_TREE_SPEC_BACKENDS:
        return "topk > 1 with page_size > 1 only on flashinfer/fa3/triton (speculative_hook.py:1271-1282)"
    if case.num_steps > 1 and case.topk > 1:
        if case.decode == "flashinfer" and case.model == "mla":
            return "FlashInferMLAMultiStepDraftBackend raises for topk > 1 (layers/attention/flashinfer_mla_backend.py:1196-1199)"
        if case.decode == "flashmla":
            return "FlashMLAMultiStepDraftBackend raises for topk > 1 (layers/attention/flashmla_backend.py:608-611)"
    if case.extend == "aiter" and case.topk > 1:
        return "AiterAttnBackend draft extend raises for topk > 1 (layers/attention/aiter_backend.py:1396-1401, called at 2210 and 3344)"
    return None


# --- what the engine captures ---------------------------------------------------------

def _extend_class(case: Case) -> str:
    return _EXTEND_CLASS.get((case.extend, case.model)) or _EXTEND_CLASS[case.extend]


def draft_extend_captured(case: Case) -> bool:
    """eagle_worker_v2.py:546-629: the vendor branches that decide the draft-extend graph."""
    if case.draft_extend_graph_env_off:
        return False  # eagle_worker_v2.py:627
    if case.vendor == "hip":
        # Reads the draft-DECODE backend, which is None when num_steps == 1 (draft_utils.py:86-87).
        aiter_multi_step = case.decode == "aiter" and case.num_steps > 1
        return aiter_multi_step or _isinstance(_extend_class(case), _HIP_EXTEND_GRAPH)
    return _isinstance(_extend_class(case), _CUDA_EXTEND_GRAPH)  # eagle_worker_v2.py:601-609


def decide(case: Case) -> Decision:
    """The engine's decision for ``case``: refused, or per phase runs / captured."""
    page = engine_page_size(case)
    why = refusal(case, page)
    if why:
        return Decision(refused=why, page_size=page)
    if case.algorithm == "NGRAM":
        runs = frozenset((TARGET_VERIFY,))  # ngram_worker.py: no draft model, verify only
    else:
        runs = frozenset((DRAFT_EXTEND, TARGET_VERIFY) + ((DRAFT_DECODE,) if case.num_steps > 1 else ()))
    # torch_native turns every CUDA graph off (attention_hook.py:124-141); CPU captures
    # no speculative graph (eagle_worker_v2.py:481; model_executor/cpu_graph_runner.py:663-665).
    if not case.graphs or case.vendor == "cpu" or case.backend == "torch_native":
        return Decision(refused=None, page_size=page, runs=runs)
    captured = {TARGET_VERIFY}  # model_executor/runner/decode_cuda_graph_runner.py:362-367
    if DRAFT_DECODE in runs:
        captured.add(DRAFT_DECODE)  # eagle_worker_v2.py:496-509: any backend, when num_steps > 1
    if DRAFT_EXTEND in runs and draft_extend_captured(case):
        captured.add(DRAFT_EXTEND)
    return Decision(refused=None, page_size=page, runs=runs, captured=frozenset(captured))
