"""What a claim is and how its outcome is reported: :class:`Claim`, :class:`ClaimResult`.

:func:`claims` lists every claim of a descriptor the kit knows, in report order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from attnhal.capabilities import BackendCapabilities
from attnhal.errors import AttnhalError
from attnhal.phases import GRAPH_PHASES, Feature, Phase
from attnhal.platform import Vendor
from attnhal.spec import DTYPES
from attnhal.testing.settings import EXAMPLES_ENV, env_examples

#: Random examples per check by default: with the fixed examples (sizes at block
#: boundaries, head layouts, edge rows, input variations) the torch backend's whole
#: report stays under a minute on 2 CPU cores.
DEFAULT_EXAMPLES = 3
#: ``--thorough``: random examples per check, for release checks.
THOROUGH_EXAMPLES = 25


class Status(str, Enum):
    VERIFIED = "verified"
    FALSIFIED = "falsified"
    NOT_CHECKED = "not checked here"
    #: The kit itself failed on this claim (a bug of the kit or of its environment): the
    #: claim is unverified, and the other claims are still reported.
    ERROR = "kit error"


class ClaimKind(str, Enum):  # noqa: D101 - the claims, as the report names them
    PHASE = "phase"
    UNCLAIMED = "unclaimed"
    FEATURE = "feature"
    UNCLAIMED_FEATURE = "unclaimed_feature"
    GRAPH = "graph"
    SEQ_LEN_FILL = "seq_len_fill"
    MULTI_STEP = "multi_step"
    DETERMINISTIC = "deterministic"
    INPUTS_UNCHANGED = "inputs_unchanged"
    BATCH_INVARIANT = "batch_invariant"
    LAYER_PATTERN = "layer_pattern"
    SCALE_EDGES = "scale_edges"
    EMPTY_BATCH = "empty_batch"
    PAGE_SIZE = "page_size"
    KV_DTYPE = "kv_dtype"
    VENDOR = "vendor"


#: Properties every backend owes whatever its descriptor says, checked by derived batches
#: (:mod:`.metamorphic`, :mod:`.edges`).
METAMORPHIC = (ClaimKind.BATCH_INVARIANT, ClaimKind.LAYER_PATTERN, ClaimKind.SCALE_EDGES, ClaimKind.EMPTY_BATCH)


@dataclass(frozen=True)
class Claim:
    """One claim of a descriptor: ``kind`` about ``subject`` (a phase, feature, vendor...)."""

    kind: ClaimKind
    subject: str = ""
    dtype: str | None = None

    @property
    def name(self) -> str:
        """``phase[decode, float16]``, ``graph[target_verify]``, ``multi_step``, ..."""
        if not self.subject:
            return self.kind.value
        inner = f"{self.subject}, {self.dtype}" if self.dtype else self.subject
        return f"{self.kind.value}[{inner}]"

    @property
    def phase(self) -> Phase:
        return Phase(self.subject)

    def __str__(self) -> str:
        return self.name


class ClaimFalsified(AttnhalError, AssertionError):
    """Running the backend contradicted ``claim``; ``detail`` says how.

    Raised from inside a hypothesis test, it carries the shrunk counterexample in
    ``__notes__`` ("Falsifying example: ...").
    """

    def __init__(self, claim: Claim | str, detail: str) -> None:
        self.claim, self.detail = str(claim), detail
        super().__init__(f"claim {self.claim} falsified: {detail}")

    def __reduce__(self) -> tuple[type[ClaimFalsified], tuple[str, str]]:
        return (ClaimFalsified, (self.claim, self.detail))


class NothingToCheck(AttnhalError, LookupError):
    """A check with no example to run: no fixed example fits the run's bounds and no random one
    is drawn (``--examples 0``). The claim is *not checked here*, never verified by nothing."""


@dataclass
class ClaimResult:
    """The outcome of one claim. ``counterexample``: the falsifying example, as hypothesis printed it.

    ``flaky``: falsified once, but the failure did not repeat when the example was run
    again (a race, uninitialised memory, state carried between calls): still falsified.
    ``tolerance``: the declared tolerance the claim was checked with, per dtype (``float32
    1e-05; float16 0.001``; empty for a claim that compares nothing against the reference).
    """

    claim: Claim
    status: Status
    detail: str
    counterexample: str | None = None
    examples: int = 0
    seconds: float = 0.0
    flaky: bool = False
    tolerance: str = ""
    #: Per quantity, the range its examples reached (:mod:`attnhal.testing.checks.coverage`).
    coverage: dict[str, Any] = field(default_factory=dict)

    @property
    def device_elsewhere(self) -> bool:
        """Not checked because it needs a device this process does not have: ``vendor[V]`` off a
        real V device. The report lists it and, unless the run is strict, does not fail on it: no
        CPU machine can check a CUDA claim, so failing there would make every such run red."""
        return self.status is Status.NOT_CHECKED and self.claim.kind is ClaimKind.VENDOR

    @property
    def label(self) -> str:
        """The status as the report prints it: ``falsified (flaky)`` for a flaky falsification."""
        return f"{self.status.value} (flaky)" if self.flaky else self.status.value

    def to_dict(self) -> dict[str, Any]:
        return {"claim": self.claim.name, "kind": self.claim.kind.value, "subject": self.claim.subject,
                "dtype": self.claim.dtype, "status": self.status.value, "flaky": self.flaky,
                "detail": self.detail, "counterexample": self.counterexample, "examples": self.examples,
                "tolerance": self.tolerance, "seconds": round(self.seconds, 3), "coverage": self.coverage}




def examples_from_env(default: int | None = None) -> int:
    """``$ATTNHAL_CONFORMANCE_EXAMPLES`` if set (within ``--examples``'s bound, else
    :class:`~attnhal.errors.InvalidValue` naming the variable), else ``default``
    (:data:`DEFAULT_EXAMPLES`)."""
    value = env_examples()
    if value is not None:
        return value
    return DEFAULT_EXAMPLES if default is None else default


# --- which claims, and which can run here -----------------------------------------------------------

def claims(caps: BackendCapabilities) -> list[Claim]:
    """Every claim of ``caps`` the kit knows, in report order."""
    phases = [p for p in Phase if p in caps.phases]
    out = [Claim(ClaimKind.PHASE, p.value, d) for p in phases for d in DTYPES if d in caps.dtypes]
    out += [Claim(ClaimKind.UNCLAIMED, p.value) for p in Phase if p not in caps.phases]
    out += [Claim(ClaimKind.FEATURE, f.value) for f in Feature if f in caps.features]
    # custom_mask is a per-batch input, refused by the phase check of a tree batch instead
    out += [Claim(ClaimKind.UNCLAIMED_FEATURE, f.value) for f in Feature
            if f not in caps.features and f is not Feature.CUSTOM_MASK]
    graphs = [p for p in GRAPH_PHASES if p in caps.graph]
    out += [Claim(ClaimKind.GRAPH, p.value) for p in graphs]
    out += [Claim(ClaimKind.SEQ_LEN_FILL, p.value) for p in graphs]
    if caps.multi_step is not None:
        out.append(Claim(ClaimKind.MULTI_STEP))
    # Not descriptor fields: every backend owes them (an engine relies on both).
    out += [Claim(ClaimKind.DETERMINISTIC), Claim(ClaimKind.INPUTS_UNCHANGED)]
    out += [Claim(k) for k in METAMORPHIC]
    out += [Claim(ClaimKind.PAGE_SIZE, str(s)) for s in sorted(caps.page_sizes) if s != 1]
    out += [Claim(ClaimKind.KV_DTYPE, d) for d in sorted(set(caps.kv_dtypes or ()) - set(caps.dtypes))]
    out += [Claim(ClaimKind.VENDOR, v.value) for v in Vendor if v in caps.vendors]
    return out

