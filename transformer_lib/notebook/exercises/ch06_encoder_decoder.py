"""Chapter 6, encoder-decoder: ``check_shift_right``, ``check_decoder_layer`` and ``check_label_smoothing``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...layers import DecoderLayer
from ...masks import padding_mask
from ._framework import Bug, Checker, checker

__all__ = ["check_shift_right", "check_decoder_layer", "check_label_smoothing"]


@checker
def check_shift_right(c: Checker, shift_right: Callable[[Tensor], tuple[Tensor, Tensor]]) -> None:
    """Check ``shift_right(tgt) -> (decoder_input, labels)`` for teacher forcing.

    ``tgt`` holds ``<bos>`` (1), the target tokens, ``<eos>`` (2) and padding (0). The decoder
    reads ``tgt[:, :-1]`` and is trained to predict ``tgt[:, 1:]``.

    Shapes: tgt (B, T + 1) -> decoder_input (B, T), labels (B, T).
    """
    cases = (
        ("one target, <bos> a b c <eos>", torch.tensor([[1, 5, 6, 7, 2]])),
        ("a padded batch of two", torch.tensor([[1, 5, 6, 7, 8, 2], [1, 9, 10, 2, 0, 0]])),
        ("a batch of three, one of them empty (<bos> <eos>)", torch.tensor([[1, 4, 2, 0], [1, 2, 0, 0], [1, 7, 7, 2]])),
    )
    for name, tgt in cases:
        bos = torch.full_like(tgt[:, :1], 1)
        bugs = (
            Bug(
                lambda tgt=tgt: (tgt, tgt),
                "no shift: the decoder would read the very token it has to predict and learn to copy it. "
                "Feed tgt[:, :-1] and predict tgt[:, 1:].",
            ),
            Bug(
                lambda tgt=tgt: (tgt[:, 1:], tgt[:, :-1]),
                "shifted the wrong way: the decoder input must start with <bos> (tgt[:, :-1]) and the labels "
                "are the same sequence one step ahead (tgt[:, 1:]).",
            ),
            Bug(
                lambda tgt=tgt, bos=bos: (torch.cat([bos, tgt[:, :-1]], dim=1), tgt),
                "the labels start with <bos>: you prepended another <bos> to a target that already has one, so "
                "the model is trained to predict <bos> first. The targets here already start with <bos>: "
                "just drop the last token for the input and the first for the labels.",
            ),
            Bug(
                lambda tgt=tgt: (tgt[:, :-1], tgt[:, :-1]),
                "the labels equal the decoder input: position t must predict the NEXT token, tgt[:, 1:].",
            ),
            Bug(
                lambda tgt=tgt: (tgt[:, :-2], tgt[:, 1:-1]),
                "you dropped a token too many: the labels must keep the last column, with <eos>, "
                "or the model never learns when to stop.",
            ),
        )
        c.case(
            name,
            lambda tgt: shift_right(tgt),
            (tgt[:, :-1], tgt[:, 1:]),
            bugs=bugs,
            hint="return tgt[:, :-1], tgt[:, 1:].",
            inputs={"tgt": tgt},
        )


def _decoder_variant(
    layer: Any,
    x: Tensor,
    memory: Tensor,
    memory_mask: Tensor | None,
    causal: bool = True,
    self_on_memory: bool = False,
    cross_on_x: bool = False,
    norm_first: bool | None = None,
    use_memory_mask: bool = True,
) -> Tensor:
    """A decoder layer computed from ``layer``'s parts, optionally with one of the classic mistakes."""
    norm_first = layer.norm_first if norm_first is None else norm_first
    mask = memory_mask if use_memory_mask else None

    def self_attend(h: Tensor) -> Tensor:
        if self_on_memory:
            return layer.self_attn(h, memory, memory, mask=mask)
        return layer.self_attn(h, h, h, is_causal=causal)

    def cross_attend(h: Tensor) -> Tensor:
        if cross_on_x:
            return layer.cross_attn(h, h, h)
        return layer.cross_attn(h, memory, memory, mask=mask)

    for sublayer, norm in ((self_attend, layer.norm1), (cross_attend, layer.norm2), (layer.ff, layer.norm3)):
        x = x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))
    return x


