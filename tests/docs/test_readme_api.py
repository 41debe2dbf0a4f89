"""The README's Python example for engine developers runs, and shows the plan's request context."""

import re

from repo import ROOT

import attnhal


def test_the_readme_api_example_runs_and_passes_a_context():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## For engine developers\n\n```python\n(.*?)```", text, re.S).group(1)
    assert "context=context" in block and "attnhal.RequestContext(" in block
    runnable = (block.replace('attnhal.load_descriptor("my_backend.toml")',
                              f'attnhal.load_descriptor("{ROOT / "docs" / "examples" / "triton-like.toml"}")')
                .replace("attnhal.detect()", 'attnhal.parse("hip:gfx942")'))
    names: dict[str, object] = {}
    exec(compile(runnable, "README.md", "exec"), names)
    plan = names["plan"]
    assert isinstance(plan, attnhal.GraphPlan) and plan.context.model is attnhal.ModelKind.MLA
    assert plan.context.page_size == 64 and plan.context.kv_dtype == "fp8_e4m3"
