"""KVPool: page table slots, fp8 storage with per-layer scales, the flavour refusal."""

import pytest
import torch

from attnhal.backend import KVPool, kv_dtype_name, kv_storage_dtype
from attnhal.platform import Fp8Flavor, parse


def _pool(dtype: torch.dtype, page_size: int = 1, **kw: object) -> KVPool:
    return KVPool(num_layers=2, num_slots=64, num_kv_heads=2, head_dim=8, dtype=dtype, max_reqs=2,
                  max_context_len=32, page_size=page_size, **kw)


@pytest.mark.parametrize("name, flavor, dtype", [
    ("fp8_e4m3", Fp8Flavor.OCP, torch.float8_e4m3fn),
    ("fp8_e4m3", Fp8Flavor.FNUZ, torch.float8_e4m3fnuz),
    ("fp8_e5m2", Fp8Flavor.NONE, torch.float8_e5m2),
    ("bfloat16", Fp8Flavor.FNUZ, torch.bfloat16),
])
def test_kv_dtype_names_resolve_per_flavour(name, flavor, dtype):
    assert kv_storage_dtype(name, flavor) == dtype
    assert kv_dtype_name(dtype) == name


def test_e4m3_without_a_flavour_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match=r"fp8_flavor='none' \(supported: e4m3fn, e4m3fnuz for kv_dtype=fp8_e4m3; "):
        kv_storage_dtype("fp8_e4m3", parse("cpu").fp8_flavor)
    with pytest.raises(ValueError, match="kv_dtype='fp8' "):
        kv_storage_dtype("fp8", Fp8Flavor.OCP)


def test_the_pool_keeps_the_format_row_it_is_given():
    """A row in, the same row kept: no name -> torch dtype -> name walk (the dtype form reads
    the row once from storage, for callers holding a torch dtype)."""
    from attnhal.kv_format import kv_format

    row = kv_format("fp8_e4m3")
    pool = KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=8, max_reqs=1, max_context_len=8,
                  kv_format=row, fp8_flavor=Fp8Flavor.FNUZ)
    assert pool.kv_format is row and pool.dtype == torch.float8_e4m3fnuz and pool.fp8_flavor is Fp8Flavor.FNUZ
    named = KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=8, max_reqs=1, max_context_len=8,
                   kv_format="bfloat16", fp8_flavor=Fp8Flavor.OCP)
    assert named.kv_format is kv_format("bfloat16") and named.fp8_flavor is Fp8Flavor.NONE
    assert (named.dtype, named.kv_dtype) == (_pool(torch.bfloat16).dtype, _pool(torch.bfloat16).kv_dtype)
    with pytest.raises(ValueError, match=r"fp8_flavor='none' \(supported: e4m3fn, e4m3fnuz"):
        KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=8, max_reqs=1, max_context_len=8,
               kv_format="fp8_e4m3")
    with pytest.raises(TypeError, match="exactly one of them"):
        _pool(torch.float16, kv_format="float16")
    with pytest.raises(TypeError, match="exactly one of them"):
        KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=8, max_reqs=1, max_context_len=8)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2])
def test_fp8_write_quantizes_with_the_layer_scale_and_clamps(dtype):
    pool = _pool(dtype)
    pool.k_scale[1], pool.v_scale[1] = 0.25, 2.0
    top = torch.finfo(dtype).max
    x = torch.randn(3, 2, 8)
    x[0, 0, 0] = 10 * top  # beyond the format at either scale: clamped, never inf/nan
    loc = torch.tensor([5, 6, 7])
    pool.write(1, loc, x, x)
    k, v = pool.dequantized(1)
    assert float(k[5, 0, 0]) == pytest.approx(top * 0.25) and float(v[5, 0, 0]) == pytest.approx(top * 2.0)
    rel = 2.0 ** -(4 if dtype != torch.float8_e5m2 else 3)  # half an ulp of the mantissa
    tiny = torch.finfo(dtype).smallest_normal  # subnormals: absolute spacing
    for got, scale in ((k, 0.25), (v, 2.0)):
        want = (x / scale).clamp(-top, top) * scale
        assert torch.all((got[loc] - want).abs() <= rel * want.abs() + tiny * scale)
    assert pool.dequantized(0)[0].abs().sum() == 0  # another layer untouched


def test_scales_are_recorded_and_default_to_one():
    pool = _pool(torch.float8_e4m3fnuz)
    assert (pool.kv_dtype, pool.fp8_flavor) == ("fp8_e4m3", Fp8Flavor.FNUZ)
    assert pool.k_scale.dtype == torch.float32 and pool.k_scale.tolist() == [1.0, 1.0]
    plain = _pool(torch.float16)
    assert (plain.kv_dtype, plain.fp8_flavor, plain.kv_format.scaled) == ("float16", Fp8Flavor.NONE, False)


