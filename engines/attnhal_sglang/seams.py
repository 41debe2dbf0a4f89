"""SGLang 0.5.23's own capability seams, as data: what each backend class declares, and the
decisions SGLang takes from those declarations.

SGLang asks its backend objects, not a vendor table, a few questions about graphs
(``layers/attention/base_attn_backend.py:65, 107-115, 153-158``): may a ragged target verify
batch replay a graph (``supports_ragged_verify_graph``), may draft-extend metadata be staged
before a replay (``supports_draft_extend_metadata_staging``) or is it rebuilt inside the graph
(``draft_extend_metadata_captured_in_graph()``), and why the metadata prep may not join the
metadata glue graph (``glue_target_verify_metadata()`` / ``glue_draft_metadata()``: ``""``
means it may). The answers are catalogue data, per backend class, in the SGLang entries'
``[catalog.meta.seams.CLASS]`` tables (``docs/catalog.md``); this module reads them and
restates the two decisions built on them and on the platform:

- :func:`multi_layer_runner`: the draft-extend runner ``multi_layer_eagle_worker_v2`` builds
  (``MultiLayerEagleDraftWorker._capture_cuda_graphs``, lines 417-457);
- :func:`draft_runner`: the runner class ``eagle_worker_v2`` builds per phase and device
  (``Device2DraftCudaGraphRunner`` / ``Device2ExtendCudaGraphRunner``, lines 489-544), and for
  an out-of-tree platform its ``get_speculative_graph_runner_cls(algorithm, phase)`` seam, asked
  only when its ``PlatformCapabilities.graph_capture`` is true (lines 151-161).

The SGLang tier checks every value and both decisions against SGLang's executed code
(``tests/engines/sglang/test_sglang_seams.py``). Nothing of SGLang is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from attnhal_sglang.env import DRAFT_EXTEND_GRAPH_OFF, SINGLE_GRAPH_DRAFT, env_bool
from attnhal.errors import InvalidValue
from attnhal.platform import Platform, Vendor

__all__ = ["DRAFT_RUNNERS", "DRAFT_EXTEND_GRAPH_OFF", "SINGLE_GRAPH_DRAFT", "OutOfTree", "Seams", "device_of",
           "draft_runner", "multi_layer_runner", "plan_lines", "plan_seams", "seams_of"]


_KEYS = ("models", "supports_ragged_verify_graph", "supports_draft_extend_metadata_staging",
         "draft_extend_metadata_captured_in_graph", "glue_target_verify_metadata", "glue_draft_metadata")

#: The runner class ``EagleDraftWorker._capture_cuda_graphs`` builds per phase and torch device
#: (eagle_worker_v2.py:489-494, 539-544; ROCm's device is "cuda"). MUSA's draft extend gets the
#: draft-*decode* runner class: docs/catalog.md D9, executed on an emulated MUSA platform.
DRAFT_RUNNERS: Mapping[str, Mapping[str, str]] = MappingProxyType({
    "draft_decode": MappingProxyType({"xpu": "EAGLEDraftCudaGraphRunner", "npu": "EAGLEDraftNpuGraphRunner",
                                      "cuda": "EAGLEDraftCudaGraphRunner", "musa": "EAGLEDraftCudaGraphRunner"}),
    "draft_extend": MappingProxyType({"xpu": "EAGLEDraftExtendCudaGraphRunner",
                                      "npu": "EAGLEDraftExtendNpuGraphRunner",
                                      "cuda": "EAGLEDraftExtendCudaGraphRunner", "musa": "EAGLEDraftCudaGraphRunner"}),
})

#: Devices whose multi-layer EAGLE draft extend has its own runner, whatever the seams (line 451-455).
_MULTI_LAYER_OWN = {"npu": "MultiLayerEagleMultiStepDraftExtendNpuGraphRunner"}

#: attnhal vendor -> the torch device SGLang's workers carry (``target_worker.device``).
_DEVICES = {Vendor.CUDA: "cuda", Vendor.HIP: "cuda", Vendor.MUSA: "musa", Vendor.XPU: "xpu", Vendor.NPU: "npu"}


@dataclass(frozen=True)
class Seams:
    """One SGLang backend class's answers (``[catalog.meta.seams.CLASS]`` of its entry).

    ``staging_max_topk``: draft-extend metadata staging holds only up to this topk (``None``:
    any topk it holds at all); the glue fields are SGLang's reason text, ``""`` where the prep
    may be captured into the metadata glue graph.
    """

    backend: str  # "sglang:fa3"
    cls: str  # "FlashAttentionBackend"
    models: frozenset[str] | None  # the model kinds this class serves in the entry (None: every kind)
    ragged_verify_graph: bool
    staging: bool
    staging_max_topk: int | None
    metadata_in_graph: bool
    glue_target_verify: str
    glue_draft: str

    def stages_draft_extend(self, topk: int) -> bool:
        """``supports_draft_extend_metadata_staging`` for a draft of ``topk``."""
        return self.staging and (self.staging_max_topk is None or topk <= self.staging_max_topk)

    def single_graph_step(self, topk: int) -> bool:
        """Whether multi-layer EAGLE may fold this step into one draft graph (line 433-436)."""
        return self.metadata_in_graph or self.stages_draft_extend(topk)


def _bool(where: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidValue(f"{where}.{key}", value, "true or false")
    return value


def _staging(where: str, value: Any) -> tuple[bool, int | None]:
    if isinstance(value, dict):
        topk = value.get("max_topk")
        if set(value) != {"max_topk"} or not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
            raise InvalidValue(f"{where}.supports_draft_extend_metadata_staging", value,
                               "true, false or { max_topk = N } with N >= 1")
        return True, topk
    return _bool(where, "supports_draft_extend_metadata_staging", value), None


def _parse(backend: str, cls: str, table: Any) -> Seams:
    where = f"{backend}: catalog.meta.seams.{cls}"
    if not isinstance(table, dict):
        raise InvalidValue(where, table, f"a table with {', '.join(_KEYS)}")
    unknown = sorted(set(table) - set(_KEYS))
    missing = [k for k in _KEYS[1:] if k not in table]
    if unknown or missing:
        raise InvalidValue(f"{where}.{(unknown or missing)[0]}", "unknown" if unknown else "missing",
                           f"keys {', '.join(_KEYS)} (models optional)")
    for key in ("glue_target_verify_metadata", "glue_draft_metadata"):
        if not isinstance(table[key], str):
            raise InvalidValue(f"{where}.{key}", table[key], "SGLang's reason text, '' where the prep may be glued")
    models = table.get("models")
    staging, max_topk = _staging(where, table["supports_draft_extend_metadata_staging"])
    flag = {key: _bool(where, key, table[key])
            for key in ("supports_ragged_verify_graph", "draft_extend_metadata_captured_in_graph")}
    return Seams(backend, cls, frozenset(models) if models is not None else None,
                 flag["supports_ragged_verify_graph"], staging, max_topk,
                 flag["draft_extend_metadata_captured_in_graph"], table["glue_target_verify_metadata"],
                 table["glue_draft_metadata"])


def seams_of(backend: str, model: str | None = None) -> tuple[Seams, ...]:
    """The seam answers of the classes behind catalogue entry ``backend`` (``"sglang:fa3"``), in
    file order; with ``model`` (``"mla"``), only the classes serving that model kind."""
    from attnhal.catalog import load

    tables = load(backend).meta.get("seams", {})
    found = tuple(_parse(backend, cls, table) for cls, table in tables.items())
    return tuple(s for s in found if model is None or s.models is None or model in s.models)


def multi_layer_runner(steps: Sequence[Seams], topk: int, graphs: bool, env: Mapping[str, str],
                       device: str = "cuda") -> tuple[str | None, str]:
    """The draft-extend runner multi-layer EAGLE builds, and why: ``(class name or None, reason)``.

    ``steps``: the draft-extend backend of each draft step; ``graphs``: decode graphs on.
    No vendor list: CUDA and HIP alike, NPU its own runner (lines 425-455).
    """
    if not graphs:
        return None, "decode graphs are off (--disable-cuda-graph or the decode graph backend disabled)"
    if env_bool(env, DRAFT_EXTEND_GRAPH_OFF):
        return None, f"{DRAFT_EXTEND_GRAPH_OFF} is set"
    own = _MULTI_LAYER_OWN.get(device)
    if own is not None:
        return own, f"the {device} device's own per-step runner"
    single = env_bool(env, SINGLE_GRAPH_DRAFT)
    blocking = [s for s in steps if not s.single_graph_step(topk)]
    if single and not blocking:
        return ("OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner",
                "every step's backend rebuilds its draft-extend metadata in the graph or stages it before replay")
    why = (f"{SINGLE_GRAPH_DRAFT} is off" if not single else
           f"{blocking[0].cls} neither rebuilds draft-extend metadata in the graph nor stages it"
           + (f" at topk {topk}" if blocking[0].staging else ""))
    return "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner", f"one graph per draft step: {why}"


@dataclass(frozen=True)
class OutOfTree:
    """An out-of-tree SGLang platform's answers: ``PlatformCapabilities.graph_capture`` and what
    its ``get_speculative_graph_runner_cls(algorithm, phase)`` returns per phase (``None``: eager)."""

    graph_capture: bool
    runners: Mapping[str, str | None]


def device_of(platform: Platform) -> str | None:
    """The torch device SGLang's workers carry on ``platform`` (``None``: no in-tree SGLang device)."""
    return _DEVICES.get(platform.vendor)


