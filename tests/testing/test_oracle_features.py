"""Window, soft-cap, sinks, MLA, pages and fp8: the reference cross-checked by independent
formulas, the torch backend against the reference, and refusals of what is not claimed.

The conformance kit runs the torch backend's feature, page-size and KV-dtype claims over
every phase and graph phase (backends/attnhal_torch/tests/test_conformance.py); here are the targeted cases.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attnhal.backend import AttentionConfig, KVPool, UnsupportedFeature, UnsupportedPhase, config_reasons
from attnhal.phases import Feature, Phase
from attnhal.platform import parse
from attnhal.spec import SpecConfig
from attnhal.testing.cases import Case, CaseRecipe, build_case
from attnhal.testing.oracle import quantize, real_tokens, reference_forward, store
from attnhal_torch import TorchBackend

TREE = SpecConfig.eagle(3, topk=2, num_draft_tokens=4)
TREES = ((-1, 0, 0, 1), (-1, 0, 1, 2))


def _reference(case: Case) -> torch.Tensor:
    return reference_forward(case.q, case.k, case.v, case.layer, case.batch, case.pool, case.config.sm_scale,
                             case.config)


def _written(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The case's layer with the new tokens written, dequantized (float64)."""
    copy = case.pool.layer_copy(case.layer)
    copy.write(0, case.batch.out_cache_loc, case.k, case.v)
    k, v = copy.dequantized(0)
    return k.double(), v.double()


def _sdpa_rows(case: Case) -> torch.Tensor:
    """Every row by SDPA over explicit keys: a boolean-built additive mask for causality,
    tree and window, and the sink as one more key of zeros whose logit is the mask value
    (``scale * q . 0 + sink``) with a value of zeros. Independent of the reference's loop."""
    cfg, batch = case.config, case.batch
    k_all, v_all = _written(case)
    table = case.pool.token_table()
    G, window = cfg.group_size, cfg.window(case.layer)
    sinks = cfg.sinks[case.layer].double() if cfg.sinks is not None else None
    T = batch.tokens_per_row or 0
    out = torch.zeros(case.q.shape[0], cfg.num_q_heads, cfg.out_head_size, dtype=torch.float64)
    start = 0
    for r in range(batch.batch_size):
        req, seq = int(batch.req_pool_indices[r]), int(batch.seq_lens[r])
        n = int(batch.extend_lens[r]) if batch.phase is Phase.PREFILL else T
        prefix = seq - n
        kpos = torch.arange(seq)
        if batch.phase is Phase.TARGET_VERIFY:
            mask = batch._spec().custom_mask[r]
            allowed = torch.ones(n, seq, dtype=torch.bool)
            allowed[:, prefix:] = mask
            kpos[prefix:] = prefix + mask.sum(1) - 1  # a draft token sits at its depth
            qpos = kpos[prefix:]
        else:  # prefill: causal
            qpos = prefix + torch.arange(n)
            allowed = kpos.view(1, -1) <= qpos.view(-1, 1)
        if window is not None:
            allowed &= kpos.view(1, -1) >= qpos.view(-1, 1) - window
        slots = table[req, :seq]
        q = case.q[start:start + n].double().transpose(0, 1)  # [H, n, D]
        k = k_all[slots].repeat_interleave(G, dim=1).transpose(0, 1)  # [H, seq, D]
        v = v_all[slots].repeat_interleave(G, dim=1).transpose(0, 1)
        bias = torch.zeros(cfg.num_q_heads, n, seq, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
        if sinks is not None:
            k = torch.cat([k, torch.zeros_like(k[:, :1])], 1)
            v = torch.cat([v, torch.zeros_like(v[:, :1])], 1)
            bias = torch.cat([bias, sinks.view(-1, 1, 1).expand(-1, n, 1)], 2)
        rows = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=cfg.sm_scale)
        out[start:start + n] = rows.transpose(0, 1)
        start += n
    return out


@pytest.mark.parametrize("spec", [
    CaseRecipe(Phase.PREFILL, prefix_lens=(9, 0, 20), new_lens=(7, 5, 3), sliding_window=4, sinks=True,
             page_size=16, slot_seed=3),
    CaseRecipe(Phase.PREFILL, prefix_lens=(3, 12), new_lens=(6, 2), num_q_heads=4, num_kv_heads=1, sinks=True,
             kv_dtype="fp8_e4m3", fp8_flavor="e4m3fnuz", kv_scale=0.5),
    CaseRecipe(Phase.TARGET_VERIFY, prefix_lens=(11, 30), spec=TREE, tree_parents=TREES, sliding_window=2,
             sinks=True, page_size=16, slot_seed=5),
    CaseRecipe(Phase.TARGET_VERIFY, prefix_lens=(4, 6), spec=TREE, tree_parents=TREES, head_size=576,
             v_head_size=512, num_kv_heads=1),
], ids=["prefill-window-sinks-page16", "prefill-mqa-sinks-fp8", "verify-tree-window-sinks", "verify-mla"])
def test_reference_equals_sdpa_with_explicit_mask_and_sink_column(spec: CaseRecipe) -> None:
    case = build_case(spec)
    want, got = _sdpa_rows(case), _reference(case)
    assert torch.allclose(got, want, atol=1e-10, rtol=1e-10)


