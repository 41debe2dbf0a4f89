"""Strict mode's refusal of a catalogued late failure (``ATTNHAL_SGLANG_GRAPHS=strict``), before SGLang
captures: :func:`refuse_late`. Apart from :mod:`~attnhal_sglang.late` because it resolves the worker's
server arguments (:mod:`~attnhal_sglang.config`, which reads :mod:`~attnhal_sglang.late`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from attnhal_sglang.late import late_failures

__all__ = ["AVOID", "refuse_late"]

#: What avoids aiter's late failure (the flags SGLang reads; ``attnhal advise --engine sglang`` ranks them).
AVOID = ("--speculative-eagle-topk 1, or a draft-extend backend that takes topk > 1 "
         "(--speculative-draft-attention-backend; attnhal advise --engine sglang)")


def refuse_late(head: str, planned: Any) -> None:
    """Strict mode, before SGLang captures: raise :class:`~attnhal.engines.report.StrictRefusal` where a
    catalogued late failure applies to the draft worker ``planned`` (the plugin's ``DraftPlan``: its
    resolved server arguments, model and the backends SGLang built), naming the entry and when it fails.
    Without this a failure at capture would stop the server from inside SGLang, unexplained, and one at
    the first draft extend would stop it later."""
    from attnhal.engines.report import StrictRefusal
    from attnhal_sglang.config import from_server_args

    config = from_server_args(planned.args, env=os.environ, model=planned.model)
    names = {phase.value: name for phase, name in planned.names.items()}
    config = dataclasses.replace(config, roles={**config.roles, **names})
    found = late_failures(config, planned.platform)
    if found:
        said = "; ".join(f"{f.phase.value}: {f}" for f in found)
        raise StrictRefusal(f"ATTNHAL_SGLANG_GRAPHS=strict refuses to start {head}: {said}; supported: {AVOID}")
