"""SGLang adapter: server arguments in, an attnhal plan out — without SGLang installed.

Takes SGLang's own argument names and values (release 0.5.23: ``attention_backend``,
``speculative_num_steps``, ``page_size``, ...) as a dict, a namespace or a command
line, and builds the planner's inputs: the spec config, the backend of every role
(descriptors from the catalogue, ``sglang:NAME``), the graph policy and the request
context. A flag attnhal does not model is an error naming it; a flag that cannot
change an attention-graph decision (``--model-path``, ``--port``, ...) is listed
as ignored, never dropped silently. See ``docs/engine.md``.

The fixed layout of an engine package (``docs/engine.md``):

- :mod:`~attnhal.engines.sglang.flags`: SGLang's vocabulary (modelled flags, aliases, harmless flags,
  the planner field each flag sets).
- :mod:`~attnhal.engines.sglang.resolution`: server arguments -> :class:`SglangConfig`; helped by
  :mod:`~attnhal.engines.sglang.defaults` (the attention backend SGLang picks when none is given) and
  :mod:`~attnhal.engines.sglang.pages` (the page size SGLang's resolution sets).
- :mod:`~attnhal.engines.sglang.plan`: the adapter (:data:`ADAPTER`) and :func:`plan_server_args`.
- optional: :mod:`~attnhal.engines.sglang.executed` (SGLang's own resolution, run where SGLang is
  importable), :mod:`~attnhal.engines.sglang.audit` (SGLang's decision next to attnhal's),
  :mod:`~attnhal.engines.sglang.plugin` (what runs inside SGLang), and
  :mod:`~attnhal.engines.sglang.kit`: the conformance kit on SGLang's own backend classes —
  the one part that runs SGLang (imported when a backend is built, never by this package).
"""

from attnhal.engines.flags import EngineArgError
from attnhal.engines.sglang.flags import FLAGS, HARMLESS, SGLANG_VERSION, parse_cli
from attnhal.engines.sglang.pages import PageSize, resolve_page_size
from attnhal.engines.sglang.plan import ADAPTER, plan_server_args
from attnhal.engines.sglang.resolution import (
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
