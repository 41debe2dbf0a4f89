"""A complete attnhal backend: decode attention in float32, plain torch, eager only.

Run the kit on it: ``attnhal conformance minimal_backend:MinimalDecode --platform cpu``
(with this folder on ``PYTHONPATH``). Register it for ``attnhal plan`` and the engines
with an entry point in the ``attnhal.backends`` group (see docs/backends.md).
"""

from __future__ import annotations

import torch

from attnhal.backend import AttentionBackend, ForwardBatch
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Phase


class MinimalDecode(AttentionBackend):
    # What it claims, and nothing more: the kit checks each claim by running it, and the base
    # class refuses every phase, feature, page size and dtype not listed here.
    capabilities = BackendCapabilities(
        name="minimal", vendors={"cpu"}, phases={Phase.DECODE},
        dtypes={"float32"}, head_sizes={64, 128}, page_sizes={1},
    )

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pass  # nothing to plan: forward_decode reads the batch itself (no graph is claimed)

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """``q``: ``[bs, num_q_heads, head_size]`` -> ``[bs, num_q_heads, v_head_size]``.

        The base ``forward`` has already written this step's K/V into the pool.
        """
        group = self.config.group_size  # query heads per KV head
        out = q.new_empty(q.shape[0], q.shape[1], self.config.out_head_size)
        lengths = batch.seq_lens.tolist()  # a host sync: fine here, since no graph is claimed
        for row, length in enumerate(lengths):
            slots = self.pool.req_to_token[batch.req_pool_indices[row], :length].long()
            k = self.pool.k[layer][slots].repeat_interleave(group, dim=1)  # [length, heads, d]
            v = self.pool.v[layer][slots].repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,nhd->hn", q[row], k) * self.config.sm_scale
            out[row] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)
        return out
