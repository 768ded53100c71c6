"""Trainer checkpoints on disk: ``torch.save`` of :meth:`~transformer_lib.training.Trainer.state_dict`,
written atomically, read with ``weights_only=True`` once its zip entries are known to be stored (nothing to
inflate) and whole (CRC-32), and checked against the trainer (:func:`validate_state`) before it changes anything.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (unreadable, corrupted, for another model or another training
    config, or holding weights that are not finite), or a state that must not be saved (weights that are
    not finite)."""


def save(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` to ``path`` with ``torch.save`` into a temporary file beside it, renamed over it: an
    interrupted save, a full disk (``OSError``) or two processes saving at once leave one whole file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp", delete=False) as f:
        tmp = Path(f.name)
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The state in a file :func:`save` wrote, on the CPU. ``FileNotFoundError`` for a missing file;
    :class:`CheckpointError` for a truncated, corrupted or compressed file, or one that is not a dict."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        with zipfile.ZipFile(path) as archive:
            compressed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
            if compressed:  # torch.save stores its entries; inflating someone else's could take any memory
                raise CheckpointError(f"checkpoint {path} has compressed entries, which torch.save never writes")
            broken = archive.testzip()  # reads every entry once and checks its CRC-32
        if broken is not None:
            raise CheckpointError(f"checkpoint {path} is corrupted: entry {broken} fails its checksum")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: it is truncated, corrupted, or not "
                              f"written by torch.save ({type(e).__name__}: {str(e)[:200]})") from e  # fmt: skip
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a trainer state")
    return state


STATE_FIELDS = ("model", "optimizer", "scaler", "step", "train_config", "model_config", "generators", "history")


def validate_state(
    state: dict[str, Any],
    model: torch.nn.Module,
    model_config: dict | None,
    train_config: dict[str, Any],
    world_size: int,
    allow_config_change: bool = False,
) -> None:
    """Raise :class:`CheckpointError` naming the first part of ``state`` that does not fit the trainer of
    ``model`` (whose dataclass config is ``model_config``), ``train_config`` and ``world_size`` processes.
    A different training config is refused unless ``allow_config_change``."""
    if not all(name in state for name in STATE_FIELDS):
        raise CheckpointError(f"it is not a trainer state (Trainer.state_dict): it has {sorted(map(str, state))}")
    theirs_config, mine_config = state["model_config"] or {}, model_config or {}
    differ = {k: (theirs_config.get(k), mine_config.get(k)) for k in {**theirs_config, **mine_config}}
    if differ := {k: pair for k, pair in differ.items() if pair[0] != pair[1]}:
        raise CheckpointError(f"it is for another model config ({{field: (the checkpoint's, this model's)}}: {differ})")
    mine = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    theirs = {name: tuple(t.shape) for name, t in state["model"].items() if isinstance(t, Tensor)}
    if mine != theirs:
        odd = sorted(set(mine.items()) ^ set(theirs.items()))[:5]
        raise CheckpointError(f"it does not fit the model (weights that differ in name or shape: {odd})")
    for moments in state["optimizer"].get("state", {}).values():
        for name in ("exp_avg", "exp_avg_sq"):
            if name in moments and tuple(moments[name].shape) not in set(mine.values()):
                raise CheckpointError(f"it has an optimizer {name} of shape {tuple(moments[name].shape)} no weight has")
    refuse_nonfinite(state, [name for name, _ in model.named_parameters()], "it")
    if len(state["generators"]) != world_size:
        raise CheckpointError(f"it was written by {len(state['generators'])} process(es); this run has {world_size}")
    diff = [k for k, v in train_config.items() if state["train_config"].get(k, v) != v]
    if diff and not allow_config_change:
        changes = "; ".join(
            f"{k}: {state['train_config'][k]!r} in the checkpoint, {train_config[k]!r} here" for k in diff
        )
        raise CheckpointError(
            f"it was written under another TrainConfig ({changes}). To resume under this trainer's config anyway "
            f"(e.g. to train longer with a larger max_steps), call load(path, allow_config_change=True)"
        )


def refuse_nonfinite(state: dict[str, Any], parameters: list[str], whose: str) -> None:
    """Raise :class:`CheckpointError` naming the weights (those in ``parameters``) and optimizer moments of
    ``state`` that hold a NaN or an infinity, as ``whose`` holds them. Buffers are not checked: a float mask
    may hold -inf by design."""
    named = [(name, state["model"][name]) for name in parameters if name in state["model"]]
    for index, moments in state["optimizer"].get("state", {}).items():
        named += [(f"the optimizer's {k} of parameter {index}", v) for k, v in moments.items() if k != "step"]
    tensors = [(name, t) for name, t in named if isinstance(t, Tensor) and t.is_floating_point()]
    finite = torch.stack([torch.isfinite(t).all() for _, t in tensors]).tolist() if tensors else []  # one sync
    bad = [name for (name, _), ok in zip(tensors, finite, strict=True) if not ok]
    if bad:
        raise CheckpointError(
            f"{whose} holds weights that are not finite (NaN or inf): {', '.join(bad[:5])}. Reload an earlier "
            "checkpoint and train with a lower learning rate or gradient clipping"
        )
