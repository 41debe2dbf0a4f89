"""The reference worker on an MLA model (absorbed: q/k 576 = latent 512 + rope 64, V the latent,
one latent tensor per layer): speculative decoding is lossless against plain greedy, on the
torch backend and on the Triton kernels (interpreter on CPU), with graphs."""

import functools
import os

import pytest

from attnhal.example_engine.model import ModelConfig, TinyLlama, draft_of
from attnhal.example_engine.worker import SpecWorker
from attnhal.planner import GraphPolicy
from attnhal.platform import parse
from attnhal.spec import SpecConfig

TARGET = TinyLlama(ModelConfig(num_layers=2, hidden_size=64, ffn_size=128, vocab_size=128, num_q_heads=16, mla=True))
DRAFT = draft_of(TARGET)
PROMPTS = [[5, 6, 7], [1, 2]]


@functools.lru_cache(maxsize=None)
def _worker(spec: SpecConfig, platform: str, backend: str, graphs: bool) -> SpecWorker:
    return SpecWorker(TARGET, DRAFT if spec.speculative else None, spec, platform=platform, backend=backend,
                      policy=GraphPolicy(enabled=graphs, batch_sizes=(2,)), max_context_len=48, page_size=16)


def test_the_model_is_mla_and_its_pool_one_latent_tensor() -> None:
    w = _worker(SpecConfig(), "cpu", "torch", False)
    config = TARGET.cfg.attention
    assert (config.head_size, config.out_head_size, config.num_kv_heads) == (576, 512, 1)
    assert w.target_pool.v_in_k and w.target_pool.v[0].data_ptr() == w.target_pool.k[0].data_ptr()


def _triton_ready() -> bool:
    try:
        from attnhal_triton import TritonBackend
    except ImportError:
        return False
    return not TritonBackend.runtime_reasons(parse("hip:gfx942"))


@pytest.mark.parametrize("backend,platform", [("torch", "cpu"), ("triton", "cuda:sm90")])
@pytest.mark.parametrize("spec", [SpecConfig.eagle(1), SpecConfig.eagle(3)], ids=["eagle1", "eagle3"])
def test_speculative_mla_is_plain_greedy(spec: SpecConfig, backend: str, platform: str) -> None:
    """Triton under the interpreter costs minutes per case (16 heads x 576 per forward, two
    layers, graphs captured): EAGLE-3 there runs with ATTNHAL_SLOW=1."""
    if backend == "triton" and not _triton_ready():
        pytest.skip("triton not installed, or no GPU and no TRITON_INTERPRET=1")
    if backend == "triton" and spec.num_steps > 1 and not os.environ.get("ATTNHAL_SLOW"):
        pytest.skip("Triton interpreter, EAGLE-3 on the MLA model: set ATTNHAL_SLOW=1")
    want = _worker(SpecConfig(), "cpu", "torch", False).generate(PROMPTS, 5).tokens
    assert _worker(spec, platform, backend, True).generate(PROMPTS, 5).tokens == want


def test_a_tree_on_an_mla_model_is_plain_greedy() -> None:
    """A reliability-run case (seed 5) whose accepted tree path chains slot moves (a destination
    that is also a source): the MLA pool's V, inside K's rows, was moved a second time from rows
    already overwritten, and request 2 left greedy at its 6th token."""
    from attnhal.cli import parsed_demo_config
    from attnhal.example_engine.demo import run_demo

    argv = ("demo --max-bs 4 --model-seed 0 --platform cpu --backend torch --model mla --spec-steps 4 --topk 2 "
            "--draft-tokens 4 --batch-size 3 --prompt-len 16 --max-new-tokens 7 --seed 629240057 --no-graphs")
    assert run_demo(parsed_demo_config(argv.split())).lossless
