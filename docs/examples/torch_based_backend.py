"""A backend built on the torch reference: your own decode, the reference for everything else.

Start a backend this way while its kernels are being written: subclass
``attnhal_torch.TorchBackend``, replace the phases you have a kernel for, and declare a
descriptor that claims what the whole class does. Here decode is replaced by an eager kernel
that is not graph-safe (it reads lengths on the host), so the descriptor drops decode's graph
claim and keeps the reference's other claims. Check it:
``attnhal conformance torch_based_backend:DecodeOnTopOfTorch --platform cpu``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch

from attnhal.backend import ForwardBatch
from attnhal.capabilities import BackendCapabilities
from attnhal.phases import Feature, Phase
from attnhal.spec import ModelKind
from attnhal_torch import TorchBackend

_REFERENCE = TorchBackend.capabilities


class DecodeOnTopOfTorch(TorchBackend):
    capabilities: ClassVar[BackendCapabilities] = replace(
        _REFERENCE, name="decode-on-torch",
        graph={phase: limits for phase, limits in _REFERENCE.graph.items() if phase is not Phase.DECODE},
        # what this decode handles: the token table of page size 1, plain softmax attention over a
        # KV cache in the compute dtype (tree masks are target_verify's, served by the reference)
        page_sizes=frozenset({1}), kv_dtypes=_REFERENCE.dtypes, features=frozenset({Feature.CUSTOM_MASK}),
        models=frozenset({ModelKind.MHA, ModelKind.GQA}),
    )

    def forward_decode(self, q: torch.Tensor, layer: int, batch: ForwardBatch) -> torch.Tensor:
        """Your decode kernel: ``q`` ``[bs, num_q_heads, head_size]`` -> ``[bs, num_q_heads, v_head_size]``,
        computed in float32 whatever the compute dtype (the dtype's tolerance is the reference's)."""
        group, scale = self.config.group_size, self.config.sm_scale
        out = q.new_empty(q.shape[0], q.shape[1], self.config.out_head_size)
        for row, length in enumerate(batch.seq_lens.tolist()):
            slots = self.pool.req_to_token[batch.req_pool_indices[row], :length].long()
            k = self.pool.k[layer][slots].float().repeat_interleave(group, dim=1)  # [length, heads, d]
            v = self.pool.v[layer][slots].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,nhd->hn", q[row].float(), k) * scale
            out[row] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v).to(q.dtype)
        return out
