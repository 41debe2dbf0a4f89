"""The backend contract: AttentionBackend, ForwardBatch, the paged KV pool, MultiStepDraft."""

from attnhal.backend.batch import ForwardBatch, SpecInfo
from attnhal.backend.contract import (
    AttentionBackend,
    AttentionConfig,
    UnsupportedFeature,
    UnsupportedPhase,
    config_reasons,
    dtype_name,
)
from attnhal.backend.kv_pool import (
    FP8_DTYPES,
    PADDING_PAGE,
    PADDING_REQ,
    PADDING_SLOT,
    KVPool,
    kv_dtype_name,
    kv_storage_dtype,
    slot_of,
)
from attnhal.backend.multi_step import MultiStepDraft, MultiStepUnsupported
from attnhal.backend.validate import (
    BatchValidationError,
    debug_enabled,
    set_debug,
    validate_batch,
    validate_forward,
)

__all__ = [
    "FP8_DTYPES",
    "PADDING_PAGE",
    "PADDING_REQ",
    "PADDING_SLOT",
    "AttentionBackend",
    "AttentionConfig",
    "BatchValidationError",
    "ForwardBatch",
    "KVPool",
    "MultiStepDraft",
    "MultiStepUnsupported",
    "SpecInfo",
    "UnsupportedFeature",
    "UnsupportedPhase",
    "config_reasons",
    "debug_enabled",
    "dtype_name",
    "kv_dtype_name",
    "kv_storage_dtype",
    "set_debug",
    "slot_of",
    "validate_batch",
    "validate_forward",
]
