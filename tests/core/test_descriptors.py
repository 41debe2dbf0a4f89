import json
from pathlib import Path

import pytest
from hypothesis import given

from attnhal.capabilities import SpecLimits
from attnhal.capabilities.files import DescriptorError, dump_descriptor, load_descriptor, parse_descriptor
from attnhal.phases import Phase
from attnhal.testing.strategies import descriptors
from conditional_strategies import conditional_descriptors

EXAMPLES = sorted(p for p in Path("docs/examples").glob("*.*") if p.suffix in (".json", ".toml"))  # descriptor files
MIN = {"name": "x", "vendors": ["cuda"], "phases": ["decode", "draft_extend"]}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_shipped_examples_load(path):
    caps = load_descriptor(path)
    assert caps.name and caps.phases


def test_toml_graph_tables():
    caps = load_descriptor("docs/examples/aiter-like.json")
    assert caps.graph[Phase.DRAFT_DECODE] == SpecLimits(max_topk=1)
    assert caps.graph[Phase.DECODE] == SpecLimits()
    assert Phase.PREFILL not in caps.graph
    assert caps.multi_step == SpecLimits(max_topk=1)


def test_defaults_for_missing_keys():
    caps = parse_descriptor(MIN)
    assert caps.graph == {} and caps.multi_step is None and caps.page_sizes == {1}
    assert caps.dtypes == {"float16", "bfloat16", "float32"} and caps.seq_len_fill.base == 1


@given(descriptors())
def test_dump_then_parse_round_trips(caps):
    assert parse_descriptor(json.loads(json.dumps(dump_descriptor(caps)))) == caps


@pytest.mark.parametrize("patch, needle", [
    ({"colour": "red"}, "colour='red'"),
    ({"vendors": ["nvidia"]}, "vendors='nvidia' (supported: cuda, hip, cpu, xpu, npu, musa)"),
    ({"phases": "decode"}, "phases='decode'"),
    ({"graph": {"verify": {}}}, "graph='verify'"),
    ({"graph": {"decode": {"max_topk": 0}}}, "graph.decode.max_topk=0"),
    ({"graph": {"decode": {"topk": 1}}}, "graph.decode.topk=1"),
    ({"graph": {"target_verify": {}}}, "graph=['target_verify']"),
    ({"multi_step": "yes"}, "multi_step='yes'"),
    ({"head_sizes": [64, -1]}, "head_sizes=[64, -1]"),
    ({"seq_len_fill": {"plus": "bogus"}}, "seq_len_fill.plus='bogus'"),
    ({"needs_host_seq_lens": "no"}, "needs_host_seq_lens='no'"),
    ({"tolerances": {"float16": {"atol": 1}}}, "tolerances.float16"),
    ({"min_arch": {"hip": "mi300"}}, "min_arch.hip"),
    ({"dtypes": ["float64"]}, "dtypes=['float64']"),
])
def test_bad_keys_and_values_name_the_key(patch, needle):
    with pytest.raises(DescriptorError) as exc:
        parse_descriptor({**MIN, **patch})
    assert needle in str(exc.value)


def test_missing_required_key():
    with pytest.raises(DescriptorError, match="vendors is missing"):
        parse_descriptor({"name": "x", "phases": []})


