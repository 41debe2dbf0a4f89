"""How hard the kit looks, bounded: random examples per check and the seconds of a run.

Light (no torch, no hypothesis): the CLI builds its flags from these bounds, the pytest
plugin its options, and the environment variable the kit reads is held to the bound of the
flag it stands for, with the same message. No setting lets a run go on without end: the
budget is finite and at most 24 hours, so each claim's share of it is finite too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from attnhal.bounds import Bound, FloatBound
from attnhal.errors import InvalidValue

__all__ = ["BUDGET", "ENV_FLAGS", "EXAMPLES", "EXAMPLES_ENV", "env_examples"]

#: Random examples per check on top of the fixed ones (``--examples``).
EXAMPLES = Bound("examples", 0, 10_000)
#: Seconds of random examples for a whole run (``--budget``): at most a day.
BUDGET = FloatBound("budget", 0.001, 86_400.0, "seconds")
#: Environment variable: random examples per check (as ``--examples``).
EXAMPLES_ENV = "ATTNHAL_CONFORMANCE_EXAMPLES"
#: Every environment variable the kit reads -> the flag it stands for and that flag's bound.
ENV_FLAGS: Mapping[str, tuple[str, Bound]] = {EXAMPLES_ENV: ("--examples", EXAMPLES)}


def env_examples(environ: Mapping[str, str] | None = None) -> int | None:
    """``$ATTNHAL_CONFORMANCE_EXAMPLES`` as an integer within :data:`EXAMPLES`, None when unset;
    else :class:`~attnhal.errors.InvalidValue` naming the variable."""
    raw = (os.environ if environ is None else environ).get(EXAMPLES_ENV, "").strip()
    if not raw:
        return None
    flag, bound = ENV_FLAGS[EXAMPLES_ENV]
    try:
        value = int(raw)
    except ValueError:  # text, a float, or an integer over 4300 digits
        value = bound.low - 1
    if not bound.low <= value <= bound.high:
        raise InvalidValue(EXAMPLES_ENV, raw, f"{bound.supported}, as {flag}")
    return value
