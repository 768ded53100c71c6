"""Trainer checkpoints on disk: a checksummed file, written atomically, loaded all or nothing.

A checkpoint file is ``torch.save`` of ``{"format": "transformer_lib.checkpoint/1", "sha256": hex
digest, "payload": uint8 tensor}``, where the payload holds the bytes of ``torch.save`` of a trainer
state (:func:`trainer_state`: tensors and plain Python values only, so both layers load with
``weights_only=True``). The checksum is what turns a truncated or flipped file into a clear
:class:`CheckpointError`: ``torch.load`` alone loads a file with a flipped byte inside a weight
without a word. A save writes a temporary file ``<name>.<pid>.<random>.tmp`` beside the target,
flushes it to disk and renames it over the target, so an interrupted save, a full disk or two
processes saving at once leave one whole checkpoint; the next save to that path removes what killed
writers left behind. A load checks the whole state against the trainer before it changes anything:
the model's config and weight shapes, the optimizer's moments, the random states, the training
config, and that the weights are finite (a save refuses weights that are not).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch import distributed as dist

if TYPE_CHECKING:
    from .training import History, Trainer

Fail = Callable[[str], "CheckpointError"]  # makes the error for one problem, naming the file
CHECKPOINT_FORMAT = "transformer_lib.checkpoint/1"
STATE_FIELDS = (
    *("model", "optimizer", "scaler", "step", "train_config", "model_config"),
    *("generator", "torch_rng", "cuda_rng", "history"),
)
SCALER_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
# TrainConfig fields that change how a run is shown or executed, not what it computes: a resume may change them
FREE_CONFIG_FIELDS = ("progress", "compile", "cuda_graph")
STALE_SECONDS = 60.0  # a temporary file older than this, whose writer is gone, is left from a killed save


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (unreadable, corrupted, of another kind, for another model or
    another training config, or holding weights that are not finite), or a trainer state that must not
    be saved (weights that are not finite)."""


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` to ``path`` atomically, in the checksummed format; return the path.

    An ``OSError`` while writing (a full disk: errno ``ENOSPC``) names ``path`` and leaves the file
    that was there as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = _serialize(state)
    data = _serialize(
        {
            "format": CHECKPOINT_FORMAT,
            "sha256": hashlib.sha256(payload).hexdigest(),
            "payload": torch.frombuffer(payload, dtype=torch.uint8),
        }
    )
    _remove_stale_temporaries(path)
    _write_atomically(data, path)
    return path


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The verified state inside a checkpoint file, on the CPU.

    Raises ``FileNotFoundError`` for a missing file and :class:`CheckpointError` for a file that is
    truncated, corrupted, not a checkpoint, or of another format.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        outer = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path} cannot be read: it is truncated, corrupted, or not a file written by torch.save "
            f"({_first_line(e)})"
        ) from e
    payload = _verified_payload(outer, path)
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: its payload is invalid ({_first_line(e)})") from e


def trainer_state(trainer: Trainer) -> dict[str, Any]:
    """What :meth:`Trainer.state_dict <transformer_lib.training.Trainer.state_dict>` returns: everything
    a resume needs, in tensors and plain Python values. Under data parallelism a collective (it
    gathers every process's data generator, by rank): every process calls it."""
    rank_generators: list[Any] = []
    if trainer.world_size > 1:
        rank_generators = [None] * trainer.world_size
        dist.all_gather_object(rank_generators, trainer.generator.get_state())
    return {
        "model": trainer.model.state_dict(),
        "optimizer": _plain_optimizer_state(trainer.optimizer, trainer._lr),
        "scaler": trainer.scaler.state_dict(),
        "step": trainer.step,
        "train_config": asdict(trainer.config),
        "model_config": _model_config(trainer.model),
        "generator": trainer.generator.get_state(),
        "rank_generators": rank_generators,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "history": asdict(trainer.history),
    }


def save_trainer(trainer: Trainer, path: str | os.PathLike) -> Path:
    """What :meth:`Trainer.save <transformer_lib.training.Trainer.save>` does: write the trainer's
    :meth:`~transformer_lib.training.Trainer.state_dict` with :func:`save_checkpoint`; return the path.

    Weights or optimizer moments that are not finite raise :class:`CheckpointError` and write
    nothing, so that the last checkpoint stays one worth reloading. Under data parallelism every
    process calls it: rank 0 writes, the others wait until the file is there.
    """
    state = trainer_state(trainer)  # under data parallelism a collective
    bad = _nonfinite(trainer.model, state)  # the same weights on every process: all raise, or none
    if bad:
        raise CheckpointError(
            f"not saving {path}: the trainer holds weights that are not finite (NaN or inf): {', '.join(bad[:5])}. "
            f"The file there is unchanged; reload it and train with a lower lr (lr={trainer.config.lr}) or "
            f"gradient clipping (grad_clip={trainer.config.grad_clip})"
        )
    if trainer.rank == 0:
        save_checkpoint(state, path)
    if trainer.world_size > 1:
        dist.barrier()
    return Path(path)


def load_trainer(trainer: Trainer, path: str | os.PathLike, allow_config_change: bool = False) -> None:
    """What :meth:`Trainer.load <transformer_lib.training.Trainer.load>` does: check the whole state
    in the file against ``trainer``, then, only if all is well, load it."""
    state = load_checkpoint(path)
    history = _validate_state(state, trainer, Path(path), allow_config_change)
    generator = state["rank_generators"][trainer.rank] if trainer.world_size > 1 else state["generator"]
    apply_trainer_state(trainer, state["model"], state["optimizer"], state["scaler"], state["step"], generator, history)
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        for device, rng in enumerate(state["cuda_rng"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(rng, device)


def _plain_optimizer_state(optimizer: torch.optim.Optimizer, lr: float) -> dict[str, Any]:
    """The optimizer's state dict as a step run as usual leaves it, whose learning rate was ``lr``.

    A CUDA graph's replayed steps (:mod:`transformer_lib.cuda_graphs`) hold the learning rate in an fp32
    device tensor and make the parameter groups ``capturable``, which a CPU's optimizer refuses. The file
    is the same either way."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:  # copies: the optimizer's own groups are untouched
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = lr
        if "capturable" in group:
            group["capturable"] = False
    return state


def apply_trainer_state(
    trainer: Trainer,
    model: dict[str, Tensor],
    optimizer: dict[str, Any],
    scaler: dict[str, Any],
    step: int,
    generator: Tensor,
    history: History,
) -> None:
    """Put a state already known to fit into ``trainer``: its weights, optimizer, loss scaler, step, data
    generator and history (not PyTorch's global generators). :func:`load_trainer` calls it after its
    checks; ``fit_together`` with the state a run's own process trained."""
    trainer.model.load_state_dict(model)
    trainer.optimizer.load_state_dict(optimizer)
    cfg = trainer.config  # the optimizer's settings follow the trainer's config, not the file's
    for group, decay in zip(trainer.optimizer.param_groups, (cfg.weight_decay, 0.0), strict=True):
        group.update(betas=cfg.betas, weight_decay=decay)
    if scaler:
        trainer.scaler.load_state_dict(scaler)  # a no-op where the scaler is off
    trainer.step = step
    trainer.generator.set_state(generator)
    trainer.history = history
    trainer._reset_nonfinite()
    trainer._forget_graph()  # a CUDA graph captured the optimizer's old state tensors


def _validate_state(state: object, trainer: Trainer, path: Path, allow_config_change: bool) -> History:
    """Check every part of a loaded trainer state against ``trainer``, which is left untouched; return
    the state's history. Any problem raises :class:`CheckpointError` naming ``path``.

    The training configs must agree except in ``progress``, ``compile`` and ``cuda_graph``, unless
    ``allow_config_change``; the model configs must agree always.
    """

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path} {what}")

    if not isinstance(state, dict):
        raise fail(f"holds a {type(state).__name__}, not a trainer state")
    missing = [name for name in STATE_FIELDS if name not in state]
    if missing:
        raise fail(f"is incomplete: it has no {', '.join(missing)}")
    _validate_model_config(_model_config(trainer.model), state["model_config"], fail)
    _validate_model_state(trainer.model.state_dict(), state["model"], fail)
    _validate_optimizer_state(trainer, state["optimizer"], fail)
    bad = _nonfinite(trainer.model, state)
    if bad:
        raise fail(f"holds weights that are not finite (NaN or inf): {', '.join(bad[:5])}")
    _validate_scaler_state(state["scaler"], fail)
    _validate_rng_states(trainer, state, fail)
    step = state["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise fail(f"has step {step!r}, not an integer >= 0")
    _validate_train_config(asdict(trainer.config), state["train_config"], allow_config_change, fail)
    history_type = type(trainer.history)
    try:
        return history_type(**state["history"])
    except TypeError as e:
        raise fail(f"has a history that does not fit History ({e})") from e


def _nonfinite(model: torch.nn.Module, state: dict[str, Any]) -> list[str]:
    """The names of the weights (``model``'s parameters) and optimizer moments in ``state`` that hold a
    NaN or an infinity. Buffers are not checked: a float mask may hold -inf by design."""
    weights = {name: state["model"][name] for name, _ in model.named_parameters() if name in state["model"]}
    names = list(weights)
    tensors = list(weights.values())
    for index, moments in state["optimizer"].get("state", {}).items():
        for name, value in moments.items():
            if isinstance(value, Tensor) and value.is_floating_point() and name != "step":
                names.append(f"the optimizer's {name} of parameter {index}")
                tensors.append(value)
    if not tensors:
        return []
    finite = torch.stack([torch.isfinite(t).all() for t in tensors]).tolist()  # one host sync
    return [name for name, ok in zip(names, finite, strict=True) if not ok]


def _model_config(model: torch.nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    return asdict(config) if is_dataclass(config) and not isinstance(config, type) else None


def _serialize(obj: object) -> memoryview:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer()


def _write_atomically(data: memoryview, path: Path) -> None:
    """Write ``data`` to a temporary file of this save's own, flush it to disk, rename it over ``path``.

    The temporary file sits in the same folder (a rename within one filesystem is atomic on POSIX and
    Windows), is named after this process so that a later save can tell whether its writer still runs,
    and is removed if anything goes wrong, even an interrupt.
    """
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as f:  # "x": never someone else's file
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):  # e.g. "[Errno 28] No space left on device writing checkpoint ..."
            message = f"{e.strerror or e} writing checkpoint {path}; the file there is unchanged"
            raise (OSError(e.errno, message) if e.errno else OSError(message)) from e
        raise
    if os.name == "posix":  # make the rename durable (best effort where a filesystem refuses)
        with contextlib.suppress(OSError):
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files of saves to ``path`` that were killed: older than ``STALE_SECONDS``
    and written by a process that no longer runs on this machine (a live writer's file is kept)."""
    for tmp in path.parent.glob(f"{glob.escape(path.name)}.*.tmp"):
        pid = tmp.name[len(path.name) + 1 :].split(".")[0]
        with contextlib.suppress(OSError):  # removed meanwhile, or not ours to remove
            if time.time() - tmp.stat().st_mtime > STALE_SECONDS and not _running(pid):
                tmp.unlink()


def _running(pid: str) -> bool:
    """Whether process ``pid`` runs on this machine. Off POSIX, unknown: False, and age alone decides
    (``os.kill(pid, 0)`` would end the process on Windows)."""
    if not pid.isdigit() or os.name != "posix":
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _first_line(error: BaseException, limit: int = 300) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {(text[0] if text else '')[:limit]}"


def _describe(value: object) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else f"{value!r}"


def _verified_payload(outer: object, path: Path) -> bytes:
    """The payload bytes of a loaded checkpoint file, once its format and checksum are right."""
    if not isinstance(outer, dict) or "format" not in outer:
        raise CheckpointError(f"checkpoint {path} {_what_it_is(outer)}")
    if outer["format"] != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"checkpoint {path} has format {outer['format']!r}; this transformer_lib reads {CHECKPOINT_FORMAT!r}"
        )
    payload, digest = outer.get("payload"), outer.get("sha256")
    if not (isinstance(payload, Tensor) and payload.dtype == torch.uint8 and payload.dim() == 1):
        raise CheckpointError(f"checkpoint {path} is corrupted: its payload is {_describe(payload)}")
    data = payload.numpy().tobytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupted (checksum mismatch: the payload's sha256 is "
            f"{actual[:16]}..., the file says {str(digest)[:16]}...)"
        )
    return data


def _what_it_is(obj: object) -> str:
    """Why a file torch could load is not one of our checkpoints, for the error message."""
    if isinstance(obj, dict) and obj and all(isinstance(v, Tensor) for v in obj.values()):
        return (
            "is not a transformer_lib checkpoint but a plain state_dict (weights only): load it with "
            "model.load_state_dict(torch.load(path, weights_only=True))"
        )
    if isinstance(obj, dict) and {"model", "optimizer", "step"} <= set(obj):
        return (
            "is a Trainer state without format and checksum (from Trainer.state_dict, or an older "
            "transformer_lib): Trainer.load reads only files written by Trainer.save"
        )
    kind = f"a dict with keys {sorted(map(str, obj))[:8]}" if isinstance(obj, dict) else f"a {type(obj).__name__}"
    return f"is not a transformer_lib checkpoint (it holds {kind})"


def _validate_model_config(mine: dict | None, theirs: object, fail: Fail) -> None:
    if theirs is not None and not isinstance(theirs, dict):
        raise fail(f"has a model_config of type {type(theirs).__name__}, not a dict")
    mine, theirs = mine or {}, theirs or {}
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if diff:
        raise fail(
            f"is for a different model config; differing fields: {diff} "
            f"(checkpoint: {[theirs.get(k) for k in diff]}, model: {[mine.get(k) for k in diff]})"
        )


def _validate_model_state(mine: dict[str, Tensor], theirs: object, fail: Fail) -> None:
    """The checkpoint's weights have exactly the model's names and shapes."""
    if not isinstance(theirs, dict):
        raise fail(f"has model weights of type {type(theirs).__name__}, not a state_dict")
    missing, unexpected = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
    if missing or unexpected:
        raise fail(f"does not fit the model: missing weights {missing[:5]}, unexpected weights {unexpected[:5]}")
    for name, value in theirs.items():
        if not isinstance(value, Tensor) or value.shape != mine[name].shape:
            raise fail(f"has {name} as {_describe(value)}; the model's has shape {tuple(mine[name].shape)}")


def _validate_optimizer_state(trainer: Trainer, theirs: object, fail: Fail) -> None:
    """Load ``theirs`` into a scratch optimizer over the same parameters (the trainer's is untouched)."""
    if not isinstance(theirs, dict):
        raise fail(f"has an optimizer state of type {type(theirs).__name__}, not a dict")
    scratch = trainer._new_optimizer()
    try:
        scratch.load_state_dict(theirs)
    except Exception as e:
        raise fail(f"has an optimizer state that does not fit this model ({type(e).__name__}: {e})") from e
    for param, moments in scratch.state.items():
        if not isinstance(param, Tensor):
            raise fail(f"has optimizer state for parameter {param!r}, which the optimizer does not have")
        for name in ("step", "exp_avg", "exp_avg_sq"):
            value = moments.get(name)
            if not isinstance(value, Tensor) or (name != "step" and value.shape != param.shape):
                raise fail(
                    f"has an optimizer state whose {name} for a parameter of shape {tuple(param.shape)} "
                    f"is {_describe(value)}"
                )


def _validate_scaler_state(theirs: object, fail: Fail) -> None:
    """Empty (saved without the fp16 scaler) or holding every field of ``GradScaler.state_dict``."""
    if not isinstance(theirs, dict):
        raise fail(f"has a gradient-scaler state of type {type(theirs).__name__}, not a dict")
    missing = [name for name in SCALER_FIELDS if name not in theirs]
    if theirs and missing:
        raise fail(f"has a gradient-scaler state without {missing}")


def _validate_rng_states(trainer: Trainer, state: dict, fail: Fail) -> None:
    """The data generators' and torch's random states: byte tensors of the size this torch uses, and one
    data generator per process under data parallelism."""
    rank_generators = state.get("rank_generators", [])
    if trainer.world_size > 1 and len(rank_generators) != trainer.world_size:
        raise fail(
            f"holds the data streams of {len(rank_generators) or 1} process(es); this run has "
            f"{trainer.world_size}: resume with as many processes as wrote it"
        )
    mine = trainer.generator.get_state()
    named = [("generator", state["generator"]), ("torch_rng", state["torch_rng"])]
    for name, theirs in [*named, *(("rank_generators", g) for g in rank_generators)]:
        if not isinstance(theirs, Tensor) or theirs.dtype != torch.uint8 or theirs.shape != mine.shape:
            raise fail(f"has a random state {name} that is {_describe(theirs)}, not {mine.numel()} bytes")
    cuda = state["cuda_rng"]
    if not isinstance(cuda, list) or not all(isinstance(s, Tensor) and s.dtype == torch.uint8 for s in cuda):
        raise fail("has a cuda_rng that is not a list of byte tensors")


def _validate_train_config(mine: dict[str, Any], theirs: object, allow_change: bool, fail: Fail) -> None:
    """The same training run: every :class:`TrainConfig` field equal, except those that only change how it runs."""
    if not isinstance(theirs, dict):
        raise fail(f"has a train_config of type {type(theirs).__name__}, not a dict")
    diff = [k for k in mine if k in theirs and k not in FREE_CONFIG_FIELDS and theirs[k] != mine[k]]
    if diff and not allow_change:
        changes = "; ".join(f"{k}: {theirs[k]!r} in the checkpoint, {mine[k]!r} here" for k in diff)
        raise fail(
            f"was written under another TrainConfig ({changes}). To resume under this trainer's config "
            f"anyway (e.g. to train longer with a larger max_steps), call load(path, allow_config_change=True); "
            f"to resume the run as it was, build the Trainer with "
            f"TrainConfig(**transformer_lib.checkpoint.load_checkpoint(path)['train_config'])"
        )
