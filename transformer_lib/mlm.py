"""Masked-language-model inputs, as BERT pretrains an encoder (chapter 10, Encoder-only).

:func:`mask_tokens` picks the positions the model must reconstruct and corrupts them the way
Devlin et al. (2019) do: of the selected positions, 80% become ``[MASK]``, 10% a random token and
10% stay unchanged. The labels hold the original token at the selected positions and ``-100``
elsewhere, the ``ignore_index`` of ``torch.nn.functional.cross_entropy``, so the loss counts the
selected positions only.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from ._validate import _validate_int, _validate_real, _validate_token_ids

IGNORE_INDEX = -100
"""The label of a position the loss skips (``F.cross_entropy``'s default ``ignore_index``)."""


def mask_tokens(
    ids: Tensor,
    mask_id: int,
    vocab_size: int,
    p: float = 0.15,
    special_ids: Iterable[int] = (),
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masking recipe: select each position with probability ``p``; of those, 80% -> ``mask_id``,
    10% -> a random token, 10% unchanged.

    A position holding one of ``special_ids`` (``[CLS]``, ``[PAD]``...) is never selected, and random
    replacements are drawn uniformly from the ids that are neither special nor ``mask_id``. The random
    numbers come from ``generator`` on the CPU, in this order: one uniform number per position for the
    selection, one per position for the 80/10/10 choice, then one random id per position.

    Returns ``(inputs, labels)``: ``inputs`` is ``ids`` corrupted; ``labels`` is ``ids`` at the selected
    positions and :data:`IGNORE_INDEX` (-100) elsewhere.

    Shapes: ids (B, T) or (T,) integer -> inputs, labels of the same shape, torch.long, on ``ids``' device.

    Defined in chapter 10, Encoder-only.
    """
    ids, special = _validate_mask_arguments(ids, mask_id, vocab_size, special_ids, generator)
    p = _validate_real("p", p, "a probability in [0, 1]", lambda x: 0.0 <= x <= 1.0)
    n_ordinary = int(vocab_size) - len(special)  # the ids a random replacement may take: not special, not mask_id
    cpu_ids = ids.cpu()
    selected = torch.rand(ids.shape, generator=generator) < p  # (B, T)
    selected &= ~torch.isin(cpu_ids, special)  # specials are never predicted
    choice = torch.rand(ids.shape, generator=generator)  # < 0.8: [MASK]; < 0.9: random; else unchanged
    r = torch.randint(n_ordinary, ids.shape, generator=generator)  # the r-th ordinary id, for each position
    random_ids = r + torch.searchsorted(special - torch.arange(len(special)), r, right=True)
    inputs = torch.where(selected & (choice < 0.8), int(mask_id), cpu_ids)
    inputs = torch.where(selected & (choice >= 0.8) & (choice < 0.9), random_ids, inputs)
    labels = torch.where(selected, cpu_ids, IGNORE_INDEX)
    return inputs.to(ids.device), labels.to(ids.device)


def _validate_mask_arguments(
    ids: object, mask_id: int, vocab_size: int, special_ids: Iterable[int], generator: object
) -> tuple[Tensor, Tensor]:
    """:func:`mask_tokens`' arguments checked: ``ids`` as torch.long, and the sorted ids never selected nor
    drawn (``special_ids`` and ``mask_id``), leaving at least one ordinary id to draw."""
    vocab_size = _validate_int("vocab_size", vocab_size)
    mask_id = _validate_int("mask_id", mask_id, 0)
    if mask_id >= vocab_size:
        raise ValueError(f"mask_id must be < vocab_size={vocab_size}, got {mask_id}")
    if not isinstance(ids, Tensor):
        raise TypeError(f"ids must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.layout != torch.strided:
        raise TypeError(f"ids must be a dense tensor, got layout {ids.layout}")
    if ids.dim() not in (1, 2):
        raise ValueError(f"ids must have shape (B, T) or (T,), got shape {tuple(ids.shape)}")
    ids = _validate_token_ids("ids", ids if ids.dim() == 2 else ids[None], vocab_size).view(ids.shape)
    if isinstance(special_ids, str | bytes) or not isinstance(special_ids, Iterable):
        raise TypeError(f"special_ids must be an iterable of ints, got {type(special_ids).__name__}")
    if generator is not None and (not isinstance(generator, torch.Generator) or generator.device.type != "cpu"):
        raise TypeError(f"generator must be a CPU torch.Generator or None, got {generator!r}")
    special = torch.tensor(sorted({_validate_int("special_ids", s, 0) for s in special_ids} | {mask_id}))
    if int(special.max()) >= vocab_size:
        raise ValueError(f"special_ids must be < vocab_size={vocab_size}, got {special.tolist()}")
    if len(special) == vocab_size:
        raise ValueError("every id is special or mask_id: no id is left to draw a random replacement from")
    return ids, special
