"""Scaled dot-product attention and multi-head attention (chapters 1 and 3).

The explicit :func:`scaled_dot_product_attention` is the textbook formula
``softmax(q k^T / sqrt(d_k)) v``; :class:`MultiHeadAttention` uses it when the
caller asks for the attention weights, and PyTorch's fused
``F.scaled_dot_product_attention`` otherwise. Tests prove both paths equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_tensor
from .masks import causal_mask, check_mask


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Explicit attention: ``weights = softmax(q k^T * scale)``, ``out = weights v``.

    ``scale`` defaults to ``1 / sqrt(d_k)``. ``mask`` is boolean, True = may attend.
    A query whose keys are all masked gets zero weights and a zero output (never NaN).
    ``dropout_p`` drops attention weights (use 0 at evaluation time).

    Shapes:
        q: (..., T_q, d_k), k: (..., T_k, d_k), v: (..., T_k, d_v),
        mask: broadcastable to (..., T_q, T_k)
        -> out (..., T_q, d_v), weights (..., T_q, T_k)

    Defined in chapter 1, Attention.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, floating=True)
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., T, d), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the last dimension d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length T_k, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"mask must be a boolean tensor (True = may attend), got {got}")
        try:
            fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape  # no new axes in the output
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"mask of shape {tuple(mask.shape)} cannot broadcast to the scores' shape "
                             f"(..., T_q, T_k) = {tuple(scores.shape)}")
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        # A row with every key masked is softmax(-inf, ..., -inf) = NaN: define it as zeros.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


@dataclass
class KVCache:
    """Keys and values of earlier positions, kept for incremental decoding.

    For self-attention (``static=False``) each call appends the new positions' keys
    and values. For cross-attention (``static=True``) the first call projects the
    encoder memory once and later calls reuse it.

    Shapes: k, v (B, n_heads, T_cache, d_head).
    """

    k: Tensor | None = None
    v: Tensor | None = None
    static: bool = False

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]


def _fused_attention(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """``F.scaled_dot_product_attention``, in fp32 when bf16 inputs are on the CPU.

    PyTorch's CPU attention kernels are slower in bf16 than in fp32 (the backward about 4x
    at chapter 7's sizes), and attention is a small share of the matrix work, so under
    CPU autocast the attention itself runs in fp32 and only the projections in bf16.
    """
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate q/k/v projections and an output projection.

    ``forward(query, key, value)`` projects, splits into ``n_heads`` heads of size
    ``d_head = d_model // n_heads``, attends in every head at once, merges heads and
    projects back. With ``need_weights=True`` it runs the explicit path and also
    returns the per-head weights; otherwise it calls ``F.scaled_dot_product_attention``.
    An optional :class:`~transformer_lib.positional.RotaryEmbedding` rotates q and k.

    Shapes:
        query (B, T_q, d_model), key/value (B, T_k, d_model),
        mask broadcastable to (B, n_heads, T_q, T_k)
        -> out (B, T_q, d_model) [, weights (B, n_heads, T_q, T_k)]

    Defined in chapter 3, Multi-head attention.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 rotary: nn.Module | None = None) -> None:
        super().__init__()
        if not (isinstance(d_model, int) and isinstance(n_heads, int)) or d_model <= 0 or n_heads <= 0:
            raise ValueError(f"d_model and n_heads must be positive ints, got d_model={d_model!r}, n_heads={n_heads!r}")
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads}); "
                             f"d_model / n_heads = {d_model / n_heads:g} is not an integer")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, n_heads, T, d_head). Each example keeps its own T."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, n_heads, T, d_head)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, n_heads, T, d_head) -> (B, T, d_model)."""
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model)

    def _project_qkv(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if query is key and key is value:
            # Self-attention: one matmul with the three weights stacked (the "fused" projection).
            w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (3 d_model, d_model)
            b = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            return F.linear(query, w, b).split(self.d_model, dim=-1)
        return self.q_proj(query), self.k_proj(key), self.v_proj(value)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value`` (both default to ``query``: self-attention).

        ``is_causal=True`` adds a causal mask (aligned to the bottom right when a
        cache holds earlier positions). ``cache`` enables incremental decoding.
        """
        key = query if key is None else key
        value = key if value is None else value
        check_tensor("query", query, ndim=3, floating=True, last_dim=self.d_model)
        check_tensor("key", key, ndim=3, floating=True, last_dim=self.d_model)
        check_tensor("value", value, ndim=3, floating=True, last_dim=self.d_model)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(f"query, key and value must share B and key/value must share T_k; got query "
                             f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}")
        B, T_q, _ = query.shape

        if cache is not None and cache.static and cache.k is not None:
            q, k, v = self.q_proj(query), None, None  # keys/values of the memory were computed once
        else:
            q, k, v = self._project_qkv(query, key, value)
        q = self.split_heads(q)  # (B, n_heads, T_q, d_head)
        T_past = 0 if cache is None or cache.static else len(cache)
        if k is not None:
            k, v = self.split_heads(k), self.split_heads(v)  # (B, n_heads, T_new, d_head)
            if self.rotary is not None:
                k = self.rotary(k, offset=T_past)
        if self.rotary is not None:
            q = self.rotary(q, offset=T_past)
        if cache is not None:
            if k is None:
                k, v = cache.k, cache.v
            else:
                if not cache.static and cache.k is not None:
                    k = torch.cat([cache.k, k], dim=2)  # (B, n_heads, T_past + T_new, d_head)
                    v = torch.cat([cache.v, v], dim=2)
                cache.k, cache.v = k, v
        T_k = k.shape[2]
        check_mask(mask, B, self.n_heads, T_q, T_k)

        dropout_p = self.dropout if self.training else 0.0
        if is_causal and T_q == 1:
            is_causal = False  # one new query at the end of the sequence may see every key
        if is_causal:
            if T_q == T_k and mask is None and not need_weights:
                out = _fused_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
                return self.out_proj(self.merge_heads(out))
            causal = causal_mask(T_q, T_k, device=q.device)
            mask = causal if mask is None else mask & causal

        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=dropout_p)
            return self.out_proj(self.merge_heads(out)), weights
        out = _fused_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        if mask is not None:
            # Fused kernels differ on fully masked rows (NaN or mean of v); make them zeros like the explicit path.
            out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return self.out_proj(self.merge_heads(out))
