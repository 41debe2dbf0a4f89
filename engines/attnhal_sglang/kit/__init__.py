"""The conformance kit on SGLang's own attention backends (SGLang 0.5.23, on the CPU).

``attnhal conformance sglang:triton`` and ``sglang:torch_native`` check the catalogue
entry's claims by running SGLang's real classes (``TritonAttnBackend`` under the Triton
interpreter, ``TritonMultiStepDraftBackend``, ``TorchNativeAttnBackend``) through the
adapter of :mod:`~attnhal_sglang.kit.adapter`. SGLang is imported only when a
backend is built: importing this package loads none of it.

- :mod:`~attnhal_sglang.kit.runtime`: SGLang's objects (model-runner shim, pools, layers).
- :mod:`~attnhal_sglang.kit.batches`: attnhal phases -> SGLang forward modes and batches.
- :mod:`~attnhal_sglang.kit.launch`: SGLang's work as ops the CPU graph emulator replays.
- :mod:`~attnhal_sglang.kit.adapter`: :class:`SGLangAttention`, the backend contract.
- :mod:`~attnhal_sglang.kit.certify`: which claims run here, and the report.
"""

from attnhal_sglang.kit.certify import KIT_BACKENDS, checked_class, not_checked, run_kit, runner, unrunnable
from attnhal_sglang.kit.runtime import MISSING, SGLANG_VERSION, engine_reasons

__all__ = ["KIT_BACKENDS", "MISSING", "SGLANG_VERSION", "checked_class", "engine_reasons", "not_checked",
           "run_kit", "runner", "unrunnable"]