def test_pool_of_one_flavour_refuses_the_other_platform():
    fnuz, ocp = _pool(torch.float8_e4m3fnuz), _pool(torch.float8_e4m3fn)
    (why,) = fnuz.platform_reasons(parse("cuda:sm90"))
    assert why.code.value == "kv_dtype" and "e4m3fnuz" in why.message and "cuda:sm90" in why.message
    assert ocp.platform_reasons(parse("hip:gfx942")) and not ocp.platform_reasons(parse("hip:gfx950"))
    assert not fnuz.platform_reasons(parse("hip:gfx942"))
    # the CPU computes in no flavour: the torch backend reads either in software
    assert not fnuz.platform_reasons(parse("cpu")) and not ocp.platform_reasons(parse("cpu"))
    assert not _pool(torch.float8_e5m2).platform_reasons(parse("cuda:sm90"))


@pytest.mark.parametrize("page_size", [1, 16, 32])
def test_token_table_follows_the_page_table(page_size):
    pool = _pool(torch.float32, page_size)
    pages = pool.alloc_pages(32 // page_size)
    pool.req_to_page[1, :len(pages)] = pages.flip(0).to(torch.int32)
    table = pool.token_table()
    for pos in (0, page_size - 1, 31):
        page = int(pool.req_to_page[1, pos // page_size])
        assert int(table[1, pos]) == page * page_size + pos % page_size
    assert table[0].max() < page_size  # the padding row reads the padding page


def test_mla_pool_has_its_own_v_head_size():
    pool = KVPool(num_layers=1, num_slots=4, num_kv_heads=1, head_dim=576, v_head_dim=512, dtype=torch.float16,
                  max_reqs=1, max_context_len=4)
    assert pool.k[0].shape[-1] == 576 and pool.v[0].shape[-1] == 512 and pool.v_head_dim == 512
    with pytest.raises(ValueError, match="v_head_dim=0"):
        KVPool(num_layers=1, num_slots=4, num_kv_heads=1, head_dim=8, v_head_dim=0, dtype=torch.float16,
               max_reqs=1, max_context_len=4)


@pytest.mark.parametrize("v_in_k", [False, True], ids=["separate-v", "v-in-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e5m2])
def test_copy_slots_moves_chained_slots_from_their_old_values(v_in_k, dtype):
    """A tree's accepted path moves nodes down, so a destination is often another move's source:
    every cache must read the old rows. An MLA pool's V is K's first columns (``v_in_k``): moved with
    K, once — a second pass over V read rows the K pass had already overwritten (found by the
    reliability run's MLA cases: not lossless)."""
    kw = dict(v_head_dim=6, v_in_k=True) if v_in_k else {}
    pool = KVPool(num_layers=2, num_slots=16, num_kv_heads=1, head_dim=8, dtype=dtype, max_reqs=1,
                  max_context_len=16, **kw)
    for layer in range(2):
        slots = pool.k[layer].shape[0]  # the pool's slots and its padding slot
        rows = torch.arange(slots * 8, dtype=torch.float32).view(slots, 1, 8) / 8 + 100 * layer
        pool.k[layer].copy_(rows.to(dtype))
        if not v_in_k:
            pool.v[layer].copy_((-rows).to(dtype))
    before = [(k.float().clone(), v.float().clone()) for k, v in zip(pool.k, pool.v)]
    src, dst = torch.tensor([5, 7, 9]), torch.tensor([3, 5, 7])  # 5 and 7 are read and written
    pool.copy_slots(src, dst)
    for (k, v), (k0, v0) in zip(zip(pool.k, pool.v), before):
        assert torch.equal(k.float()[dst], k0[src]) and torch.equal(v.float()[dst], v0[src])
        assert torch.equal(k.float()[9], k0[9])  # a source that is not a destination keeps its row
        if v_in_k:
            assert torch.equal(v.float(), k.float()[..., :6])


def test_an_mla_pool_has_one_latent_scale():
    """V inside K's rows is K's bytes: setting V's scale sets K's, so the latent written as K and
    as V is quantized once and read by the QK dot and by P.V with the scale it was stored with."""
    pool = KVPool(num_layers=2, num_slots=8, num_kv_heads=1, head_dim=8, v_head_dim=6, v_in_k=True,
                  dtype=torch.float8_e5m2, max_reqs=1, max_context_len=8)
    pool.v_scale[1] = 4.0
    copy = pool.layer_copy(1)
    assert pool.k_scale.tolist() == [1.0, 4.0] and copy.v_scale is copy.k_scale
    latent, rope = torch.full((2, 1, 6), 8.0), torch.full((2, 1, 2), 2.0)
    pool.write(1, torch.tensor([3, 4]), torch.cat((latent, rope), dim=-1), latent)
    k, v = pool.dequantized(1)
    assert torch.equal(k[3:5], torch.cat((latent, rope), dim=-1)) and torch.equal(v[3:5], latent)
    separate = _pool(torch.float8_e5m2)
    separate.v_scale[0] = 4.0
    assert separate.k_scale.tolist() == [1.0, 1.0]
