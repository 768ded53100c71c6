"""A GPT as an ONNX file, run by ONNX Runtime: ``export_onnx`` writes it, ``OnnxGPT`` runs it.

The exported graph maps token ids (B, T) to logits (B, T, vocab_size), the batch size and the
sequence length (up to ``block_size``) free; the loss, the dropout and the KV cache stay out. The
packages are optional (``pip install transformer_lib[deploy]``): onnx and onnxscript to export,
onnxruntime to run; they are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch
from torch import Tensor, nn

from ._validate import _validate_token_ids
from .models import GPT
from .utils import eval_mode

# Keys of the metadata that export_onnx writes into the file and OnnxGPT reads back.
_META_VOCAB, _META_BLOCK = "transformer_lib.vocab_size", "transformer_lib.block_size"
# A protobuf message (the .onnx file) holds at most 2 GiB; bigger weights go to a side file "<path>.data".
_PROTOBUF_LIMIT = 2**31 - 2**26


def _require(module: str, pip_name: str, what: str) -> ModuleType:
    """Import an optional dependency, or say which pip package provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{what} needs the package {pip_name!r}: pip install {pip_name} (or pip install 'transformer_lib[deploy]')"
        ) from err


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Only errors from the logger ``name`` (and its children without a level of their own) inside the block."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _Logits(nn.Module):
    """What goes into the file: a GPT's logits, without the checks (Python control flow on the ids' values,
    which a graph cannot hold; :class:`OnnxGPT` runs them before the graph), the loss and the cache.

    Shapes: idx (B, T) -> logits (B, T, vocab_size).
    """

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, idx: Tensor) -> Tensor:
        return self.gpt.logits(idx)  # (B, T, vocab_size)


def export_onnx(model: GPT, path: str | Path, example_ids: Tensor | None = None, dynamic: bool = True) -> Path:
    """Write ``model``'s logits for token ids to the ONNX file ``path`` (in eval mode); return the path.

    ``dynamic=True`` leaves the batch size and the length (up to ``block_size``) free; ``dynamic=False``
    fixes both to the shape of ``example_ids`` (the exporter's input; default (2, min(8, block_size)) ids).
    ``vocab_size`` and ``block_size`` go into the file's metadata, for :class:`OnnxGPT`'s checks.

    Shapes: example_ids (B, T); the file maps ids (B, T) -> logits (B, T, vocab_size).

    Defined in chapter 9, Inference and deployment.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a transformer_lib.GPT, got {type(model).__name__}")
    _require("onnx", "onnx", "export_onnx")
    _require("onnxscript", "onnxscript", "export_onnx")
    config = model.config
    if example_ids is None:
        example_ids = torch.arange(2 * min(8, config.block_size)).reshape(2, -1) % config.vocab_size
    example_ids = _validate_token_ids("example_ids", example_ids, config.vocab_size, config.block_size)
    example_ids = example_ids.to(next(model.parameters()).device)
    program = _program(model, example_ids, _dynamic_shapes(example_ids, config.block_size) if dynamic else None)
    program.model.metadata_props[_META_VOCAB] = str(config.vocab_size)
    program.model.metadata_props[_META_BLOCK] = str(config.block_size)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    program.save(path, external_data=weight_bytes > _PROTOBUF_LIMIT)
    return path


def _dynamic_shapes(example_ids: Tensor, block_size: int) -> dict[str, dict[int, Any]]:
    """The batch free and the length free up to ``block_size``. ``torch.export`` treats a size of 0 or 1 in
    the example as a constant, so the example must be at least (2, 2)."""
    B, T = example_ids.shape
    if B < 2 or (T < 2 and block_size >= 2):
        raise ValueError(f"example_ids for a dynamic export needs batch >= 2 and length >= 2, got shape {(B, T)}")
    seq = torch.export.Dim("T", min=1, max=block_size) if block_size >= 2 else None
    return {"idx": {0: torch.export.Dim("B", min=1), 1: seq}}


def _program(model: GPT, example_ids: Tensor, dynamic_shapes: dict[str, Any] | None) -> torch.onnx.ONNXProgram:
    """``torch.onnx.export``'s program of ``model``'s logits, in eval mode, the exporter's own notices silenced."""
    with eval_mode(model), warnings.catch_warnings(), _quiet("torch.onnx"):
        for category in (FutureWarning, DeprecationWarning):
            warnings.simplefilter("ignore", category)
        # dynamo=True returns the program (None is the legacy exporter's answer; the stub has no overload)
        return cast(
            "torch.onnx.ONNXProgram",
            torch.onnx.export(
                _Logits(model).eval(),
                (example_ids,),
                input_names=["idx"],
                output_names=["logits"],
                dynamic_shapes=dynamic_shapes,
                dynamo=True,
                verbose=False,
            ),
        )


class OnnxGPT:
    """An exported GPT run by ONNX Runtime on the CPU, called like the model: ids in, logits out.

    ``threads``: ONNX Runtime's intra-op threads (None: its default). The ids are checked as :class:`GPT`
    checks them before the graph runs.

    Shapes: ids (B, T) -> logits (B, T, vocab_size).

    Defined in chapter 9, Inference and deployment.
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        ort = _require("onnxruntime", "onnxruntime", "OnnxGPT")
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no ONNX file at {self.path}")
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = int(threads)
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        if _META_VOCAB not in meta or _META_BLOCK not in meta:
            raise ValueError(f"{self.path} was not written by transformer_lib.export.export_onnx (no vocab metadata)")
        self.vocab_size, self.block_size = int(meta[_META_VOCAB]), int(meta[_META_BLOCK])
        (self.input,) = self.session.get_inputs()
        self.input_shape = tuple(d if isinstance(d, int) else None for d in self.input.shape)  # None: dynamic

    def __call__(self, ids: Tensor) -> Tensor:
        ids = _validate_token_ids("ids", ids, self.vocab_size, self.block_size)
        for axis, (want, got) in enumerate(zip(self.input_shape, ids.shape, strict=True)):
            if want is not None and want != got:
                raise ValueError(
                    f"ids has shape {tuple(ids.shape)}, but this file was exported with the fixed shape "
                    f"{self.input_shape} (axis {axis}); export with dynamic=True for other shapes"
                )
        (logits,) = self.session.run(None, {self.input.name: ids.cpu().numpy()})
        return torch.from_numpy(logits)

    def __repr__(self) -> str:
        return f"OnnxGPT({str(self.path)!r}, vocab_size={self.vocab_size}, block_size={self.block_size})"