def test_reference_softcap_equals_a_vectorized_formula() -> None:
    case = build_case(CaseRecipe(Phase.DECODE, prefix_lens=(17, 40), logit_softcap=0.7, num_q_heads=4))
    cfg, batch = case.config, case.batch
    k_all, v_all = _written(case)
    table = case.pool.token_table()
    want = torch.zeros(case.q.shape[:2] + (cfg.out_head_size,), dtype=torch.float64)
    for r in range(batch.batch_size):
        slots = table[int(batch.req_pool_indices[r]), :int(batch.seq_lens[r])]
        k = k_all[slots].repeat_interleave(cfg.group_size, 1)
        logits = torch.einsum("hd,nhd->hn", case.q[r].double(), k) * cfg.sm_scale
        probs = torch.softmax(0.7 * torch.tanh(logits / 0.7), -1)
        want[r] = torch.einsum("hn,nhd->hd", probs, v_all[slots].repeat_interleave(cfg.group_size, 1))
    assert torch.allclose(_reference(case), want, atol=1e-12)


@pytest.mark.parametrize("phase", list(Phase))
def test_torch_backend_all_features_at_once(phase: Phase) -> None:
    """Window (per layer), soft-cap, sinks, page 16 and fp8 together, on the window layer."""
    fields = {
        Phase.PREFILL: dict(prefix_lens=(20, 0), new_lens=(30, 5)),
        Phase.DECODE: dict(prefix_lens=(40, 7)),
        Phase.TARGET_VERIFY: dict(prefix_lens=(33, 9), spec=TREE, tree_parents=TREES),
        Phase.DRAFT_EXTEND: dict(prefix_lens=(33, 9), new_lens=(2, 3), spec=SpecConfig.eagle(2)),
        Phase.DRAFT_DECODE: dict(prefix_lens=(33, 9), spec=TREE, draft_step=1),
    }[phase]
    spec = CaseRecipe(phase, num_layers=2, layer=1, sliding_window=(None, 3), logit_softcap=5.0, sinks=True,
                    page_size=16, slot_seed=2, kv_dtype="fp8_e4m3", kv_scale=0.25, **fields)  # type: ignore[arg-type]
    case = build_case(spec)
    backend = TorchBackend(case.config, case.pool, chunk=16)
    backend.init_forward_metadata(case.batch)
    out = backend.forward(case.q, case.k, case.v, case.layer, case.batch)
    tokens = real_tokens(case.batch)
    assert torch.allclose(out.double()[tokens], _reference(case)[tokens], atol=1e-5, rtol=1e-5)


def test_window_keeps_early_chunks_off_a_long_decode() -> None:
    """A window far shorter than the context: chunks every query would attend without a window
    (eager skips their mask) must still be masked on the window layer, not on the full one."""
    spec = CaseRecipe(Phase.DECODE, prefix_lens=(300, 200), num_layers=2, sliding_window=(None, 10))
    for layer in (0, 1):
        case = build_case(replace(spec, layer=layer))
        backend = TorchBackend(case.config, case.pool, chunk=32, host_workers=1)
        backend.init_forward_metadata(case.batch)
        out = backend.forward(case.q, case.k, case.v, layer, case.batch)
        assert torch.allclose(out.double(), _reference(case), atol=1e-5)


def test_config_features_and_windows() -> None:
    cfg = AttentionConfig(num_q_heads=8, num_kv_heads=1, head_size=576, v_head_size=512,
                          sliding_window=(None, 128, None, 4), logit_softcap=30.0, sinks=torch.zeros(4, 8))
    assert cfg.features == {Feature.SLIDING_WINDOW, Feature.LOGIT_SOFTCAP, Feature.SINKS, Feature.MLA}
    assert cfg.windows == (4, 128) and cfg.window(0) is None and cfg.window(3) == 4
    assert AttentionConfig(num_q_heads=2, num_kv_heads=2, head_size=64, v_head_size=64).features == frozenset()