@checker
def check_decoder_layer(c: Checker, decoder_layer: Callable[..., Tensor]) -> None:
    """Check ``decoder_layer(layer, x, memory, memory_mask)``, a decoder layer's forward pass by hand.

    ``layer`` is a :class:`~transformer_lib.layers.DecoderLayer` (no dropout); the answer must use its
    parts (``self_attn``, ``cross_attn``, ``ff``, ``norm1..3``), honour ``layer.norm_first`` and equal
    ``layer(x, memory, memory_mask=memory_mask, tgt_is_causal=True)``. A leak check changes the last
    target position and requires every earlier output to stay the same.

    Shapes: x (B, T, d_model), memory (B, S, d_model), memory_mask (B, 1, 1, S) or None -> (B, T, d_model).
    """
    torch.manual_seed(6)  # @checker restores the reader's random state afterwards
    cases = (
        ("Post-LN, B=2, T=5 target positions, S=7 source positions", False, False),
        ("Post-LN, the second source padded (memory_mask)", False, True),
        ("Pre-LN (layer.norm_first=True), with padding", True, True),
    )
    for name, norm_first, padded in cases:
        layer = DecoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
        x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
        memory_mask = padding_mask(torch.tensor([[3] * 7, [3] * 4 + [0] * 3]), 0) if padded else None
        with torch.no_grad():
            expected = layer(x, memory, memory_mask=memory_mask, tgt_is_causal=True)
            args = (layer, x, memory, memory_mask)
            bugs = [
                Bug(
                    lambda a=args: _decoder_variant(*a, causal=False),
                    "the self-attention is not causal: position t sees the target tokens after it, which at "
                    "generation time do not exist yet. Pass is_causal=True (or a causal mask).",
                ),
                Bug(
                    lambda a=args: _decoder_variant(*a, self_on_memory=True),
                    "the first attention reads the encoder output: self-attention takes its keys and values "
                    "from x (the target so far); only cross-attention reads memory.",
                ),
                Bug(
                    lambda a=args: _decoder_variant(*a, cross_on_x=True),
                    "cross-attention attends to x: its queries come from x, but its keys and values come "
                    "from the encoder output, memory.",
                ),
                Bug(
                    lambda a=args, nf=norm_first: _decoder_variant(*a, norm_first=not nf),
                    f"you wrote {'Post-LN' if norm_first else 'Pre-LN'}, but this layer has "
                    f"norm_first={norm_first}: Post-LN is x = norm(x + f(x)), Pre-LN x = x + f(norm(x)).",
                ),
            ]
            if padded:
                bugs.append(
                    Bug(
                        lambda a=args: _decoder_variant(*a, use_memory_mask=False),
                        "cross-attention ignores memory_mask, so the target attends to the source's "
                        "padding: pass mask=memory_mask to layer.cross_attn.",
                    )
                )
            c.case(
                name,
                lambda layer, x, memory, memory_mask: decoder_layer(layer, x, memory, memory_mask),
                expected,
                bugs=tuple(bugs),
                hint="three residual blocks in order: causal self-attention on x, cross-attention from x to "
                "memory (with memory_mask), the feed-forward network; each with its norm, placed as "
                "layer.norm_first says.",
                atol=1e-4,
                inputs={"layer": layer, "x": x, "memory": memory, "memory_mask": memory_mask},
            )
    layer = DecoderLayer(16, 4, 32, dropout=0.0).eval()
    x, memory = torch.randn(2, 6, 16), torch.randn(2, 7, 16)
    changed = x.clone()
    changed[:, -1] = torch.randn(2, 16) * 3  # a different last target token
    with torch.no_grad():
        expected = layer(x, memory, tgt_is_causal=True)[:, :-1]
        c.case(
            "leak check: changing the last target position leaves the earlier outputs unchanged",
            lambda layer, x, memory, memory_mask: decoder_layer(layer, x, memory, memory_mask)[:, :-1],
            expected,
            hint="an earlier position's output changed when a later target token changed: the decoder can see "
            "the future. Use a causal mask in the self-attention.",
            atol=1e-4,
            inputs={"layer": layer, "x": changed, "memory": memory, "memory_mask": None},
        )


@checker
def check_label_smoothing(c: Checker, smooth: Callable[[Tensor, int, float], Tensor]) -> None:
    """Check ``smooth(targets, vocab_size, eps) -> (N, vocab_size)``, the label-smoothed target distribution.

    As in ``F.cross_entropy(..., label_smoothing=eps)`` (Szegedy et al. 2016): ``(1 - eps)`` on the true
    class plus ``eps / vocab_size`` on every class, so each row sums to 1.

    Shapes: targets (N,) class ids -> (N, vocab_size).
    """
    for targets, V, eps in (
        (torch.tensor([0, 3]), 5, 0.1),
        (torch.tensor([2, 2, 7, 11]), 12, 0.2),
        (torch.tensor([1, 4]), 6, 0.0),
    ):
        one_hot = F.one_hot(targets, V).float()
        name = f"{len(targets)} targets, vocab_size={V}, eps={eps}" + (" (no smoothing: one-hot)" if eps == 0 else "")
        c.case(
            name,
            lambda targets, vocab_size, eps: smooth(targets, vocab_size, eps),
            (1 - eps) * one_hot + eps / V,
            bugs=(
                Bug(
                    lambda o=one_hot, V=V, eps=eps: o + eps / V,
                    "the rows sum to more than 1: take eps away from the true class, (1 - eps) * one_hot.",
                ),
                Bug(
                    lambda o=one_hot, eps=eps: (1 - eps) * o,
                    "the rows sum to less than 1: spread the eps you took away evenly, + eps / vocab_size.",
                ),
                Bug(
                    lambda o=one_hot, V=V, eps=eps: (1 - eps) * o + eps / (V - 1) * (1 - o),
                    "you spread eps over the other vocab_size - 1 classes; PyTorch's label_smoothing (and "
                    "Szegedy et al.) spread it over all vocab_size classes, the true one included.",
                ),
                Bug(
                    lambda o=one_hot, V=V, eps=eps: eps * o + (1 - eps) / V,
                    "eps and 1 - eps are swapped: the true class keeps most of the mass, 1 - eps.",
                ),
            ),
            hint="(1 - eps) * F.one_hot(targets, vocab_size) + eps / vocab_size, as a float tensor.",
            inputs={"targets": targets, "vocab_size": V, "eps": eps},
        )
