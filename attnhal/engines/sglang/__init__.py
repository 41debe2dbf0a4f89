"""SGLang adapter: server arguments in, an attnhal plan out — without SGLang installed.

Takes SGLang's own argument names and values (release 0.5.23: ``attention_backend``,
``speculative_num_steps``, ``page_size``, ...) as a dict, a namespace or a command
line, and builds the planner's inputs: the spec config, the backend of every role
(descriptors from the catalogue, ``sglang:NAME``), the graph policy and the request
context. A flag attnhal does not model is an error naming it; a flag that cannot
change an attention-graph decision (``--model-path``, ``--port``, ...) is listed
as ignored, never dropped silently. See ``docs/engine.md``.

- :mod:`~attnhal.engines.sglang.flags`: SGLang's vocabulary (modelled flags, aliases, harmless flags).
- :mod:`~attnhal.engines.sglang.resolution`: server arguments -> :class:`EngineConfig`.
- :mod:`~attnhal.engines.sglang.defaults`: the attention backend SGLang picks when none is given.
- :mod:`~attnhal.engines.sglang.pages`: the page size SGLang's resolution sets (:func:`resolve_page_size`).
- :mod:`~attnhal.engines.sglang.plan`: :func:`plan_server_args`.
"""

from attnhal.engines.flags import EngineArgError
from attnhal.engines.sglang.flags import FLAGS, HARMLESS, SGLANG_VERSION, parse_cli
from attnhal.engines.sglang.pages import PageSize, resolve_page_size
from attnhal.engines.sglang.plan import plan_server_args
from attnhal.engines.sglang.resolution import (
    DEFAULT_MAX_BS,
    DEFAULT_PAGE_SIZE,
    DRAFT_EXTEND_GRAPH_OFF,
    EngineConfig,
    capture_sizes,
    from_server_args,
    roles,
)

__all__ = [
    "DEFAULT_MAX_BS",
    "DEFAULT_PAGE_SIZE",
    "DRAFT_EXTEND_GRAPH_OFF",
    "FLAGS",
    "HARMLESS",
    "PageSize",
    "SGLANG_VERSION",
    "EngineArgError",
    "EngineConfig",
    "capture_sizes",
    "from_server_args",
    "parse_cli",
    "plan_server_args",
    "resolve_page_size",
    "roles",
]