def _pool(dtype: torch.dtype = torch.float32, page_size: int = 1, head: int = 16) -> KVPool:
    return KVPool(num_layers=1, num_slots=64, num_kv_heads=2, head_dim=head, dtype=dtype, max_reqs=2,
                  max_context_len=32, page_size=page_size)


def test_flavour_of_the_pool_must_match_the_platform() -> None:
    cfg = AttentionConfig(num_q_heads=4, num_kv_heads=2, head_size=16)
    fnuz = _pool(torch.float8_e4m3fnuz)
    with pytest.raises(UnsupportedFeature, match=r"kv_dtype=fp8_e4m3 stored as e4m3fnuz \(supported: fp8_e4m3 as "
                                                 r"e4m3fn, the flavour of platform cuda:sm90\)"):
        TorchBackend(cfg, fnuz, platform=parse("cuda:sm90"))
    TorchBackend(cfg, fnuz, platform=parse("hip:gfx942"))
    TorchBackend(cfg, fnuz, platform=parse("cpu"))  # no hardware flavour: read in software


def test_unclaimed_features_page_sizes_and_kv_dtypes_are_refused_at_construction() -> None:
    caps = replace(TorchBackend.capabilities, features=frozenset({Feature.CUSTOM_MASK}), page_sizes=frozenset({1}),
                   kv_dtypes=frozenset({"float32"}))
    cfg = AttentionConfig(num_q_heads=4, num_kv_heads=2, head_size=16, sliding_window=8, logit_softcap=2.0)
    reasons = [r.message for r in config_reasons(caps, cfg, _pool(torch.float8_e5m2, page_size=16))]
    # in the order of the capabilities' rule (request_reasons), which config_reasons applies
    assert reasons == ["kv_dtype=fp8_e5m2 (supported: {float32})", "page_size=16 (supported: {1})",
                       "feature=logit_softcap (supported: {custom_mask})",
                       "feature=sliding_window (supported: {custom_mask})"]

    class WindowLess(TorchBackend):
        capabilities = caps

    with pytest.raises(UnsupportedPhase, match=r"backend 'torch': feature=logit_softcap .*feature=sliding_window"):
        WindowLess(cfg, _pool())


def test_triton_backend_refuses_what_its_descriptor_does_not_claim() -> None:
    pytest.importorskip("triton")
    from attnhal_triton import TritonBackend

    caps = TritonBackend.capabilities
    for feature, fields in ((Feature.SLIDING_WINDOW, {"sliding_window": 16}), (Feature.LOGIT_SOFTCAP, {"logit_softcap": 30.0}),
                            (Feature.SINKS, {"sinks": torch.zeros(1, 4)})):
        if feature in caps.features:
            continue  # claimed by the Triton kernels: its conformance claim checks it
        cfg = AttentionConfig(num_q_heads=4, num_kv_heads=2, head_size=64, dtype=torch.float16, **fields)  # type: ignore[arg-type]
        with pytest.raises(UnsupportedFeature, match=f"feature={feature.value}"):
            TritonBackend(cfg, _pool(torch.float16, head=64), platform=parse("cuda:sm90"))


@pytest.mark.parametrize("dtype, top", [(torch.float8_e4m3fn, 448.0), (torch.float8_e4m3fnuz, 240.0),
                                        (torch.float8_e5m2, 57344.0)])
def test_the_oracle_saturates_fp8_writes_in_every_flavour(dtype: torch.dtype, top: float) -> None:
    """Past the range a write stores ±max, never NaN or inf, whatever the bare conversion does;
    within it, x / scale rounded; and the pool stores the same bytes as the oracle expects."""
    x = torch.tensor([[0.5, -3.0, 2 * top, -2 * top, 1e9]])
    stored = quantize(x, 0.5, dtype)
    assert stored.float().tolist() == [[1.0, -6.0, top, -top, top]]
    bare = (x / 0.5).to(dtype).float()
    assert dtype == torch.float8_e4m3fn or not torch.isfinite(bare).all()  # why the oracle says so
    pool, want = (KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=5, dtype=dtype, max_reqs=1,
                         max_context_len=8) for _ in range(2))
    for p in (pool, want):
        p.k_scale.fill_(0.5)
        p.v_scale.fill_(0.25)
    loc = torch.tensor([3], dtype=torch.int64)
    pool.write(0, loc, x.view(1, 1, 5), -x.view(1, 1, 5))
    store(want, 0, loc, x.view(1, 1, 5), -x.view(1, 1, 5))
    assert torch.equal(pool.k[0].view(torch.uint8), want.k[0].view(torch.uint8))
    assert torch.equal(pool.v[0].view(torch.uint8), want.v[0].view(torch.uint8))
