"""Input checks shared by the modules: clear errors instead of deep PyTorch shape errors."""

from __future__ import annotations

import torch
from torch import Tensor


def check_tensor(name: str, x: object, ndim: int | tuple[int, ...] | None = None,
                 floating: bool = False, last_dim: int | None = None) -> Tensor:
    """Raise a ``TypeError``/``ValueError`` naming what was expected and what was given."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.dim() not in allowed:
            want = " or ".join(str(n) for n in allowed)
            raise ValueError(f"{name} must have rank {want}, got rank {x.dim()} with shape {tuple(x.shape)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if last_dim is not None and x.shape[-1] != last_dim:
        raise ValueError(f"{name} must have last dimension {last_dim}, got shape {tuple(x.shape)}")
    return x


def check_token_ids(name: str, idx: object, vocab_size: int, max_len: int | None = None) -> Tensor:
    """Token ids: an integer tensor (B, T) with 0 <= id < vocab_size and T <= max_len."""
    idx = check_tensor(name, idx, ndim=2)
    if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {idx.dtype}")
    if max_len is not None and idx.shape[1] > max_len:
        raise ValueError(f"{name} has length {idx.shape[1]}, longer than the model's context of {max_len} tokens")
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size})")
    return idx
