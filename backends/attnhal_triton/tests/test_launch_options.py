"""Triton backend: each launch row's options are what its arch's compiler takes and runs (no
option of another vendor, none overridden or warned about), and a row's encoded form round-trips."""

import os

# Before triton or any kernel module is imported: triton reads it at decoration time.
os.environ["TRITON_INTERPRET"] = "1"

import warnings  # noqa: E402

from attnhal_triton import FALLBACK, TABLE  # noqa: E402
from attnhal_triton.compile_check import _gpu_target  # noqa: E402
from attnhal_triton.launch_table import decode_launch  # noqa: E402
from attnhal_triton.mla_table import MLA_TABLE  # noqa: E402


def test_vendor_only_options_are_valid_options_of_that_vendors_compiler() -> None:
    """Each row's launch options are fields of its Triton backend's options class, so
    ``**row.launch_options`` never passes a HIP option to a CUDA launch (which raises)."""
    from triton.backends.amd.compiler import HIPOptions
    from triton.backends.nvidia.compiler import CUDAOptions

    fields = {"cuda": set(CUDAOptions.__dataclass_fields__), "hip": set(HIPOptions.__dataclass_fields__)}
    common = fields["cuda"] & fields["hip"]
    for row in TABLE + FALLBACK:
        allowed = fields.get(row.vendor or "", common)  # fallback and interpreter rows: both
        assert set(row.launch_options) <= allowed, row.key()


def test_every_row_is_taken_as_given_by_its_archs_compiler() -> None:
    """CDNA4's compiler has dropped ``kpack`` (Triton warns at every such compile and sets 1):
    no row of either table passes an option its arch's compiler overrides, so a server's log
    carries no such warning and the row (and the enumeration's form) says what runs."""
    from triton.compiler.compiler import make_backend

    targets = {"sm80": "cuda:80", "sm90": "cuda:90", "sm120": "cuda:120", "gfx90": "hip:gfx90a",
               "gfx94": "hip:gfx942", "gfx95": "hip:gfx950"}
    rows = [r for r in TABLE + MLA_TABLE if r.vendor in ("cuda", "hip")]
    assert {r.arch_family for r in rows} == set(targets)
    for row in rows:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            backend = make_backend(_gpu_target(targets[str(row.arch_family)]))
            options = backend.parse_options(dict(row.launch_options))
        about_options = [str(w.message) for w in caught if any(k in str(w.message) for k in row.launch_options)]
        assert not about_options and {k: getattr(options, k) for k in row.launch_options} == row.launch_options, (
            row.key(), about_options)


def test_launch_encoding_round_trips() -> None:
    for row in TABLE + FALLBACK:
        constexprs, options = decode_launch(row.encode())
        assert constexprs == row.constexprs and options == row.launch_options
