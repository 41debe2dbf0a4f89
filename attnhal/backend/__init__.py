"""The backend contract: AttentionBackend, AttentionConfig, ForwardBatch, the paged KV pool, MultiStepDraft."""

from attnhal.backend.batch import ForwardBatch, SpecInfo
from attnhal.backend.config import COMPUTE_DTYPES, AttentionConfig, compute_dtype, dtype_name
from attnhal.backend.contract import (
    AttentionBackend,
    UnsupportedFeature,
    UnsupportedPhase,
    config_reasons,
    default_platform,
    new_backend,
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
    maybe_validate_batch,
    set_debug,
    validate_batch,
    validate_forward,
)

__all__ = [
    "COMPUTE_DTYPES",
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
    "compute_dtype",
    "config_reasons",
    "debug_enabled",
    "default_platform",
    "dtype_name",
    "kv_dtype_name",
    "kv_storage_dtype",
    "maybe_validate_batch",
    "new_backend",
    "set_debug",
    "slot_of",
    "validate_batch",
    "validate_forward",
]
