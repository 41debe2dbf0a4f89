"""Descriptor files (JSON or TOML): the names of :mod:`attnhal.capabilities.files`, importable from here."""

from attnhal._compat import moved
from attnhal.capabilities.files import (
    SCHEMA_VERSION,
    DescriptorError,
    dump_descriptor,
    load_descriptor,
    parse_descriptor,
)

moved("attnhal.descriptors", "attnhal.capabilities.files")

__all__ = ["SCHEMA_VERSION", "DescriptorError", "dump_descriptor", "load_descriptor", "parse_descriptor"]
