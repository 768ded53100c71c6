"""Scaled dot-product attention and multi-head attention (chapters 1 and 3).

The explicit :func:`scaled_dot_product_attention` is the textbook ``softmax(q k^T / sqrt(d_k)) v``;
:class:`MultiHeadAttention` uses it when asked for the weights, and PyTorch's fused kernel otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import _validate_int, _validate_mask, _validate_real, _validate_tensor
from .masks import causal_mask
from .precision import fused_attention


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Explicit attention: ``weights = softmax(q k^T * scale + bias)``, ``out = weights v``.

    ``scale`` defaults to ``1 / sqrt(d_k)``; ``mask`` is boolean, True = may attend; ``bias`` is an additive
    float bias on the scores (e.g. ALiBi's). A query whose keys are all masked gets zero weights and a zero
    output (never NaN). ``dropout_p`` drops attention weights (use 0 at evaluation time).

    Shapes:
        q: (..., T_q, d_k), k: (..., T_k, d_k), v: (..., T_k, d_v),
        mask, bias: broadcastable to (..., T_q, T_k)
        -> out (..., T_q, d_v), weights (..., T_q, T_k)

    Defined in chapter 1, Attention.
    """
    _validate_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T_q, T_k)
    if bias is not None:
        _validate_tensor("bias", bias, floating=True)
        scores = scores + bias.to(scores.dtype)  # (..., T_q, T_k), broadcast
    if mask is not None:
        _validate_mask(mask, scores.shape, names="the scores' shape (..., T_q, T_k)")
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        # A row with every key masked is softmax(-inf, ..., -inf) = NaN: define it as zeros.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def _validate_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _validate_tensor(name, t, floating=True)
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., T, d), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the last dimension d_k, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length T_k, got k {tuple(k.shape)} and v {tuple(v.shape)}")


