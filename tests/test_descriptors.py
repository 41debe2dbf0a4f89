import json
from pathlib import Path

import pytest
from hypothesis import given

from attnhal.capabilities import Phase, SpecLimits
from attnhal.descriptors import DescriptorError, dump_descriptor, load_descriptor, parse_descriptor
from attnhal.testing.strategies import descriptors

EXAMPLES = sorted(Path("docs/examples").glob("*.*"))
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
