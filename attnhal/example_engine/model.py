"""A tiny Llama-like decoder whose attention runs through an attnhal backend.

RMSNorm, rotary position embeddings, grouped-query attention (through
:meth:`AttentionBackend.forward`), SwiGLU MLP. With ``ModelConfig(mla=True)`` the attention is
DeepSeek's MLA in its absorbed form: one KV "head" per token, a normed latent of
``latent_dim`` plus a rope part of ``rope_dim`` (K), V = the latent; each q head is projected
straight to the latent width (the nope projection and K's up-projection multiplied into one
weight) plus its rope part, and the output projection reads the heads' latent outputs. Weights are seeded random numbers —
nothing is downloaded. The draft model shares the target's embedding, final
norm and LM head and copies its first layers, so its greedy guesses agree with
the target often but not always: acceptance is neither zero nor trivial.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from attnhal.backend import AttentionBackend, AttentionConfig, ForwardBatch
from attnhal.spec import ModelKind

__all__ = ["ModelConfig", "TinyLlama", "draft_of"]


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 4
    num_q_heads: int = 4
    num_kv_heads: int = 2
    #: 64: a head size every shipped backend claims (the cpu kernel starts at 64), so the demo runs on
    #: the default backend of any platform.
    head_dim: int = 64
    ffn_size: int = 256
    rope_theta: float = 10000.0
    #: Scale of the residual branches: small keeps early layers predictive of the final output.
    residual_scale: float = 0.25
    seed: int = 0
    #: MLA (absorbed): q/k head ``latent_dim + rope_dim``, V ``latent_dim``, one KV head.
    mla: bool = False
    latent_dim: int = 512
    rope_dim: int = 64

    @property
    def kind(self) -> ModelKind:
        """The attention layout, as plans and backend requests name it."""
        return ModelKind.MLA if self.mla else ModelKind.MHA if self.num_kv_heads == self.num_q_heads else ModelKind.GQA

    @property
    def attention(self) -> AttentionConfig:
        if self.mla:
            return AttentionConfig(self.num_q_heads, 1, self.latent_dim + self.rope_dim, torch.float32,
                                   v_head_size=self.latent_dim)
        return AttentionConfig(self.num_q_heads, self.num_kv_heads, self.head_dim, torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[tokens, heads, dim]`` at ``positions`` ``[tokens]``."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        q, kv, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(cfg.hidden_size), RMSNorm(cfg.hidden_size)
        if cfg.mla:  # q: every head's latent + rope; kv: one latent + one rope part
            latent, rope = cfg.latent_dim, cfg.rope_dim
            self.qkv = nn.Linear(cfg.hidden_size, q * (latent + rope) + latent + rope, bias=False)
            self.kv_norm = RMSNorm(latent)
            self.o = nn.Linear(q * latent, cfg.hidden_size, bias=False)
        else:
            self.qkv = nn.Linear(cfg.hidden_size, (q + 2 * kv) * d, bias=False)
            self.o = nn.Linear(q * d, cfg.hidden_size, bias=False)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_size, bias=False)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                backend: AttentionBackend) -> torch.Tensor:
        cfg = self.cfg
        attn = (self._mla if cfg.mla else self._gqa)(self.qkv(self.attn_norm(x)), positions, batch, backend)
        x = x + cfg.residual_scale * self.o(attn.reshape(x.shape[0], -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + cfg.residual_scale * self.down(nn.functional.silu(gate) * up)

    def _gqa(self, qkv: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
             backend: AttentionBackend) -> torch.Tensor:
        cfg = self.cfg
        q_heads, kv_heads, d = cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v = qkv.split((q_heads * d, kv_heads * d, kv_heads * d), dim=-1)
        q = rotate(q.view(-1, q_heads, d), positions, cfg.rope_theta)
        k = rotate(k.view(-1, kv_heads, d), positions, cfg.rope_theta)
        return backend.forward(q, k, v.view(-1, kv_heads, d), self.layer, batch)

    def _mla(self, qkv: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
             backend: AttentionBackend) -> torch.Tensor:
        """q ``[T, H, latent + rope]``, K ``[T, 1, latent + rope]``, V = K's latent ``[T, 1, latent]``;
        rope on the rope parts only; returns ``[T, H, latent]``."""
        cfg = self.cfg
        heads, latent, rope = cfg.num_q_heads, cfg.latent_dim, cfg.rope_dim
        q, kv = qkv.split((heads * (latent + rope), latent + rope), dim=-1)
        q = q.view(-1, heads, latent + rope)
        q = torch.cat((q[..., :latent], rotate(q[..., latent:], positions, cfg.rope_theta)), dim=-1)
        c = self.kv_norm(kv[:, :latent]).view(-1, 1, latent)
        k = torch.cat((c, rotate(kv[:, None, latent:], positions, cfg.rope_theta)), dim=-1)
        return backend.forward(q, k, c, self.layer, batch)


class TinyLlama(nn.Module):
    """``forward(input_ids [T], positions [T], batch, backend) -> logits [T, vocab]``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        generator = torch.Generator().manual_seed(cfg.seed)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() > 1:
                    p.copy_(torch.randn(p.shape, generator=generator) * p.shape[-1] ** -0.5)
            # Unit-scale embeddings keep the residual stream dominated by the token, so that
            # a shallower draft often (not always) agrees with the target.
            self.embed.weight.copy_(torch.randn(self.embed.weight.shape, generator=generator))
        self.requires_grad_(False)
        self.eval()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch,
                backend: AttentionBackend) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.layers:
            x = block(x, positions, batch, backend)
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits


def draft_of(target: TinyLlama, num_layers: int = 1) -> TinyLlama:
    """A draft model: the target's first ``num_layers`` layers, embedding, norm and head (shared)."""
    draft = TinyLlama(replace(target.cfg, num_layers=num_layers))
    draft.embed, draft.norm, draft.lm_head = target.embed, target.norm, target.lm_head
    for mine, theirs in zip(draft.layers, target.layers):
        mine.load_state_dict(theirs.state_dict())
    return draft