@dataclass
class KVCache:
    """Keys and values of earlier positions, for incremental decoding: self-attention (``static=False``)
    appends each call's new positions; cross-attention (``static=True``) keeps the memory's, projected once.

    Shapes: k, v (B, n_kv_heads, T_cache, d_head).
    """

    k: Tensor | None = None
    v: Tensor | None = None
    static: bool = False

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys and values (append them, for self-attention); return all of them.
        A filled static cache keeps the keys and values it holds."""
        if self.k is not None and self.v is not None:
            if self.static:
                return self.k, self.v
            k = torch.cat([self.k, k], dim=2)  # (B, n_kv_heads, T_past + T_new, d_head)
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Grouped-query attention: repeat each key/value head for the ``n_rep`` query heads that share it
    (query head h reads key/value head ``h // n_rep``).

    Shapes: x (B, n_kv_heads, T, d_head) -> (B, n_kv_heads * n_rep, T, d_head).
    """
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _cast_once_for_autocast(*xs: Tensor) -> tuple[Tensor, ...]:
    """``xs`` in autocast's dtype when autocast is on, each distinct tensor cast once: autocast casts the
    input of every product anew, so self-attention's q, k and v products would each keep a copy of x for
    the backward pass. Unchanged outside autocast."""
    device = xs[0].device.type
    if not torch.amp.is_autocast_available(device) or not torch.is_autocast_enabled(device):
        return xs
    dtype, casts = torch.get_autocast_dtype(device), dict[int, Tensor]()  # id(x) -> x in dtype
    return tuple(casts.setdefault(id(x), x.to(dtype)) for x in xs)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: q/k/v projections, ``n_heads`` heads of ``d_head = d_model // n_heads``, an
    output projection. ``need_weights=True`` runs the explicit path and also returns the per-head weights;
    otherwise ``F.scaled_dot_product_attention`` runs. ``rotary`` (a
    :class:`~transformer_lib.positional.RotaryEmbedding`) rotates q and k; ``alibi`` (an
    :class:`~transformer_lib.positional.ALiBi`) biases the scores, causal self-attention only.
    ``n_kv_heads < n_heads`` gives grouped-query attention (1: multi-query).

    Masks: ``mask`` broadcasts to (B, n_heads, T_q, T_k) by PyTorch's rules, so a 2-D mask is always
    (T_q, T_k); a per-example padding mask (B, T_k) goes in ``key_padding_mask`` (True = a real key).

    Shapes:
        query (B, T_q, d_model), key/value (B, T_k, d_model),
        mask broadcastable to (B, n_heads, T_q, T_k), key_padding_mask (B, T_k)
        -> out (B, T_q, d_model) [, weights (B, n_heads, T_q, T_k)]

    Defined in chapter 3, Multi-head attention.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: nn.Module | None = None,
        n_kv_heads: int | None = None,
        alibi: nn.Module | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
            _validate_int(name, value)
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be divisible by n_heads ({n_heads}); "
                f"d_model / n_heads = {d_model / n_heads:g} is not an integer"
            )
        _validate_real("dropout", dropout, "a probability in [0, 1)", lambda p: 0.0 <= p < 1.0)
        if n_heads % n_kv_heads != 0:
            raise ValueError(
                f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}): "
                f"each key/value head serves the same number of query heads"
            )
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        d_kv = n_kv_heads * self.d_head
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_kv, bias=bias)
        self.v_proj = nn.Linear(d_model, d_kv, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary
        self.alibi = alibi

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, n * d_head) -> (B, n, T, d_head), n = n_heads for queries, n_kv_heads for keys/values."""
        B, T, _ = x.shape
        return x.view(B, T, -1, self.d_head).transpose(1, 2)  # (B, n, T, d_head)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, n_heads, T, d_head) -> (B, T, d_model)."""
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, d_model)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value`` (both default to ``query``: self-attention).

        ``is_causal=True`` adds a causal mask (aligned to the bottom right when a cache holds earlier
        positions); ``cache`` enables incremental decoding; ``positions`` (B, T_q) or (T_q,) gives RoPE each
        new token's absolute position (default: contiguous, after the cached ones).
        """
        key = query if key is None else key
        value = key if value is None else value
        self._validate_inputs(query, key, value)
        query, key, value = _cast_once_for_autocast(query, key, value)
        T_past = 0 if cache is None or cache.static else len(cache)
        q = self.split_heads(self.q_proj(query))  # (B, n_heads, T_q, d_head)
        k, v = self._keys_values(key, value, cache, T_past, positions)  # (B, n_kv_heads, T_k, d_head)
        if self.rotary is not None:
            q = self.rotary(q, offset=T_past, positions=positions)
        mask = self._combine_masks(mask, key_padding_mask, query.shape[0], q.shape[2], k.shape[2])
        bias = None
        if self.alibi is not None:
            if not is_causal:
                raise ValueError("ALiBi biases causal self-attention: call with is_causal=True")
            bias = self.alibi(q.shape[2], k.shape[2], offset=T_past)  # (n_heads, T_q, T_k)
        n_rep = self.n_heads // self.n_kv_heads
        out, weights = self._attend(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, is_causal, need_weights, bias)
        out = self.out_proj(self.merge_heads(out))  # (B, T_q, d_model)
        return out if weights is None else (out, weights)

    def _keys_values(
        self, key: Tensor, value: Tensor, cache: KVCache | None, T_past: int, positions: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """The keys (rotated) and values to attend to, the cached ones included.

        Shapes: key, value (B, T, d_model) -> k, v (B, n_kv_heads, T_k, d_head).
        """
        if cache is not None and cache.static and cache.k is not None and cache.v is not None:
            return cache.k, cache.v  # the memory's keys and values were projected once
        k, v = self.split_heads(self.k_proj(key)), self.split_heads(self.v_proj(value))
        if self.rotary is not None:
            k = self.rotary(k, offset=T_past, positions=positions)
        return (k, v) if cache is None else cache.update(k, v)

    def _validate_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, t in (("query", query), ("key", key), ("value", value)):
            _validate_tensor(name, t, ndim=3, floating=True, last_dim=self.d_model)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"query, key and value must share B and key/value must share T_k; got query "
                f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
            )

    def _combine_masks(
        self, mask: Tensor | None, key_padding_mask: Tensor | None, B: int, T_q: int, T_k: int
    ) -> Tensor | None:
        """Check ``mask`` against (B, n_heads, T_q, T_k) and ``key_padding_mask`` against (B, T_k); AND them."""
        if isinstance(mask, Tensor) and mask.dim() == 2 and tuple(mask.shape) == (B, T_k) and B not in (1, T_q):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} = (B, T_k): a 2-D mask means (T_q, T_k) = {(T_q, T_k)}, "
                "the same for every example; pass a per-example padding mask as key_padding_mask= (True = a real key)"
            )
        _validate_mask(mask, (B, self.n_heads, T_q, T_k))
        if key_padding_mask is None:
            return mask
        _validate_mask(key_padding_mask)
        if tuple(key_padding_mask.shape) != (B, T_k):
            raise ValueError(
                f"key_padding_mask must have shape (B, T_k) = {(B, T_k)} (True = a real key), "
                f"got {tuple(key_padding_mask.shape)}"
            )
        keys = key_padding_mask[:, None, None, :]  # (B, 1, 1, T_k)
        return keys if mask is None else mask & keys

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        need_weights: bool,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """softmax(q k^T / sqrt(d_head) + bias) v in every head, explicit (with weights) or fused.

        Shapes: q (B, n_heads, T_q, d_head), k/v (B, n_heads, T_k, d_head), bias (n_heads, T_q, T_k)
            -> out (B, n_heads, T_q, d_head), weights (B, n_heads, T_q, T_k) or None
        """
        dropout_p = self.dropout if self.training else 0.0
        T_q, T_k = q.shape[2], k.shape[2]
        if is_causal and T_q == T_k and mask is None and bias is None and not need_weights:
            return fused_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None  # the fast causal kernel
        if is_causal and T_q > 1:  # one new query at the end of the sequence may see every key
            causal = causal_mask(T_q, T_k, device=q.device)
            mask = causal if mask is None else mask & causal
        if need_weights:
            return scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=dropout_p, bias=bias)
        attn_mask = mask
        if bias is not None:  # one additive float mask: the bias, and -inf where the boolean mask says no
            attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        out = fused_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        if mask is not None:
            # Fused kernels differ on fully masked rows (NaN or mean of v); make them zeros like the explicit path.
            out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return out, None
