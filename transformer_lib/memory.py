"""Where a model's training memory goes, measured from the tensors.

Training keeps the parameters, their gradients and the optimizer's state (:func:`state_bytes`,
:func:`adamw_bytes_per_parameter`), and the activations autograd saves for the backward pass
(:func:`saved_activation_bytes`); inference keeps the KV caches (:func:`cache_bytes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ._validate import _validate_int


def _storage_key(t: Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def tensor_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind the iterable ``tensors`` (a view or a tied weight counted once).

    Defined in chapter 8, Training at scale.
    """
    seen: dict[tuple[int, int], int] = {}
    for t in tensors:
        if isinstance(t, Tensor) and t.numel():
            key = _storage_key(t)
            seen[key] = key[1]
    return sum(seen.values())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """``{"parameters", "gradients", "optimizer", "total"}``: bytes of the parameters, of the gradients that
    exist now, and of the optimizer's state (AdamW's moments exist after its first step).

    Defined in chapter 8, Training at scale.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    params = list(model.parameters())
    sizes = {
        "parameters": tensor_bytes(params),
        "gradients": tensor_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        sizes["optimizer"] = tensor_bytes(
            v for state in optimizer.state.values() for v in state.values() if isinstance(v, Tensor) and v.dim() > 0
        )
    sizes["total"] = sum(sizes.values())
    return sizes


def adamw_bytes_per_parameter(param_bytes: int = 4, grad_bytes: int | None = None, moment_bytes: int = 4) -> int:
    """Bytes of training state per parameter with AdamW: the weight, its gradient and two moments.

    In fp32, 4 + 4 + 2 x 4 = 16 bytes. Mixed-precision recipes that keep a 16-bit copy of the
    weights next to the fp32 master weights add 2 (Rajbhandari et al.'s ZeRO counts 2 + 2 + 12).

    Defined in chapter 8, Training at scale.
    """
    for name, value in (("param_bytes", param_bytes), ("moment_bytes", moment_bytes)):
        _validate_int(name, value, 1)
    grad_bytes = param_bytes if grad_bytes is None else _validate_int("grad_bytes", grad_bytes, 1)
    return param_bytes + grad_bytes + 2 * moment_bytes


def saved_activation_bytes(fn: Callable[[], Tensor]) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``fn()`` (a loss, not differentiated
    here) runs: distinct storages, parameters and views of them (a transposed weight) excluded.

    Defined in chapter 8, Training at scale.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function computing a loss, got {type(fn).__name__}")
    saved: list[Tensor] = []

    def pack(t: Tensor) -> Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    weights = {_storage_key(t) for t in saved if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter)}
    return tensor_bytes(t for t in saved if _storage_key(t) not in weights)


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, d_head: int, bytes_per_number: int = 4) -> int:
    """Bytes a KV cache takes per token, ``2 * n_layers * n_kv_heads * d_head * bytes_per_number``: a key and a
    value of ``n_kv_heads * d_head`` numbers in every layer.

    Defined in chapter 9, Inference and deployment.
    """
    sizes = {"n_layers": n_layers, "n_kv_heads": n_kv_heads, "d_head": d_head, "bytes_per_number": bytes_per_number}
    for name, value in sizes.items():
        _validate_int(name, value, 1)
    return 2 * n_layers * n_kv_heads * d_head * bytes_per_number


def cache_bytes(caches: Any) -> int:
    """Bytes of the keys and values in a list of :class:`~transformer_lib.attention.KVCache`.

    Defined in chapter 9, Inference and deployment.
    """
    return sum(t.numel() * t.element_size() for cache in caches for t in (cache.k, cache.v) if t is not None)
