"""SGLang's vocabulary (release 0.5.23): the modelled server flags, their aliases, the harmless ones.

A modelled flag is converted here (a bad value is an error naming the flag); what the
values *mean* for the plan is :mod:`attnhal_sglang.config`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attnhal.catalog import CatalogError, entries, load
from attnhal.engines import flags as _flags
from attnhal.engines.flags import EngineArgError, Flag, one_of, positive, positive_list, truth

__all__ = ["ALGORITHMS", "ALIASES", "DTYPES", "FIELD_FLAGS", "FLAGS", "HARMLESS", "KV_CACHE_DTYPES", "SGLANG_SERIES_DIGITS", "SGLANG_VERSION", "SGLANG_VERSIONS",
           "UNMODELLED", "parse_cli"]

#: The release whose flags this module reads and whose backends ``engines/attnhal_sglang/catalog`` describes.
SGLANG_VERSION = "0.5.23"
#: The releases the adapter and the plugin are tested against (``attnhal info``; the plugin audits only on others).
SGLANG_VERSIONS = (SGLANG_VERSION,)
#: SGLang's series is the release itself (``0.5.23``): its post-releases (``0.5.23.post1``) and
#: pre-releases are modelled as it (:func:`attnhal.engines.releases.modelled`); 0.5.24 is another.
SGLANG_SERIES_DIGITS = 3

#: Deprecated names SGLang still accepts (arg_groups/choices.py:75, 87; speculative/draft_utils.py:109, 140).
ALIASES = {"nsa": "dsa", "tokenspeed_mla": "cutedsl_mla"}
#: ``--speculative-algorithm`` -> attnhal's algorithm (speculative/spec_info.py:39-47).
#: NEXTN is SGLang's name for DeepSeek MTP; STANDALONE reuses the EAGLE worker.
ALGORITHMS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "standalone", "NGRAM": "ngram"}
#: ``--kv-cache-dtype`` -> attnhal kv dtype; ``auto`` = the model dtype (arg_groups/fields/model.py:197-210).
KV_CACHE_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
                   "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
#: ``--dtype`` -> attnhal compute dtype; ``auto`` = the checkpoint's dtype (not checked).
DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}

#: The flag naming the model's checkpoint: accepted and said not read — its attention kind can
#: change a decision; attnhal's ``--model`` / ``--model-config`` say it.
CHECKPOINT = frozenset({"model_path"})
#: Flags that cannot change which attention phases run or are captured: accepted, listed as
#: ignored (and the checkpoint's, listed as not read).
HARMLESS = CHECKPOINT | frozenset("""
tokenizer_path tokenizer_mode host port served_model_name trust_remote_code revision
load_format context_length mem_fraction_static max_running_requests max_total_tokens chunked_prefill_size
tp_size dp_size ep_size random_seed log_level log_requests enable_metrics show_time_cost
speculative_draft_model_path speculative_draft_model_revision speculative_draft_load_format
speculative_token_map speculative_accept_threshold_single speculative_accept_threshold_acc
schedule_policy schedule_conservativeness disable_radix_cache quantization watchdog_timeout
api_key skip_server_warmup enable_torch_compile torch_compile_max_bs
""".split())


def _backend(flag: str, value: Any) -> str:
    name = ALIASES.get(str(value), str(value))
    try:
        load(f"sglang:{name}")
    except CatalogError:
        known = ", ".join(e.name for e in entries("sglang"))
        raise EngineArgError(flag, f"{flag}={value!r} (supported: {known})") from None
    return name


#: SGLang 0.5.23 algorithms attnhal refuses, and why (speculative/spec_info.py). The block
#: drafters' draft is one forward over a whole block of draft positions, not attnhal's draft
#: decode steps or draft extend, and whether it is captured reads the GPU memory free at startup.
UNMODELLED = {
    "DFLASH": ("its draft is one non-causal forward over a block of --speculative-num-draft-tokens positions, "
               "conditioned on the target's hidden states (no draft decode steps, no draft extend), and SGLang "
               "captures that forward only with >= 1 GB of GPU memory free after the target is loaded on CUDA "
               "(dflash_worker_v2.py init_cuda_graphs): attnhal's phases cannot state either"),
    "DSPARK": ("a block drafter like DFLASH (one draft forward per block; captured only with >= 1 GB of GPU memory "
               "free on CUDA and ROCm, dspark_components/dspark_worker_v2.py): attnhal's phases cannot state it"),
    "UNO": ("it drafts with the target model and a LoRA adapter on FA3 only, capturing its own tree-draft graph "
            "(uno_worker_v2.py): no attnhal phase runs a LoRA draft on the target"),
    "FROZEN_KV_MTP": "its one draft-loop graph over the frozen target KV is not an attnhal phase",
}


def _algorithm(flag: str, value: Any) -> str:
    name = str(value).upper()
    if name in UNMODELLED:
        raise EngineArgError(flag, f"{flag}={value!r} is not modelled: {UNMODELLED[name]} "
                                   f"(supported: {', '.join(ALGORITHMS)})")
    if name not in ALGORITHMS:
        raise EngineArgError(flag, f"{flag}={value!r} (supported: {', '.join(ALGORITHMS)})")
    return name


#: The modelled arguments (release 0.5.23 names, plus the pre-0.5.23 global cuda-graph flags).
FLAGS: Mapping[str, Flag] = {
    "attention_backend": Flag(_backend),
    "prefill_attention_backend": Flag(_backend),
    "decode_attention_backend": Flag(_backend),
    "speculative_draft_attention_backend": Flag(_backend),
    "speculative_algorithm": Flag(_algorithm),
    "speculative_num_steps": Flag(positive),
    "speculative_eagle_topk": Flag(positive),
    "speculative_num_draft_tokens": Flag(positive),
    "speculative_ngram_max_bfs_breadth": Flag(positive),
    "speculative_attention_mode": Flag(one_of(("prefill", "decode"))),
    "page_size": Flag(positive),
    "kv_cache_dtype": Flag(one_of(("auto", *KV_CACHE_DTYPES))),
    "dtype": Flag(one_of(("auto", *DTYPES))),
    "disable_cuda_graph": Flag(truth, boolean=True),
    "disable_decode_cuda_graph": Flag(truth, boolean=True),
    "cuda_graph_backend_decode": Flag(one_of(("full", "disabled"))),
    "cuda_graph_max_bs": Flag(positive),
    "cuda_graph_max_bs_decode": Flag(positive),
    "cuda_graph_bs": Flag(positive_list),
    "cuda_graph_bs_decode": Flag(positive_list),
    "disable_cuda_graph_padding": Flag(truth, boolean=True),
    "enable_multi_layer_eagle": Flag(truth, boolean=True),
}


#: Planner field (an :class:`~attnhal.errors.InvalidValue`'s ``field``) -> the flags that set it, in
#: the order the resolution reads them, each with how a message names it.
FIELD_FLAGS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "num_steps": (("--speculative-num-steps", "--speculative-num-steps"),),
    "topk": (("--speculative-eagle-topk", "--speculative-eagle-topk"),),
    "num_draft_tokens": (("--speculative-num-draft-tokens", "--speculative-num-draft-tokens"),),
    "breadth": (("--speculative-ngram-max-bfs-breadth", "--speculative-ngram-max-bfs-breadth"),),
    "max_batch_size": (("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-decode"),
                       ("--cuda-graph-max-bs", "--cuda-graph-max-bs"),
                       ("--cuda-graph-bs-decode", "the largest --cuda-graph-bs-decode"),
                       ("--cuda-graph-bs", "the largest --cuda-graph-bs")),
    "batch_sizes": (("--cuda-graph-bs-decode", "--cuda-graph-bs-decode"), ("--cuda-graph-bs", "--cuda-graph-bs")),
    "page_size": (("--page-size", "--page-size"),),
}


def parse_cli(argv: Sequence[str]) -> dict[str, Any]:
    """SGLang command-line flags -> ``{argument_name: text}`` (see :func:`attnhal.engines.flags.parse_cli`),
    each flag first read as SGLang's argparse reads it (:func:`attnhal_sglang.grammar.rewrite`:
    abbreviations, ambiguous prefixes and underscores as SGLang's parser takes or refuses them)."""
    from attnhal_sglang.grammar import rewrite

    return _flags.parse_cli(rewrite(argv), FLAGS)
