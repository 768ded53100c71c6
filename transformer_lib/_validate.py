"""Input validation shared by the core modules: a clear ``TypeError``/``ValueError`` that names
what was expected and what was given, instead of a shape error from deep inside PyTorch.

Every public entry point validates its inputs once, at the boundary; the internals trust them.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._compat import assert_async

INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


def _validate_int(name: str, value: object, minimum: int = 1, allowed: str = "") -> int:
    """An integer (not a bool, not a float) >= minimum; numpy integers become ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        allowed = allowed or ("a positive int" if minimum == 1 else f"an int >= {minimum}")
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _validate_real(name: str, value: object, allowed: str, ok: Callable[[float], bool]) -> float:
    """A finite real number (not a bool) for which ``ok`` holds; ``allowed`` says which, for the message."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or not ok(float(value))
    ):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def _validate_tensor(
    name: str, x: object, ndim: int | tuple[int, ...] | None = None, floating: bool = False, last_dim: int | None = None
) -> Tensor:
    """Check that ``x`` is a tensor of the given rank, kind and last dimension; return it."""
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


def _validate_token_ids(name: str, idx: object, vocab_size: int, max_len: int | None = None) -> Tensor:
    """Token ids: an integer tensor (B, T) with 0 <= id < vocab_size and T <= max_len; returned as torch.long.

    Other integer dtypes (uint8, int16, int32, e.g. from a uint16 token file) are converted, so that
    ``nn.Embedding`` and the cross-entropy accept them.
    """
    idx = _validate_tensor(name, idx, ndim=2)
    if idx.dtype not in INTEGER_DTYPES:
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {idx.dtype}")
    if max_len is not None and idx.shape[1] > max_len:
        raise ValueError(f"{name} has length {idx.shape[1]}, longer than the model's context of {max_len} tokens")
    if idx.numel():
        _validate_token_range(name, idx, vocab_size)
    return idx.long()


# Device types whose values a check may read: on the CPU that costs nothing, while on a GPU every read
# (``int(t)``, ``if t.any():``) makes the host wait for all the work queued so far (a "host sync").
_HOST_DEVICES = ("cpu",)


def _reads_are_free(t: Tensor) -> bool:
    """True if a check may read ``t``'s values without making the host wait for a device."""
    return t.device.type in _HOST_DEVICES


def _validate_token_range(name: str, idx: Tensor, vocab_size: int) -> None:
    """:func:`_validate_token_values`; under torch.compile, run eagerly between the compiled graphs (it reads
    values). :mod:`._eager` is imported only while tracing, when ``torch._dynamo`` is loaded already."""
    if torch.compiler.is_compiling():
        from ._eager import eagerly

        eagerly(_validate_token_values, name, idx, vocab_size)
    else:
        _validate_token_values(name, idx, vocab_size)


def _validate_token_values(name: str, idx: Tensor, vocab_size: int) -> None:
    """0 <= every id < vocab_size, checked without a host sync on a GPU.

    Where values are free to read (the CPU) a bad id is a ValueError naming it. Elsewhere the check is
    queued on the device (:func:`._compat.assert_async`): no wait, but a bad id is a device-side assert.
    """
    if _reads_are_free(idx):
        lo, hi = (int(v) for v in torch.aminmax(idx))
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} contains token id {bad}, outside the vocabulary [0, {vocab_size})")
    else:
        assert_async(((idx >= 0) & (idx < vocab_size)).all(), f"{name}: a token id outside [0, {vocab_size})")


def _validate_token_id(i: Any, vocab_size: int) -> int:
    """One token id, for a tokenizer's decode: an integer in ``[0, vocab_size)`` (no negative indexing)."""
    try:
        i = operator.index(i)
    except TypeError:
        raise TypeError(f"token ids must be integers, got {i!r} ({type(i).__name__})") from None
    if not 0 <= i < vocab_size:
        raise ValueError(f"token id {i} is outside the vocabulary [0, {vocab_size})")
    return i


def _validate_mask(
    mask: object, shape: tuple[int, ...] | torch.Size | None = None, names: str = "(B, n_heads, T_q, T_k)"
) -> Tensor | None:
    """A boolean mask (True = may attend) that broadcasts to ``shape`` without adding axes; ``None`` passes.

    ``names`` spells ``shape`` for the error message, e.g. "(B, n_heads, T_q, T_k)".
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a boolean torch.Tensor (True = may attend), got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a boolean tensor of dtype torch.bool (True = may attend), got {mask.dtype}")
    if shape is not None:
        shape = tuple(shape)
        try:
            fits = mask.dim() <= len(shape) and torch.broadcast_shapes(mask.shape, shape) == shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"mask of shape {tuple(mask.shape)} cannot broadcast to {names} = {shape}")
    return mask


def _validate_attention_mask(attention_mask: object, B: int, T: int) -> Tensor:
    """A (B, T) padding mask, 1/True for real tokens and 0/False for padding; returned as bool."""
    m = _validate_tensor("attention_mask", attention_mask, ndim=2)
    if tuple(m.shape) != (B, T):
        raise ValueError(
            f"attention_mask must have shape (B, T) = {(B, T)} (1 = token, 0 = padding), got {tuple(m.shape)}"
        )
    if m.dtype != torch.bool:
        if m.is_floating_point() or not ((m == 0) | (m == 1)).all():
            raise ValueError("attention_mask must hold only 0 (padding) and 1 (token), or booleans")
        m = m.bool()
    return m


def _validate_left_padded(mask: Tensor) -> Tensor:
    """A boolean (B, T) padding mask whose every row is 0...0 1...1 with at least one 1 (left padding)."""
    empty = ~mask.any(dim=1)  # (B,) rows without a token
    right = (mask[:, :-1] & ~mask[:, 1:]).any(dim=1)  # (B,) rows with padding after a token
    bad = (empty | right).nonzero()  # one host sync, once per call
    if len(bad):
        row = int(bad[0])
        problem = "has no token (all 0)" if empty[row] else "has padding (0) after a token (1)"
        raise ValueError(
            f"attention_mask row {row} {problem}: generation continues each row from its last column, "
            "so the mask must be left padding, 0...0 then 1...1, with at least one 1"
        )
    return mask
