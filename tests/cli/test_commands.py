import json
import subprocess
import sys

import pytest

from attnhal.cli import main

TRITON_LIKE = "docs/examples/triton-like.toml"


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("platform", ["cuda:sm90", "hip:gfx942"])
def test_plan_json_seed_scenario(capsys, platform):
    code, out, _ = run(capsys, "plan", "--backend", TRITON_LIKE, "--spec-steps", "1", "--platform", platform, "--json")
    data = json.loads(out)
    assert code == 0 and data["valid"] and data["platform"] == platform
    assert set(data["phases"]) == {"prefill", "decode", "draft_decode", "draft_extend", "target_verify"}
    extend = data["phases"]["draft_extend"]
    assert {k: extend[k] for k in ("runs", "capture", "backend", "reasons")} == \
        {"runs": True, "capture": True, "backend": "triton-like", "reasons": []}
    assert extend["role"] == "draft_extend" and extend["seq_len_fill"] == 1 and extend["capture_sizes"][0] == 1
    assert data["phases"]["draft_decode"]["runs"] is False
    for d in data["phases"].values():
        assert set(d) == {"runs", "capture", "backend", "reasons", "role", "capture_sizes", "seq_len_fill",
                          "variants", "graph"}
        assert all(set(r) == {"code", "message"} for r in d["reasons"])


def test_plan_table_and_per_role_backends(capsys):
    code, out, _ = run(capsys, "plan", "--target-backend", TRITON_LIKE, "--draft-backend",
                       "docs/examples/decode-only.toml", "--draft-extend-backend", TRITON_LIKE,
                       "--spec-steps", "3", "--platform", "cuda:sm90")
    assert code == 1  # the draft backend has no multi-step support
    assert "plan: INVALID" in out and "[multi_step]" in out


def test_no_graphs_flag(capsys):
    code, out, _ = run(capsys, "plan", "--backend", TRITON_LIKE, "--platform", "cpu", "--no-graphs", "--json")
    decode = json.loads(out)["phases"]["decode"]
    assert code == 0 and decode["runs"] and not decode["capture"]
    assert decode["reasons"][0]["code"] == "graphs_disabled"


