"""int8 weights: symmetric per-channel quantization written by hand, and PyTorch's dynamic int8.

Weight-only int8 stores each row ``w`` of a weight (one output channel) as ``q = round(w / s)`` in
``[-127, 127]`` with one float scale ``s = max|w| / 127`` per row: a quarter of the bytes, each entry
off by at most ``s / 2``. :func:`quantize_weights` swaps a model's ``nn.Linear`` layers for
:class:`Int8Linear` (smaller, not faster); :func:`dynamic_int8` hands them to PyTorch's dynamic
quantization, which also quantizes the activations and multiplies in integers. A Linear whose weight
is tied to another module (a GPT's output head) stays as it is: an int8 copy would add bytes.
"""

from __future__ import annotations

import collections
import copy
import warnings
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import _validate_tensor

#: The largest int8 magnitude used: the range is symmetric, [-127, 127], so -128 is never produced.
QMAX = 127


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization with one scale per output channel (row).

    ``scale = max|w_row| / 127`` and ``q = round(w / scale)``, so ``|w - q * scale| <= scale / 2``. An
    all-zero row gets scale 0 and q 0. The scales are float32 whatever the weight's dtype.

    Shapes: weight (out_features, in_features) -> q (out_features, in_features) int8, scale (out_features,).

    Defined in chapter 9, Inference and deployment.
    """
    _validate_tensor("weight", weight, ndim=2, floating=True)
    w = weight.detach().float()
    if not torch.isfinite(w).all():
        raise ValueError("weight must be finite to be quantized, got a weight with inf or NaN entries")
    scale = w.abs().amax(dim=1) / QMAX  # (out,)
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: 0 / 1 = 0
    q = torch.round(w / divisor[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)  # (out, in)
    return q, scale


def dequantize(q: Tensor, scale: Tensor) -> Tensor:
    """``q * scale`` row by row: the floating-point weight that int8 ``q`` stands for.

    Shapes: q (out_features, in_features) int8, scale (out_features,) -> (out_features, in_features), scale's dtype.

    Defined in chapter 9, Inference and deployment.
    """
    _validate_tensor("q", q, ndim=2)
    if q.dtype != torch.int8:
        raise TypeError(f"q must be an int8 tensor (from quantize_per_channel), got dtype {q.dtype}")
    _validate_tensor("scale", scale, ndim=1, floating=True)
    if scale.shape[0] != q.shape[0]:
        raise ValueError(
            f"scale must have one entry per row of q: q has shape {tuple(q.shape)}, scale {tuple(scale.shape)}"
        )
    return q.to(scale.dtype) * scale[:, None]


class Int8Linear(nn.Module):
    """A linear layer whose weight is stored as int8 with one float32 scale per output channel.

    ``forward(x) = F.linear(x, dequantize(weight_int8, weight_scale), bias)``, in x's dtype. The int8 weight,
    the scales and the bias are buffers (for inference: no parameters); ``weight`` is the dequantized weight.

    Shapes: x (..., in_features) -> (..., out_features).

    Defined in chapter 9, Inference and deployment.
    """

    weight_int8: Tensor  # buffers, registered in __init__
    weight_scale: Tensor
    bias: Tensor | None

    def __init__(self, weight_int8: Tensor, weight_scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        dequantize(weight_int8, weight_scale)  # validates the pair
        if bias is not None:
            _validate_tensor("bias", bias, ndim=1, floating=True, last_dim=weight_int8.shape[0])
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantize an ``nn.Linear``'s weight per output channel; the bias is copied as it is."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Int8Linear.from_linear expects an nn.Linear, got {type(linear).__name__}")
        q, scale = quantize_per_channel(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, bias)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight (out_features, in_features), in the scales' dtype."""
        return dequantize(self.weight_int8, self.weight_scale)

    def forward(self, x: Tensor) -> Tensor:
        _validate_tensor("x", x, floating=True, last_dim=self.in_features)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_weights(model: nn.Module, skip: str | Iterable[str] = ()) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.Linear`` replaced by an :class:`Int8Linear`.

    ``skip``: names of Linear modules (as in ``model.named_modules()``) to keep in floating point. A Linear
    with a tied weight stays as it is, still tied. ``model`` itself is not changed.

    Defined in chapter 9, Inference and deployment.
    """
    names = _linears_to_quantize(model, skip)
    quantized = copy.deepcopy(model)
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = quantized.get_submodule(parent)
        setattr(owner, child, Int8Linear.from_linear(getattr(owner, child)))
    return quantized


def dynamic_int8(model: nn.Module, skip: str | Iterable[str] = ()) -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` layers run PyTorch's dynamic int8 quantization (CPU only).

    ``torch.ao.quantization.quantize_dynamic``: int8 weights (one scale per tensor), each input quantized on
    the fly. ``skip`` and tied weights as in :func:`quantize_weights`; ``model`` itself is not changed.

    Defined in chapter 9, Inference and deployment.
    """
    names = _linears_to_quantize(model, skip)
    for name, p in model.named_parameters():
        if p.device.type != "cpu":
            raise ValueError(
                f"dynamic int8 quantization runs on the CPU: call model.cpu() first ({name} is on {p.device})"
            )
    for name in names:
        weight = model.get_submodule(name).weight
        if weight.dtype != torch.float32:
            raise TypeError(f"dynamic int8 quantization expects float32 weights, {name}.weight is {weight.dtype}")
    quantized = copy.deepcopy(model)
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao, and qint8 its deprecation: silence just those
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings(
            "ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel", category=UserWarning
        )
        from torch.ao.quantization import quantize_dynamic

        quantize_dynamic(quantized, set(names), dtype=torch.qint8, inplace=True)
    return quantized


def state_dict_bytes(model: nn.Module) -> int:
    """Bytes of ``model.state_dict()``, each storage once. A quantized tensor (:func:`dynamic_int8`) counts its
    int8 data and its per-channel scales and zero points, if any (a per-tensor scale is a Python number).

    Defined in chapter 9, Inference and deployment.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    tensors: list[object] = []  # a dynamically quantized Linear's state holds a (weight, bias) tuple
    for value in model.state_dict().values():
        tensors += value if isinstance(value, tuple | list) else [value]
    storages: dict[tuple[str, int], int] = {}  # (device, address) -> bytes; a quantized tensor's holds its int8 data
    total = 0
    for t in tensors:
        if isinstance(t, Tensor):
            if t.is_quantized and t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
                total += t.q_per_channel_scales().nbytes + t.q_per_channel_zero_points().nbytes
            storages[(str(t.device), t.untyped_storage().data_ptr())] = t.untyped_storage().nbytes()
    return total + sum(storages.values())


def _linears_to_quantize(model: nn.Module, skip: str | Iterable[str]) -> list[str]:
    """Names of the Linear modules to quantize: all of them, minus ``skip``, minus those with tied weights."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(skip, str):
        skip = (skip,)
    try:
        skip = set(skip)
    except TypeError:
        raise TypeError(f"skip must be a module name or an iterable of names, got {type(skip).__name__}") from None
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    unknown = sorted(str(s) for s in skip - set(linears))
    if unknown:
        raise ValueError(
            f"skip names modules that are not nn.Linear layers of the model: {unknown}; Linear layers: {linears}"
        )
    uses = collections.Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    tied = [name for name in linears if uses.get(id(model.get_submodule(name).weight), 0) > 1]
    names = [name for name in linears if name not in skip and name not in tied]
    if not names:
        raise ValueError(
            f"model has no nn.Linear layer to quantize "
            f"(Linear layers: {linears}, skipped: {sorted(skip)}, tied: {tied})"
        )
    return names
