"""Knowledge distillation: train a student on a teacher's soft targets as well as on the labels.

Hinton et al.'s loss mixes two terms. The soft term is the KL divergence from the teacher's
distribution to the student's, both taken at temperature ``T`` (a softmax of ``logits / T``),
multiplied by ``T**2`` so that its gradients keep their size as ``T`` changes (the gradient of
the softened KL scales as ``1 / T**2``). The hard term is the usual cross-entropy with the labels:

    loss = alpha * T**2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * CE(s, y)

With ``alpha = 0`` it is plain training; with ``alpha = 1`` the student only imitates the teacher.
:func:`distillation_loss_fn` turns it into a ``loss_fn`` for :class:`~transformer_lib.training.Trainer`,
with the teacher frozen, in eval mode and without gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import _reads_are_free, _validate_real, _validate_tensor


def distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    targets: Tensor,
    temperature: float = 2.0,
    alpha: float = 0.5,
    ignore_index: int = -100,
) -> Tensor:
    """``alpha * T**2 * KL(teacher || student) at temperature T + (1 - alpha) * cross_entropy(student, targets)``.

    Both terms are means over the positions whose target is not ``ignore_index``. If there are none,
    it raises a ValueError on the CPU; on a GPU, where that check would make every training step
    wait for the device, the loss is NaN (which the Trainer reports at its next log).

    Shapes: student_logits, teacher_logits (..., V); targets (...) -> a scalar.

    Defined in chapter 9, Inference and deployment.
    """
    _validate_logits(student_logits, teacher_logits, targets)
    T = _validate_real("temperature", temperature, "a finite number > 0", lambda t: t > 0)
    alpha = _validate_real("alpha", alpha, "a number in [0, 1]", lambda a: 0.0 <= a <= 1.0)
    V = student_logits.shape[-1]
    dtype = torch.promote_types(student_logits.dtype, torch.float32)  # bf16/fp16 logits: the softmaxes in fp32
    s, t, y = student_logits.reshape(-1, V).to(dtype), teacher_logits.reshape(-1, V).to(dtype), targets.reshape(-1)
    keep = y != ignore_index  # (N,) the positions that count
    if _reads_are_free(keep) and not keep.any():  # on a GPU this check would stall every step: the loss is NaN
        raise ValueError(f"every target is ignore_index={ignore_index}: there is nothing to learn from")
    loss = s.new_zeros(())  # a term with no weight is not computed (alpha = 1: the soft targets alone, chapter 9)
    if alpha > 0.0:
        log_p_student = F.log_softmax(s / T, dim=-1)  # (N, V)
        log_p_teacher = F.log_softmax(t.detach() / T, dim=-1)
        kl = F.kl_div(log_p_student, log_p_teacher, log_target=True, reduction="none").sum(-1)  # (N,) KL(t || s)
        loss = loss + alpha * T**2 * (kl.masked_fill(~keep, 0.0).sum() / keep.sum())  # the mean over kept positions
    if alpha < 1.0:
        loss = loss + (1.0 - alpha) * F.cross_entropy(s, y, ignore_index=ignore_index)
    return loss


def _validate_logits(student_logits: Tensor, teacher_logits: Tensor, targets: Tensor) -> None:
    """Floating logits of one shape (..., V), and targets of the shape (...)."""
    _validate_tensor("student_logits", student_logits, floating=True)
    _validate_tensor("teacher_logits", teacher_logits, floating=True)
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits must have the same shape (..., V), got {tuple(student_logits.shape)} "
            f"and {tuple(teacher_logits.shape)}: do the two models share a vocabulary?"
        )
    if not isinstance(targets, Tensor) or targets.shape != student_logits.shape[:-1]:
        got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
        want = tuple(student_logits.shape[:-1])
        raise ValueError(f"targets must have the logits' shape without the last axis, {want}, got {got}")


def distillation_loss_fn(
    teacher: nn.Module, temperature: float = 2.0, alpha: float = 0.5
) -> Callable[[nn.Module, Any], Tensor]:
    """A ``loss_fn(student, (x, y))`` for the Trainer: the teacher's logits on ``x`` (frozen, eval mode,
    no gradients) against the student's, by :func:`distillation_loss`. Both models map ids to
    ``(logits, loss)`` like :class:`~transformer_lib.models.GPT`."""
    _validate_real("temperature", temperature, "a finite number > 0", lambda t: t > 0)
    _validate_real("alpha", alpha, "a number in [0, 1]", lambda a: 0.0 <= a <= 1.0)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)

    def loss_fn(student: nn.Module, batch: Any) -> Tensor:
        x, y = batch
        with torch.no_grad():
            teacher_logits = teacher(x)[0]
        return distillation_loss(student(x)[0], teacher_logits, y, temperature, alpha)

    return loss_fn
