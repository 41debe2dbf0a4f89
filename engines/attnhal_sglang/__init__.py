"""SGLang adapter: server arguments in, an attnhal plan out — without SGLang installed.

Takes SGLang's own argument names and values (release 0.5.23: ``attention_backend``,
``speculative_num_steps``, ``page_size``, ...) as a dict, a namespace or a command
line, and builds the planner's inputs: the spec config, the backend of every role
(descriptors from the catalogue, ``sglang:NAME``), the graph policy and the request
context. A flag attnhal does not model is an error naming it; a flag that cannot
change an attention-graph decision (``--model-path``, ``--port``, ...) is listed
as ignored, never dropped silently. See ``docs/engine.md``.

The fixed layout of an engine package (``docs/engine.md``):

- :mod:`~attnhal_sglang.flags`: SGLang's vocabulary (modelled flags, aliases, harmless flags,
  the planner field each flag sets).
- :mod:`~attnhal_sglang.config`: server arguments -> :class:`SglangConfig`; helped by
  :mod:`~attnhal_sglang.defaults` (the attention backend SGLang picks when none is given) and
  :mod:`~attnhal_sglang.pages` (the page size SGLang's resolution sets).
- :mod:`~attnhal_sglang.adapter`: the adapter (:data:`ADAPTER`) and :func:`plan_server_args`.
- optional: :mod:`~attnhal_sglang.executed` (SGLang's own resolution, run where SGLang is
  importable), :mod:`~attnhal_sglang.audit` (SGLang's decision next to attnhal's),
  :mod:`~attnhal_sglang.plugin` (what runs inside SGLang), and
  :mod:`~attnhal_sglang.kit`: the conformance kit on SGLang's own backend classes —
  the one part that runs SGLang (imported when a backend is built, never by this package).
"""

from attnhal.engines.flags import EngineArgError
from attnhal_sglang.flags import FLAGS, HARMLESS, SGLANG_VERSION, parse_cli
from attnhal_sglang.pages import PageSize, resolve_page_size
from attnhal_sglang.adapter import ADAPTER, plan_server_args
from attnhal_sglang.config import (
    DEFAULT_MAX_BS,
    DEFAULT_PAGE_SIZE,
    DRAFT_EXTEND_GRAPH_OFF,
    SglangConfig,
    capture_sizes,
    from_server_args,
    roles,
)

__all__ = [
    "ADAPTER",
    "DEFAULT_MAX_BS",
    "DEFAULT_PAGE_SIZE",
    "DRAFT_EXTEND_GRAPH_OFF",
    "FLAGS",
    "HARMLESS",
    "PageSize",
    "SGLANG_VERSION",
    "SglangConfig",
    "EngineArgError",
    "capture_sizes",
    "from_server_args",
    "parse_cli",
    "plan_server_args",
    "resolve_page_size",
    "roles",
]