def test_plan_tree_takes_draft_tokens_up_to_every_candidate_node(capsys):
    """3 steps, topk 4: 4 + 2 * 16 candidates, so up to 37 tokens verified (not 13)."""
    tree = ("plan", "--backend", TRITON_LIKE, "--platform", "cuda:sm90", "--spec-steps", "3", "--topk", "4")
    code, out, _ = run(capsys, *tree, "--draft-tokens", "16", "--json")
    assert code == 0 and json.loads(out)["valid"]
    code, _, err = run(capsys, *tree, "--draft-tokens", "38")
    assert code == 2 and "--draft-tokens: num_draft_tokens=38 (supported: 2..37" in err


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--platform", "rocm:gfx942"], "--platform"),
    (["plan", "--spec-steps", "-1"], "--spec-steps=-1"),
    (["plan", "--topk", "x"], "--topk='x'"),
    (["plan", "--spec-steps", "2", "--topk", "2"], "--draft-tokens"),
    (["plan", "--spec-steps", "2", "--draft-tokens", "9"], "num_draft_tokens=9"),
    (["plan", "--backend", "no-such-backend"], "backend=no-such-backend"),
    (["plan", "--backend", "missing.toml"], "--backend"),
    (["explain", "--backend", TRITON_LIKE, "--dtype", "float64"], "--dtype='float64'"),
    (["explain", "--backend", TRITON_LIKE, "--phase", "verify"], "--phase='verify'"),
])
def test_bad_input_exits_2_naming_the_flag(capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_explain_lists_reasons(capsys):
    code, out, _ = run(capsys, "explain", "--backend", "docs/examples/aiter-like.json", "--platform", "hip:gfx90a",
                       "--dtype", "float32", "--head-size", "96")
    assert code == 1
    assert "arch=gfx90a (supported: >= gfx942)" in out and "head_size=96 (supported: {64, 128})" in out
    code, out, _ = run(capsys, "explain", "--backend", TRITON_LIKE, "--platform", "hip:gfx942", "--json")
    assert code == 0 and json.loads(out)["fits"]


def test_info_runs(capsys):
    code, out, _ = run(capsys, "info", "--platform", "hip:gfx942")
    assert code == 0 and "platform: hip:gfx942" in out and "warp_size=64" in out and "fp8=e4m3fnuz" in out
    code, out, _ = run(capsys, "info", "--json")
    assert code == 0 and "backends" in json.loads(out)


def test_info_names_the_graph_implementation_and_why_it_cannot_capture(capsys):
    code, out, _ = run(capsys, "info", "--platform", "npu:910b")
    assert code == 0 and "graph_device=-: cannot capture here (the npu vendor row names none); every phase plans " \
        "eager" in out
    code, out, _ = run(capsys, "info", "--platform", "hip:gfx942", "--json")
    data = json.loads(out)
    assert data["graph_device"] == "attnhal.graphs.device_api:TorchCudaAPI" and data["graph_device_error"] is None


def test_python_dash_m_entry():
    out = subprocess.run([sys.executable, "-m", "attnhal", "plan", "--backend", TRITON_LIKE, "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["valid"]


def test_info_lists_the_torch_backend_available_on_cpu(capsys):
    code, out, _ = run(capsys, "info", "--platform", "cpu", "--json")
    backends = json.loads(out)["backends"]
    assert code == 0 and backends["torch"]["available"] is True and backends["torch"]["reasons"] == []
    assert "draft_decode" in backends["torch"]["capabilities"]["graph"]
    _, text, _ = run(capsys, "info", "--platform", "cpu")
    torch_row = next(line for line in text.splitlines() if line.startswith("torch "))
    assert "available" in torch_row and "unavailable" not in torch_row
    assert "capabilities:" in text and "draft_decode" in text


def test_plan_with_the_registered_torch_backend(capsys):
    code, out, _ = run(capsys, "plan", "--backend", "torch", "--platform", "hip:gfx942", "--spec-steps", "1", "--json")
    data = json.loads(out)
    assert code == 0 and data["valid"]
    assert data["phases"]["draft_extend"]["capture"] and data["phases"]["draft_extend"]["backend"] == "torch"


def test_demo_json_is_lossless(capsys):
    code, out, _ = run(capsys, "demo", "--platform", "hip:gfx942", "--backend", "torch", "--spec-steps", "1",
                       "--batch-size", "2", "--max-new-tokens", "6", "--json")
    data = json.loads(out)
    assert code == 0 and data["lossless"] and data["platform"] == "hip:gfx942"
    assert data["plan"]["phases"]["draft_extend"]["capture"]
    assert data["capture"]["draft_extend"]["replays"] > 0
    assert set(data["runs"]) == {"eager", "graphs"}


def test_plan_context_roles_and_policy_flags(capsys):
    code, out, _ = run(capsys, "plan", "--backend", "docs/examples/conditional.toml", "--platform", "cuda:sm90",
                       "--spec-steps", "3", "--model", "mla", "--page-size", "64", "--json")
    data = json.loads(out)
    assert code == 0 and data["context"] == {"model": "mla", "page_size": 64}
    assert data["phases"]["draft_extend"]["reasons"][0]["code"] == "graph_unsupported"
    assert data["phases"]["draft_extend"]["variants"] == [
        "MLA: page size 64 only, no draft-extend graph, multi-step only with topk 1"]
    code, out, _ = run(capsys, "plan", "--backend", TRITON_LIKE, "--decode-backend", "docs/examples/decode-only.toml",
                       "--speculative-attention-mode", "decode", "--spec-steps", "1", "--platform", "hip:gfx942",
                       "--no-graph-phase", "draft_extend", "--adaptive-steps", "1,2", "--json")
    data = json.loads(out)
    assert data["phases"]["target_verify"]["backend"] == "decode-only"
    assert data["phases"]["target_verify"]["role"] == "decode"
    assert data["phases"]["draft_extend"]["reasons"][0]["code"] == "graphs_disabled"
    assert code == 1 and data["adaptive"]["2"]["valid"] is False  # decode-only has no multi-step draft
    code, out, _ = run(capsys, "plan", "--backend", TRITON_LIKE, "--spec-steps", "2", "--spec-algorithm", "ngram",
                       "--platform", "cuda:sm90")
    assert code == 0 and "draft_extend   no" in out


@pytest.mark.parametrize("argv, needle", [
    (["--platform", "cuda:"], "--platform"),
    (["--max-bs", "5000"], "--max-bs=5000 (supported: an integer 1..4096)"),
    (["--adaptive-steps", "1,x"], "--adaptive-steps='1,x'"),
    (["--model", "moe"], "--model='moe'"),
    (["--spec-algorithm", "medusa"], "--spec-algorithm='medusa'"),
])
def test_plan_bad_new_flags_exit_2(capsys, argv, needle):
    code = None
    try:
        code, _, err = run(capsys, "plan", "--backend", TRITON_LIKE, *argv)
    except SystemExit as exc:
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and needle in err


def test_demo_with_pages_and_fp8_in_the_platform_flavour(capsys):
    code, out, _ = run(capsys, "demo", "--platform", "hip:gfx942", "--backend", "torch", "--spec-steps", "1",
                       "--batch-size", "2", "--max-new-tokens", "6", "--page-size", "16", "--kv-dtype", "fp8_e4m3",
                       "--json")
    data = json.loads(out)
    assert code == 0 and data["lossless"]
    assert data["kv_cache"] == {"page_size": 16, "kv_dtype": "fp8_e4m3", "storage": "torch.float8_e4m3fnuz"}


def test_demo_on_an_mla_model(capsys):
    """``--model mla``: DeepSeek's absorbed layout, planned for that model (its context in the
    plan), served by a backend that claims MLA (torch on a CPU), lossless; the text names it."""
    code, out, _ = run(capsys, "demo", "--model", "mla", "--platform", "cpu", "--spec-steps", "3", "--batch-size", "2",
                       "--max-new-tokens", "6", "--json")
    data = json.loads(out)
    assert code == 0 and data["lossless"] and set(data["backends"].values()) == {"torch"}
    assert data["model"] == {"kind": "mla", "q_heads": 16, "kv_heads": 1, "head_size": 576, "v_head_size": 512}
    assert data["plan"]["context"]["model"] == "mla" and data["plan"]["context"]["head_size"] == 576
    code, out, _ = run(capsys, "demo", "--model", "mha", "--platform", "cpu", "--spec-steps", "1", "--batch-size", "2",
                       "--max-new-tokens", "4")
    assert code == 0 and "model: mha, 4 query heads over 4 KV head(s) of 64\n" in out


@pytest.mark.parametrize("argv,needle", [
    (["--model", "mla", "--backend", "cpu"],
     "backend 'cpu' cannot be used: - [model] model=mla (supported: {gqa, mha})"),
    (["--cases", "2", "--model=mla"], "--model with --cases (supported: --cases draws"),
    (["--model", "moe"], "--model='moe' (supported: mha, gqa, mla)"),
])
def test_demo_model_errors_exit_2(capsys, argv, needle):
    try:
        code, _, err = run(capsys, "demo", "--platform", "cpu", *argv)
    except SystemExit as exc:
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and needle in err, err


def test_demo_fp8_e4m3_without_a_platform_flavour_is_a_usage_error(capsys):
    code, _, err = run(capsys, "demo", "--platform", "cpu", "--kv-dtype", "fp8_e4m3")
    assert code == 2 and "--kv-dtype=fp8_e4m3 on platform cpu, which has no fp8 (supported: " in err
    assert "--platform cuda:sm90" in err and "--kv-dtype fp8_e5m2" in err and "explicitly" not in err


def test_demo_runs_on_the_default_backend_and_on_cpu(capsys):
    """The demo model fits every shipped backend, so ``demo`` runs what ``info`` calls the default."""
    from attnhal.example_engine.model import ModelConfig
    from attnhal.platform import parse
    from attnhal.registry import default_registry

    registry = default_registry()
    for name in ("torch", "triton", "cpu"):
        assert ModelConfig().head_dim in registry.get(name).capabilities.head_sizes, name
    default = registry.select(parse("cpu")).name
    small = ("--platform", "cpu", "--spec-steps", "1", "--batch-size", "2", "--max-new-tokens", "4", "--json")
    code, out, _ = run(capsys, "demo", *small)
    data = json.loads(out)
    assert code == 0 and data["lossless"] and set(data["backends"].values()) == {default}
    if default == "cpu":  # the native kernel builds here
        code, out, _ = run(capsys, "demo", "--backend", "cpu", *small)
        assert code == 0 and json.loads(out)["backends"]["target"] == "cpu"


def test_the_graphs_line_shows_no_capture_sizes_without_a_graph_api(capsys):
    code, out, _ = run(capsys, "plan", "--backend", "torch", "--platform", "cpu,nographs", "--spec-steps", "1")
    assert code == 0 and out.splitlines()[1] == "graphs: none (platform cpu,nographs has no graph API)"
    code, out, _ = run(capsys, "plan", "--backend", "torch", "--platform", "cpu", "--spec-steps", "1")
    assert code == 0 and out.splitlines()[1].startswith("graphs: capture sizes 1,2,4,")


def test_plan_takes_an_engines_step_layout_from_the_command_line(capsys):
    """``--one-graph`` (phases captured as one graph, one answer) and ``--draft-as extend`` (no draft_decode)."""
    fused = "draft_extend,draft_decode,target_verify"
    code, out, _ = run(capsys, "plan", "--backend", TRITON_LIKE, "--spec-steps", "3", "--platform", "hip:gfx942",
                       "--one-graph", fused)
    assert code == 0 and f"one graph '{fused.replace(',', '+')}': draft_decode, draft_extend, target_verify " \
                          "-> captured together" in out
    code, out, _ = run(capsys, "plan", "--backend", TRITON_LIKE, "--spec-steps", "3", "--platform", "hip:gfx942",
                       "--draft-as", "extend", "--json")
    data = json.loads(out)
    assert data["layout"] == {"draft_steps": "extend", "graph_groups": {}}
    assert not data["phases"]["draft_decode"]["runs"] and data["phases"]["draft_extend"]["capture"]
    code, _, err = run(capsys, "explain", "--backend", TRITON_LIKE, "--spec-steps", "3", "--one-graph", "prefill,decode")
    assert code == 2 and "--one-graph: graph_groups.prefill+decode=" in err
