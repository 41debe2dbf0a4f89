"""Fault injection: each fault is reported with a reason, the rest keeps working, no token is lost.

* a backend whose graph capture fails for one phase at one batch size;
* a backend plugin that raises on import, and one whose descriptor is invalid;
* a KV pool exhausted in the middle of a generation.
"""

import re
import sys
import textwrap
from dataclasses import replace
from importlib.metadata import EntryPoint

import pytest

import attnhal.cli as cli
from attnhal.graphs.runner import GraphCaptureWarning
from attnhal.phases import Phase
from attnhal.planner import GraphPolicy
from attnhal.platform import parse
from attnhal.example_engine.model import ModelConfig, TinyLlama, draft_of
from attnhal.example_engine.worker import SpecWorker
from attnhal.registry import GROUP, Registry
from attnhal.spec import SpecConfig
from attnhal_torch import TorchBackend

TARGET = TinyLlama(ModelConfig(num_layers=2, hidden_size=64, ffn_size=128, vocab_size=128, head_dim=16))
DRAFT = draft_of(TARGET)
PROMPTS = [[5, 9, 2, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9], [100], [3, 3, 3, 3, 3, 3]]
SIZES = (1, 2, 4)


class CaptureFailsAtTwo(TorchBackend):
    """The torch backend, except that capturing draft extend at batch size 2 fails."""

    capabilities = replace(TorchBackend.capabilities, name="capture-fails")

    def init_capture_metadata(self, batch):
        if batch.phase is Phase.DRAFT_EXTEND and batch.batch_size == 2:
            raise RuntimeError("injected: capture of draft_extend at batch size 2")
        super().init_capture_metadata(batch)


def registry_with(*backends):
    registry = Registry(discover=lambda: [EntryPoint("torch", "attnhal_torch:TorchBackend", GROUP)])
    for backend in backends:
        registry.register(backend)
    return registry


def worker(spec, backend="torch", registry=None, graphs=True, context=64, sizes=SIZES):
    return SpecWorker(TARGET, DRAFT if spec.speculative else None, spec, platform="hip:gfx942",
                      backend=backend, registry=registry, policy=GraphPolicy(enabled=graphs, batch_sizes=sizes),
                      max_context_len=context, max_requests=8)


def greedy(prompts, n):
    return worker(SpecConfig(), graphs=False).generate(prompts, n).tokens


def test_capture_failing_for_one_phase_at_one_size():
    spec = SpecConfig.eagle(2, 2, 4)
    with pytest.warns(GraphCaptureWarning, match="phase=draft_extend failed"):
        w = worker(spec, "capture-fails", registry_with(CaptureFailsAtTwo), sizes=(1, 2))
    summary = w.runner.summary()
    assert "injected: capture of draft_extend at batch size 2" in summary[Phase.DRAFT_EXTEND].failure
    assert not w.plan[Phase.DRAFT_EXTEND].capture and w.plan[Phase.DRAFT_EXTEND].reasons
    for phase in (Phase.DRAFT_DECODE, Phase.TARGET_VERIFY):  # the other phases keep their graphs
        assert summary[phase].captured_sizes == (1, 2) and summary[phase].failure is None
    out = w.generate(PROMPTS, 9)
    assert out.tokens == greedy(PROMPTS, 9) and not out.stopped
    after = w.runner.summary()
    assert after[Phase.DRAFT_EXTEND].eager_runs > 0 and after[Phase.TARGET_VERIFY].replays > 0


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "exploding_backend.py").write_text("raise RuntimeError('injected: import failed')\n")
    (tmp_path / "bad_descriptor_backend.py").write_text(textwrap.dedent("""
        from attnhal_torch import TorchBackend

        class NotADescriptor(TorchBackend):
            capabilities = {"name": "dict-instead-of-descriptor"}
        """))
    (tmp_path / "invalid_values_backend.py").write_text(textwrap.dedent("""
        from dataclasses import replace
        from attnhal_torch import TorchBackend

        class InvalidValues(TorchBackend):
            capabilities = replace(TorchBackend.capabilities, name="invalid-values", head_sizes=frozenset({-8}))
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("exploding_backend", "bad_descriptor_backend", "invalid_values_backend"):
        sys.modules.pop(name, None)


def plugin_registry():
    eps = [EntryPoint(name, value, GROUP) for name, value in (
        ("exploding", "exploding_backend:Backend"),
        ("dict-instead-of-descriptor", "bad_descriptor_backend:NotADescriptor"),
        ("invalid-values", "invalid_values_backend:InvalidValues"),
        ("torch", "attnhal_torch:TorchBackend"))]
    return Registry(discover=lambda: eps)


def test_broken_backend_plugins_are_reported_and_the_rest_keeps_working(plugin_dir, monkeypatch, capsys):
    registry = plugin_registry()
    entries = {e.name: e for e in registry.entries()}
    assert "injected: import failed" in entries["exploding"].load_error
    assert "has no class attribute capabilities: BackendCapabilities" in entries["dict-instead-of-descriptor"].load_error
    assert "head_size" in entries["invalid-values"].load_error
    assert registry.select(parse("cpu")).name == "torch"

    monkeypatch.setattr(cli, "default_registry", lambda: registry)
    assert cli.main(["info", "--platform", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.split("\nbackends:\n")[1].split("\ncapabilities:\n")[0].splitlines()[2:]
            if line.strip()}
    assert "exploding" in rows, out
    assert "unavailable" in rows["exploding"] and "injected: import failed" in rows["exploding"]
    assert "unavailable" in rows["dict-instead-of-descriptor"]
    assert rows["torch"].split()[1] == "available"
    assert cli.main(["plan", "--backend", "exploding", "--platform", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnhal plan: error: --backend=exploding: load=") and "\n" not in err
    assert cli.main(["plan", "--platform", "cpu", "--json"]) == 0  # the default choice still works


def test_kv_pool_exhausted_mid_generation_keeps_every_committed_token():
    spec = SpecConfig.eagle(2)
    w = worker(spec, graphs=False)  # admission is host-side bookkeeping: graphs change nothing here
    pool = w.target_pool
    free_before = pool.free_slot_count
    # A neighbour holds most of the pool: the prompts fit, the generation does not.
    held = pool.alloc_slots(free_before - sum(map(len, PROMPTS)) - 12)
    out = w.generate(PROMPTS, 20)
    reference = greedy(PROMPTS, 20)
    assert out.stopped, "the pool was meant to run out"
    for i, (tokens, full) in enumerate(zip(out.tokens, reference)):
        assert tokens == full[: len(tokens)], i  # nothing lost, nothing duplicated
        if i in out.stopped:
            # pages a request took for drafts it rejected stay its own, so a step needs few new ones
            assert len(tokens) < 20 and re.match(r"kv_pool=target: a step needs \d+ pages, 0 free", out.stopped[i])
        else:
            assert len(tokens) == 20
    assert pool.free_slot_count == free_before - len(held)  # the stopped requests' slots came back
    pool.free_slots(held)
    again = w.generate(PROMPTS, 20)  # the worker keeps working once the pool has room
    assert again.tokens == reference and not again.stopped


def test_context_longer_than_the_pool_rows_stops_with_a_reason():
    w = worker(SpecConfig.eagle(2), graphs=False, context=24)
    out = w.generate(PROMPTS, 30)
    reference = greedy(PROMPTS, 30)
    assert out.stopped and all("context=" in why for why in out.stopped.values())
    assert all(t == full[: len(t)] and t for t, full in zip(out.tokens, reference))
