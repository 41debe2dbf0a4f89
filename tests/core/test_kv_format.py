"""KV formats are rows: code reads a format's fields, and a new format is a row plus its oracle."""

from __future__ import annotations

import re

import pytest
from repo import ROOT

from attnhal import InvalidValue
from attnhal.kv_format import KV_FORMATS, KVFormat, Scales, kv_format, register_kv_format, unregister_kv_format
from attnhal.platform import Fp8Flavor, parse
from attnhal.spec import KV_DTYPES, RequestContext

#: A test-local FP4 row: stored two values a byte, one scale per block of values.
FP4 = KVFormat("fp4_e2m1", "float4_e2m1fn_x2", scales=Scales.PER_BLOCK)


@pytest.fixture
def fp4():
    register_kv_format(FP4)
    try:
        yield FP4
    finally:
        unregister_kv_format(FP4.name)


def test_the_known_formats_and_their_fields() -> None:
    assert tuple(KV_FORMATS) == KV_DTYPES == ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
    e4m3, e5m2, f16 = kv_format("fp8_e4m3"), kv_format("fp8_e5m2"), kv_format("float16")
    assert (e4m3.fp8, e4m3.scaled, e4m3.needs_flavor) == ("e4m3", True, True)
    assert e4m3.storage_name(Fp8Flavor.FNUZ) == "float8_e4m3fnuz" and e4m3.storage_name(Fp8Flavor.OCP) == "float8_e4m3fn"
    assert (e5m2.storage_name(Fp8Flavor.FNUZ), e5m2.scales) == ("float8_e5m2", Scales.PER_LAYER)
    assert (f16.fp8, f16.scaled, f16.storage_names) == (None, False, ("float16",))


def test_an_unknown_format_and_a_missing_flavour_are_invalid_values() -> None:
    with pytest.raises(InvalidValue) as info:
        kv_format("fp4")
    assert (info.value.field, info.value.value) == ("kv_dtype", "fp4") and "fp8_e5m2" in info.value.supported
    with pytest.raises(InvalidValue) as info:
        kv_format("fp8_e4m3").storage_name(parse("cpu").fp8_flavor)
    assert info.value.field == "fp8_flavor"
    with pytest.raises(InvalidValue, match="storage"):
        KVFormat("both", "float16", by_flavor={Fp8Flavor.OCP: "float8_e4m3fn"})
    with pytest.raises(InvalidValue, match="a name not yet in KV_FORMATS"):
        register_kv_format(KVFormat("float16", "float16"))


def test_a_new_format_is_a_row_that_flows_through_validation(fp4) -> None:
    """Registered, the FP4 row is a valid request, descriptor claim and condition; a pool refuses
    it with its reason, since no pool keeps per-block scales yet (its storage and oracle are the
    rest of the work, docs/backends.md)."""
    import torch

    from attnhal.backend import KVPool
    from attnhal.capabilities import BackendCapabilities, Phase, When
    from attnhal.capabilities.files import parse_descriptor

    assert RequestContext(kv_dtype="fp4_e2m1").kv_dtype == "fp4_e2m1"
    caps = BackendCapabilities(name="fp4", vendors=frozenset({"cuda"}), phases=(Phase.DECODE,),
                               kv_dtypes=frozenset({"float16", "fp4_e2m1"}))
    assert "fp4_e2m1" in caps.kv_dtypes
    assert When(kv_dtype=frozenset({"fp4_e2m1"})).kv_dtype == {"fp4_e2m1"}
    table = {"schema_version": 2, "name": "fp4", "vendors": ["cuda"], "phases": ["decode"],
             "dtypes": ["float16"], "kv_dtypes": ["float16", "fp4_e2m1"]}
    assert "fp4_e2m1" in parse_descriptor(table).kv_dtypes
    with pytest.raises(InvalidValue, match=r"kv_dtype='fp4_e2m1' \(supported: a format with scales"):
        KVPool(num_layers=1, num_slots=8, num_kv_heads=1, head_dim=8, dtype=torch.float4_e2m1fn_x2, max_reqs=1,
               max_context_len=8)
    unregister_kv_format(fp4.name)
    with pytest.raises(InvalidValue):
        RequestContext(kv_dtype="fp4_e2m1")


def test_a_new_format_reaches_the_planner_from_the_command_line(fp4, capsys) -> None:
    """``--kv-dtype fp4_e2m1`` is a valid flag once the row exists; the torch backend does not
    claim it, so the plan says so by the claim's reason (exit 1), not a usage error (exit 2)."""
    from attnhal.cli import main

    argv = ["plan", "--platform", "cuda:sm90", "--backend", "torch", "--spec-steps", "2", "--kv-dtype"]
    assert main([*argv, "fp4_e2m1"]) == 1
    assert "kv_dtype=fp4_e2m1 (supported:" in capsys.readouterr().out
    assert main([*argv, "fp4_e9m9"]) == 2 and "--kv-dtype='fp4_e9m9' (supported:" in capsys.readouterr().err


def test_no_code_reads_a_kv_format_from_its_name() -> None:
    """``kv.startswith("fp8")`` and ``kv == "fp8_e4m3"`` were the format's fields read from its
    name in 7 places; the row's fields say it now. The engine packages are left out: they model
    an engine's own flag values (SGLang's FA3 refuses ``--kv-cache-dtype fp8_e5m2`` by that string)."""
    sniff = re.compile(r"""(startswith\(\s*["']fp8|[!=]=\s*["']fp8_e[45]m[23]["'])""")
    hits = [f"{p.relative_to(ROOT)}" for tree in ("attnhal", "backends", "engines") for p in (ROOT / tree).rglob("*.py")
            if not {"tests", "engines"} & set(p.parts) and sniff.search(p.read_text())]
    assert hits == []
