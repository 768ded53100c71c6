"""Feed-forward network, encoder layer and decoder layer (chapters 5 and 6).

Each sublayer has a residual connection and a norm: Post-LN (``norm_first=False``) ``norm(x + f(x))``,
Pre-LN (``norm_first=True``) ``x + f(norm(x))``. Parameter names follow ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer``, so weights copy one to one (:mod:`transformer_lib.interop`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import KVCache, MultiHeadAttention
from .norms import make_norm

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")


class FeedForward(nn.Module):
    """Position-wise feed-forward network: ``linear2(dropout(act(linear1(x))))``.

    With ``activation="swiglu"`` ``linear1`` gives a gate and a value, and the hidden is ``silu(gate) * value``.

    Shapes: x (B, T, d_model) -> (B, T, d_model).

    Defined in chapter 6, Encoder-decoder.
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, 2 * d_ff if activation == "swiglu" else d_ff, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        h = activate(self.linear1(x), self.activation)  # (B, T, d_ff)
        return self.linear2(self.dropout(h))


def activate(h: Tensor, activation: str) -> Tensor:
    """The feed-forward network's nonlinearity on ``linear1``'s output; for SwiGLU, ``h`` holds the gate
    and the value halves, and the result is ``silu(gate) * value``.

    Shapes: h (..., d_ff), or (..., 2 d_ff) for SwiGLU -> (..., d_ff).
    """
    if activation == "swiglu":
        gate, value = h.chunk(2, dim=-1)  # (..., d_ff) each
        return F.silu(gate) * value
    if activation == "gelu":
        return F.gelu(h)
    if activation == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    return F.relu(h)


def _residual(
    x: Tensor, sublayer: Callable[[Tensor], Tensor], norm: nn.Module, dropout: nn.Module, norm_first: bool
) -> Tensor:
    """One residual block: Pre-LN ``x + drop(f(norm(x)))`` or Post-LN ``norm(x + drop(f(x)))``."""
    if norm_first:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each with a residual connection and a norm.

    ``forward(x, mask)`` returns ``x``, or ``(x, weights)`` with ``need_weights=True``. Causal (``is_causal=True``,
    optionally with a ``cache``) it is a GPT block (:class:`DecoderOnlyLayer`). ``rotary``, ``alibi`` and
    ``n_kv_heads`` go to the :class:`~transformer_lib.attention.MultiHeadAttention`.

    Shapes: x (B, T, d_model), mask broadcastable to (B, n_heads, T, T)
        -> (B, T, d_model) [, weights (B, n_heads, T, T)]

    Defined in chapter 2, Masking.
    """

    causal = False  # what forward's is_causal=None means

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        norm: str = "layernorm",
        eps: float | None = None,
        bias: bool = True,
        rotary: nn.Module | None = None,
        fused_norms: bool = False,
        n_kv_heads: int | None = None,
        alibi: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=dropout, bias=bias, rotary=rotary, n_kv_heads=n_kv_heads, alibi=alibi
        )
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.norm1 = make_norm(norm, d_model, eps, bias, fused_norms)
        self.norm2 = make_norm(norm, d_model, eps, bias, fused_norms)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``mask`` broadcastable to (B, n_heads, T, T) (a 2-D mask is (T, T)); ``key_padding_mask`` (B, T),
        True = token. ``is_causal`` defaults to the class's ``causal`` (True for :class:`DecoderOnlyLayer`)."""
        weights: list[Tensor] = []
        attend = functools.partial(
            self.self_attn,
            mask=mask,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            is_causal=self.causal if is_causal is None else is_causal,
            cache=cache,
            positions=positions,
        )
        x = _residual(x, _keeping(attend, weights), self.norm1, self.dropout1, self.norm_first)
        x = _residual(x, self.ff, self.norm2, self.dropout2, self.norm_first)
        return (x, weights[0]) if need_weights else x


class DecoderOnlyLayer(EncoderLayer):
    """A GPT block: an encoder layer whose self-attention is causal by default (no cross-attention).

    Shapes: x (B, T, d_model) -> (B, T, d_model) [, weights (B, n_heads, T, T_k)]

    Defined in chapter 5, Norms and residuals.
    """

    causal = True


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder memory, then feed-forward.

    ``need_weights=True`` returns ``(x, self_weights, cross_weights)``; ``self_cache``/``cross_cache`` enable
    incremental decoding.

    Shapes: x (B, T, d_model), memory (B, S, d_model),
        tgt_mask broadcastable to (B, n_heads, T, T), memory_mask to (B, n_heads, T, S)
        -> (B, T, d_model) [, (B, n_heads, T, T), (B, n_heads, T, S)]

    Defined in chapter 6, Encoder-decoder.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        norm: str = "layernorm",
        eps: float | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout, bias=bias)
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout, bias=bias)
        self.norm1 = make_norm(norm, d_model, eps, bias)
        self.norm2 = make_norm(norm, d_model, eps, bias)
        self.norm3 = make_norm(norm, d_model, eps, bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        tgt_is_causal: bool = False,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        tgt_key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """Key-padding masks (B, T) and (B, S), True = token, hide each example's padding."""
        weights: list[Tensor] = []
        self_attend = functools.partial(
            self.self_attn,
            mask=tgt_mask,
            key_padding_mask=tgt_key_padding_mask,
            need_weights=need_weights,
            is_causal=tgt_is_causal,
            cache=self_cache,
        )
        cross_attend = functools.partial(
            self.cross_attn,
            key=memory,
            mask=memory_mask,
            key_padding_mask=memory_key_padding_mask,
            need_weights=need_weights,
            cache=cross_cache,
        )
        x = _residual(x, _keeping(self_attend, weights), self.norm1, self.dropout1, self.norm_first)
        x = _residual(x, _keeping(cross_attend, weights), self.norm2, self.dropout2, self.norm_first)
        x = _residual(x, self.ff, self.norm3, self.dropout3, self.norm_first)
        return (x, weights[0], weights[1]) if need_weights else x


def _keeping(attention: Callable[[Tensor], Any], weights: list[Tensor]) -> Callable[[Tensor], Tensor]:
    """``attention`` as a sublayer ``h -> out`` that appends its weights, when it returns them, to ``weights``."""

    def sublayer(h: Tensor) -> Tensor:
        out = attention(h)
        if isinstance(out, tuple):
            out, w = out
            weights.append(w)
        return out

    return sublayer


def run_layers(
    layers: Iterable[nn.Module],
    x: Tensor,
    need_weights: bool = False,
    per_layer: Mapping[str, Sequence[object]] | None = None,
    checkpointed: bool = False,
    **kwargs: Any,
) -> tuple[Tensor, list]:
    """Run ``x`` through a stack of layers; return the output and, with ``need_weights``, each layer's weights.

    ``kwargs`` go to every layer; ``per_layer`` maps an argument name to one value per layer (``{"cache":
    caches}``). A decoder layer contributes a tuple of weights. ``checkpointed=True`` runs each layer under
    ``torch.utils.checkpoint`` (non-reentrant).

    Shapes: x (B, T, d_model) -> (B, T, d_model), n_layers x weights (B, n_heads, T, T_k).
    """
    weights = []
    for i, layer in enumerate(layers):
        own: dict[str, Any] = {name: values[i] for name, values in (per_layer or {}).items()}
        run = functools.partial(checkpoint, layer, use_reentrant=False) if checkpointed else layer
        out = run(x, need_weights=need_weights, **kwargs, **own)
        if need_weights:
            x, *w = out
            weights.append(w[0] if len(w) == 1 else tuple(w))
        else:
            x = out
    return x, weights
