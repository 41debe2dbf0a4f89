"""The conformance kit on the Triton backend, run by the Triton interpreter on CPU.

The interpreter costs ~0.3 s per kernel launch, so CI runs the kit's fixed examples only
(one per claimed phase x dtype x head size, plus the graph and multi-step ones: ~75 s);
``ATTNHAL_CONFORMANCE_EXAMPLES=N`` adds N random examples per check. Under the interpreter
the kernels compute bf16 dots in fp32 (the interpreter's bf16 ``tl.dot`` is wrong,
triton#11584), so bf16 claims check loads, stores and casts, not the native bf16 dot.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from attnhal.platform import detect  # noqa: E402
from attnhal.testing.conformance import BackendConformance  # noqa: E402
from attnhal_triton import TritonBackend  # noqa: E402

if TritonBackend.runtime_reasons(detect()):  # conftest sets TRITON_INTERPRET=1; a GPU needs nothing
    pytest.skip(str(TritonBackend.runtime_reasons(detect())[0]), allow_module_level=True)


class TestTritonConformance(BackendConformance):
    backend_cls = "triton"  # through the registry, as `pytest --attnhal-backend triton` would
    max_examples = 0
    allow_unchecked = True  # the vendor claims need a GPU
    # The interpreter runs blocks one by one (CI time): edge rows, head layouts and input
    # variations, but no KV block boundaries past 64 and no long context here; a release
    # run sets ATTNHAL_CONFORMANCE_EXAMPLES and larger bounds.
    max_seq_len = 70
    max_cost = 2**20
