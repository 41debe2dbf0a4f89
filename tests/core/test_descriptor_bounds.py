"""Every numeric descriptor key is bounded, ranges are ordered, lists that would claim nothing
are refused and names are printable: a file is refused at load, naming the key."""

from __future__ import annotations

import json

import pytest

from attnhal.capabilities.files import DescriptorError, load_descriptor

BASE = {"schema_version": 2, "name": "x", "vendors": ["cuda"], "phases": ["decode"], "graph": {"decode": {}}}
HUGE = 10 ** 30


@pytest.mark.parametrize("patch, key", [
    ({"tolerances": {"float16": {"atol": float("nan"), "rtol": 1e-3}}}, "tolerances.float16.atol="),
    ({"tolerances": {"float16": {"atol": -1, "rtol": 1e-3}}}, "tolerances.float16.atol=-1"),
    ({"tolerances": {"float16": {"atol": 1e-3, "rtol": "1e400"}}}, "tolerances.float16.rtol="),
    ({"tolerances": {"float16": {"atol": 2, "rtol": 1e-3}}}, "tolerances.float16.atol=2"),
    ({"seq_len_fill": -1}, "seq_len_fill=-1"),
    ({"seq_len_fill": HUGE}, f"seq_len_fill={HUGE}"),
    ({"seq_len_fill": {"at_least": HUGE}}, "seq_len_fill.at_least="),
    ({"phase_fill": {"decode": -1}}, "phase_fill.decode=-1"),
    ({"graph": {"decode": {"max_topk": HUGE}}}, "graph.decode.max_topk="),
    ({"run_limits": {"decode": {"max_num_steps": 0}}}, "run_limits.decode.max_num_steps=0"),
    ({"archs": {"cuda": ["sm90..sm80"]}}, "'sm80..sm90'"),
    ({"vendors": []}, "vendors=[]"),
    ({"phases": []}, "phases=[]"),
    ({"models": []}, "models=[]"),
    ({"dtypes": []}, "dtypes=[]"),
    ({"head_sizes": []}, "head_sizes=[]"),
    ({"page_sizes": []}, "page_sizes=[]"),
    ({"name": "evil\nname"}, "name="),
    ({"name": "\x1b[31mred"}, "name="),
    ({"name": "n" * 65}, "name="),
    ({"variants": [{"when": {"page_size": {"min": 64, "max": 8}}, "page_sizes": [16]}]}, "min <= max"),
    ({"variants": [{"when": {"head_size": HUGE}, "page_sizes": [16]}]}, "when.head_size="),
    ({"variants": [{"when": {"dtype": "float16"}, "note": "a\x1bb", "page_sizes": [16]}]}, "note="),
])
def test_a_value_out_of_bounds_is_refused_at_load_naming_the_key(tmp_path, patch, key) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({**BASE, **patch}).replace('"1e400"', "1e400").replace("NaN", "NaN"))
    with pytest.raises(DescriptorError) as err:
        load_descriptor(path)
    assert key in str(err.value)
    assert "supported" in str(err.value)
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value)


def test_a_variant_may_still_empty_a_list() -> None:
    from attnhal.capabilities.files import parse_descriptor

    caps = parse_descriptor({**BASE, "variants": [{"when": {"dtype": "float16"}, "phases": []}]})
    assert caps.variants[0].changes["phases"] == frozenset()


def test_a_descriptor_built_in_python_refuses_a_name_with_control_characters() -> None:
    from attnhal.capabilities import BackendCapabilities

    with pytest.raises(ValueError, match=r"name='evil\\n' \(supported: a non-empty string of printable"):
        BackendCapabilities(name="evil\n", vendors={"cpu"}, phases={"decode"})