def draft_runner(phase: str, device: str | None = None, out_of_tree: OutOfTree | None = None) -> str | None:
    """The runner class ``eagle_worker_v2`` would build for ``phase`` once its backend rule
    allows a graph (the rules themselves: :mod:`~attnhal_sglang.audit`): the in-tree
    table per ``device``, or an out-of-tree platform's own seam (lines 151-161, 496-505, 618-621)."""
    if phase not in DRAFT_RUNNERS:
        raise InvalidValue("phase", phase, ", ".join(DRAFT_RUNNERS))
    if out_of_tree is not None:
        return out_of_tree.runners.get(phase) if out_of_tree.graph_capture else None
    runner = DRAFT_RUNNERS[phase].get(device or "")
    if runner is None:
        raise InvalidValue("device", device, ", ".join(DRAFT_RUNNERS[phase]))
    return runner


def plan_seams(roles: Mapping[str, str | None], model: str | None, topk: int, graphs: bool,
               env: Mapping[str, str]) -> dict[str, Any] | None:
    """What SGLang's seams decide for these roles, for ``plan --engine sglang`` (``--json``:
    ``seams``): the draft-extend backend's declarations and the runner multi-layer EAGLE would
    build with them (the flag ``--enable-multi-layer-eagle`` itself is not modelled: its steps are
    not attnhal phases). ``None``: no draft extend, or no single class (a model kind not given)."""
    extend = roles.get("draft_extend")
    found = seams_of(f"sglang:{extend}", model) if extend is not None else ()
    if len(found) != 1:
        return None
    seam = found[0]
    metadata = ("rebuilt in the graph" if seam.metadata_in_graph else
                "staged before replay" if seam.stages_draft_extend(topk) else "prepared eagerly before each replay")
    runner, why = multi_layer_runner([seam], topk, graphs, env)
    return {"backend": seam.backend, "class": seam.cls, "ragged_verify_graph": seam.ragged_verify_graph,
            "draft_extend_metadata": metadata, "multi_layer_eagle_runner": runner, "why": why}


def plan_lines(seams: Mapping[str, Any] | None) -> list[str]:
    """:func:`plan_seams`' answer as the plan's text line."""
    if seams is None:
        return []
    return [f"seams: {seams['backend']} ({seams['class']}): ragged verify graph "
            f"{'yes' if seams['ragged_verify_graph'] else 'no'}, draft-extend metadata "
            f"{seams['draft_extend_metadata']}; with --enable-multi-layer-eagle SGLang builds "
            f"{seams['multi_layer_eagle_runner'] or 'no draft-extend runner'} ({seams['why']})"]
