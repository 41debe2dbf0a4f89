# mypy: disable-error-code="no-untyped-def"
"""The order a kernel's programs run in, where the hardware deals them over several L2 caches.

On CDNA3/4 (MI300X, MI355X) consecutive workgroups go round-robin to 8 XCDs, each with its own
L2 (``device_fill.L2_DOMAINS``). A kernel whose grid keeps the query blocks that read one KV
range on axis 0 (the MLA kernel's head blocks, the extend kernel's query blocks of a row)
calls :func:`l2_program` instead of ``tl.program_id`` so that those blocks run behind one L2.

Imported lazily by the kernel modules (``TRITON_INTERPRET=1`` before import to run on CPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnhal_triton.device_fill import L2_DEAL

__all__ = ["HAND", "l2_program"]


#: Most consecutive programs one L2 is dealt at a time (``device_fill.L2_DEAL``).
HAND = tl.constexpr(L2_DEAL)


@triton.jit
def l2_program(DOMAINS: tl.constexpr, MAX_HAND: tl.constexpr):
    """This program's ``(x, y, z)`` in the launch's logical order: the grid's own unless the
    hardware deals consecutive programs round-robin over ``DOMAINS`` L2 caches (CDNA3/4's
    XCDs), where program ``w`` runs behind L2 ``w % DOMAINS`` as its ``w // DOMAINS``-th.
    There the logical order is cut in hands of ``min(X, MAX_HAND)`` programs (a window: the ``X``
    query blocks of one ``(y, z)``, a row's split, or a part of a long one) dealt round-robin:
    L2 ``d`` runs hands ``d, d + DOMAINS, ...``, each in consecutive turns, so a window's
    blocks read their row behind one L2 (not one L2 each) and the L2s share the hands as
    evenly as the grid's order shares its programs. The last ``hands % DOMAINS`` hands keep
    the grid's order. :func:`attnhal_triton.kv_reuse.logical_rank` is the same map; a bijection
    for any grid: a wrong count costs sharing, never results."""
    x = tl.program_id(0)
    y = tl.program_id(1)
    z = tl.program_id(2)
    if DOMAINS > 1:
        nx = tl.num_programs(0)
        ny = tl.num_programs(1)
        hand = tl.minimum(nx, MAX_HAND)
        w = x + nx * (y + ny * z)
        turn = w // DOMAINS
        dealt = w < nx * ny * tl.num_programs(2) // hand // DOMAINS * DOMAINS * hand
        b = tl.where(dealt, (w % DOMAINS + DOMAINS * (turn // hand)) * hand + turn % hand, w)
        x = b % nx
        y = (b // nx) % ny
        z = b // nx // ny
    return x, y, z