def test_file_errors(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("name: x")
    with pytest.raises(DescriptorError, match="supported: .json or .toml"):
        load_descriptor(bad)
    broken = tmp_path / "x.toml"
    broken.write_text("name = ")
    with pytest.raises(DescriptorError, match="x.toml"):
        load_descriptor(broken)


# --- schema version 2 -----------------------------------------------------------------------
V2 = {**MIN, "schema_version": 2}


def test_version_one_files_keep_loading_and_v2_keys_need_the_version():
    assert parse_descriptor(MIN) == parse_descriptor({**MIN, "schema_version": 1})
    with pytest.raises(DescriptorError, match=r"variants needs schema_version = 2 .*add `schema_version = 2`"):
        parse_descriptor({**MIN, "variants": []})
    with pytest.raises(DescriptorError, match=r"schema_version=3 \(supported: 1..2; a newer file needs"):
        parse_descriptor({**MIN, "schema_version": 3})


@pytest.mark.parametrize("patch, needle", [
    ({"archs": {"cuda": ["sm80..sm9x"]}}, "archs.cuda: arch='sm9x'"),
    ({"archs": {"cuda": ".."}}, "archs.cuda: arch range"),
    ({"archs": {"hip": []}}, "archs.hip: archs=[]"),
    ({"models": ["moe"]}, "models='moe'"),
    ({"run_limits": {"draft_extend": {"topk": 1}}}, "run_limits.draft_extend.topk=1"),
    ({"run_limits": {"prefill": {}}}, "run_limits=['prefill']"),
    ({"phase_fill": {"prefill": 1}}, "phase_fill=['prefill']"),
    ({"seq_len_fill": {"at_least_plus": "depth"}}, "seq_len_fill.at_least_plus='depth'"),
    ({"variants": {"when": {}}}, "variants={'when': {}}"),
    ({"variants": [{"graph": {}}]}, "variants[0]="),
    ({"variants": [{"when": {}, "page_sizes": [1]}]}, "variants[0]: when={}"),
    ({"variants": [{"when": {"colour": "red"}, "page_sizes": [1]}]}, "when.colour='red'"),
    ({"variants": [{"when": {"model": "moe"}, "page_sizes": [1]}]}, "when.model='moe'"),
    ({"variants": [{"when": {"page_size": {"least": 2}}, "page_sizes": [1]}]}, "when.page_size={'least': 2}"),
    ({"variants": [{"when": {"arch": {"hip": ["mi300"]}}, "page_sizes": [1]}]}, "when.arch.hip: arch='mi300'"),
    ({"variants": [{"when": {"topk": 2}, "name": "other"}]}, "variants[0].name='other'"),
    ({"variants": [{"when": {"topk": 2}}]}, "changes nothing"),
    ({"variants": [{"when": {"topk": 2}, "remove": {"graph": ["decode"]}}]}, "variants[0].remove.graph"),
    ({"variants": [{"when": {"topk": 2}, "graph": {"prefill": {}}}]}, "variants[0]"),
    ({"variants": [{"when": {"topk": 2}, "graph": {"target_verify": {}}}]}, "graph=['target_verify']"),
])
def test_v2_bad_keys_and_values_name_the_key(patch, needle):
    with pytest.raises(DescriptorError) as exc:
        parse_descriptor({**V2, **patch})
    assert needle in str(exc.value)


def test_a_variant_file_round_trips_and_resolves():
    caps = load_descriptor("docs/examples/conditional.toml")
    assert len(caps.variants) == 4 and parse_descriptor(json.loads(json.dumps(dump_descriptor(caps)))) == caps
    from attnhal.capabilities import Facts
    from attnhal.platform import parse
    from attnhal.spec import RequestContext

    mla = caps.resolve(Facts.of(parse("cuda:sm90"), RequestContext(model="mla")))
    assert mla.page_sizes == {64} and Phase.DRAFT_EXTEND not in mla.graph and mla.variants == ()
    assert mla.applied == ("MLA: page size 64 only, no draft-extend graph, multi-step only with topk 1",)


def test_file_errors_are_descriptor_errors_naming_the_file(tmp_path):
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(DescriptorError, match="binary.toml: not UTF-8"):
        load_descriptor(binary)
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    with pytest.raises(DescriptorError, match="dir.toml: cannot read"):
        load_descriptor(folder)
    with pytest.raises(DescriptorError, match="missing.json: cannot read"):
        load_descriptor(tmp_path / "missing.json")
    with pytest.raises(TypeError, match="path=None"):
        load_descriptor(None)


@given(conditional_descriptors())
def test_v2_dump_then_parse_round_trips(caps):
    assert parse_descriptor(json.loads(json.dumps(dump_descriptor(caps)))) == caps
