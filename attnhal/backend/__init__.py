"""The backend contract: AttentionBackend, ForwardBatch, the paged KV pool."""

from attnhal.backend.batch import ForwardBatch, SpecInfo
from attnhal.backend.contract import AttentionBackend, AttentionConfig, UnsupportedPhase, dtype_name
from attnhal.backend.kv_pool import PADDING_REQ, PADDING_SLOT, KVPool

__all__ = [
    "PADDING_REQ",
    "PADDING_SLOT",
    "AttentionBackend",
    "AttentionConfig",
    "ForwardBatch",
    "KVPool",
    "SpecInfo",
    "UnsupportedPhase",
    "dtype_name",
]
