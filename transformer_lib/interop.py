"""Copy weights from PyTorch's built-in Transformer modules into this library's.

Used by the tests (our modules equal PyTorch's after the copy) and by chapters 2, 3 and 6. Note the
opposite mask conventions: PyTorch's ``nn.MultiheadAttention`` takes ``True`` = *blocked*; this
library takes ``True`` = may attend.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .attention import MultiHeadAttention
from .layers import DecoderLayer, EncoderLayer

# Our layer type -> PyTorch's, and the submodules it adds to the ones every layer shares (ours -> theirs).
_LAYERS: dict[type[nn.Module], tuple[type[nn.Module], dict[str, str]]] = {
    EncoderLayer: (nn.TransformerEncoderLayer, {}),
    DecoderLayer: (nn.TransformerDecoderLayer, {"cross_attn": "multihead_attn", "norm3": "norm3"}),
}
_SHARED = {name: name for name in ("self_attn", "norm1", "norm2")} | {"ff.linear1": "linear1", "ff.linear2": "linear2"}


@torch.no_grad()
def copy_from_torch(ours: nn.Module, theirs: nn.Module) -> nn.Module:
    """Load ``theirs`` (nn.MultiheadAttention / TransformerEncoderLayer / TransformerDecoderLayer) into ``ours``.

    Returns ``ours``. Raises ``TypeError`` for a pair it does not know and ``ValueError`` when
    the sizes differ or the two would compute different things: PyTorch's module must be
    ``batch_first=True`` (this library is batch-first) and, for layers, have the same
    ``norm_first``, activation and norm eps.

    Defined in chapter 2, Masking.
    """
    if isinstance(ours, MultiHeadAttention) and isinstance(theirs, nn.MultiheadAttention):
        return _copy_attention(ours, theirs)
    for our_type, (their_type, names) in _LAYERS.items():
        if isinstance(ours, our_type) and isinstance(theirs, their_type):
            _validate_same_layer(ours, theirs)
            for our_name, their_name in (names | _SHARED).items():
                sub, their_sub = ours.get_submodule(our_name), theirs.get_submodule(their_name)
                if isinstance(sub, MultiHeadAttention):
                    copy_from_torch(sub, their_sub)
                else:  # norms and linears: the same parameter names
                    sub.load_state_dict(their_sub.state_dict())
            return ours
    raise TypeError(f"don't know how to copy {type(theirs).__name__} into {type(ours).__name__}")


def _copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> MultiHeadAttention:
    if not theirs.batch_first:
        raise ValueError(
            "theirs has batch_first=False (T, B, d_model); this library is batch-first: "
            "construct nn.MultiheadAttention(..., batch_first=True)"
        )
    if ours.n_kv_heads != ours.n_heads:
        raise ValueError(
            f"ours uses grouped-query attention (n_kv_heads={ours.n_kv_heads}); "
            f"nn.MultiheadAttention has one key/value head per query head"
        )
    if theirs.embed_dim != ours.d_model or theirs.num_heads != ours.n_heads:
        raise ValueError(
            f"size mismatch: ours d_model={ours.d_model}, n_heads={ours.n_heads}; "
            f"theirs embed_dim={theirs.embed_dim}, num_heads={theirs.num_heads}"
        )
    projections = (ours.q_proj, ours.k_proj, ours.v_proj)
    for proj, w in zip(projections, theirs.in_proj_weight.chunk(3), strict=True):
        proj.weight.copy_(w)
    if theirs.in_proj_bias is not None:
        for proj, b in zip(projections, theirs.in_proj_bias.chunk(3), strict=True):
            proj.bias.copy_(b)
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())
    return ours


def _validate_same_layer(ours: Any, theirs: Any) -> None:
    """Refuse to copy between layers that would compute different things with the same weights."""
    their_activation = getattr(theirs.activation, "__name__", type(theirs.activation).__name__).lower()
    differences = {
        "norm_first": (ours.norm_first, theirs.norm_first),
        "activation": (ours.ff.activation, their_activation),
        "norm eps": (ours.norm1.eps, theirs.norm1.eps),
    }
    problems = [
        f"{name}: ours {mine!r}, theirs {other!r}" for name, (mine, other) in differences.items() if mine != other
    ]
    if problems:
        raise ValueError(f"{type(ours).__name__} and {type(theirs).__name__} differ: " + "; ".join(problems))
