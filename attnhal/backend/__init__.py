"""The backend contract: AttentionBackend, ForwardBatch, the paged KV pool, MultiStepDraft."""

from attnhal.backend.batch import ForwardBatch, SpecInfo
from attnhal.backend.contract import AttentionBackend, AttentionConfig, UnsupportedPhase, dtype_name
from attnhal.backend.kv_pool import PADDING_PAGE, PADDING_REQ, PADDING_SLOT, KVPool, slot_of
from attnhal.backend.multi_step import MultiStepDraft, MultiStepUnsupported
from attnhal.backend.validate import (
    BatchValidationError,
    debug_enabled,
    set_debug,
    validate_batch,
    validate_forward,
)

__all__ = [
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
    "UnsupportedPhase",
    "debug_enabled",
    "dtype_name",
    "set_debug",
    "slot_of",
    "validate_batch",
    "validate_forward",
]
