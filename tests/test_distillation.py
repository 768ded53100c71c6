"""Knowledge distillation's loss: Hinton et al.'s formula, its limits, its gradient, and its use in the Trainer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_lib import GPT, GPTConfig, _validate
from transformer_lib.distillation import distillation_loss, distillation_loss_fn
from transformer_lib.training import TrainConfig, Trainer


def logits(seed: int, shape=(2, 5, 7), dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 3


TARGETS = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(9))


def by_hand(s, t, y, T, alpha):
    """The formula written out: sum_v p_t (log p_t - log p_s) at temperature T, averaged over positions."""
    p_t = torch.softmax(t / T, -1)
    kl = (p_t * (torch.log_softmax(t / T, -1) - torch.log_softmax(s / T, -1))).sum(-1).mean()
    ce = F.cross_entropy(s.reshape(-1, s.shape[-1]), y.reshape(-1))
    return alpha * T**2 * kl + (1 - alpha) * ce


@pytest.mark.parametrize(("T", "alpha"), [(1.0, 0.5), (2.0, 0.5), (4.0, 0.9), (0.5, 0.2)])
def test_the_loss_is_the_formula(T, alpha):
    s, t = logits(0), logits(1)
    torch.testing.assert_close(distillation_loss(s, t, TARGETS, T, alpha), by_hand(s, t, TARGETS, T, alpha))


def test_alpha_zero_is_cross_entropy_and_a_perfect_imitation_costs_nothing():
    s, t = logits(0), logits(1)
    ce = F.cross_entropy(s.reshape(-1, 7), TARGETS.reshape(-1))
    torch.testing.assert_close(distillation_loss(s, t, TARGETS, 3.0, alpha=0.0), ce)
    assert distillation_loss(t, t, TARGETS, 3.0, alpha=1.0).abs() < 1e-6
    assert distillation_loss(s, t, TARGETS, 3.0, alpha=1.0) > 0.1


def test_a_term_with_no_weight_is_not_computed():
    """alpha = 1 reads the targets only for the mask (a transfer set's labels may be anything in range
    or not), and alpha = 0 is the cross-entropy exactly, not plus 0 times a KL."""
    s, t = logits(0), logits(1)
    out_of_range = torch.full_like(TARGETS, 7)  # no such class among 7: cross-entropy would fail on it
    assert torch.equal(
        distillation_loss(s, t, out_of_range, 2.0, alpha=1.0), distillation_loss(s, t, TARGETS, 2.0, alpha=1.0)
    )
    with pytest.raises(IndexError):
        distillation_loss(s, t, out_of_range, 2.0, alpha=0.5)
    assert torch.equal(
        distillation_loss(s, t, TARGETS, 2.0, alpha=0.0), F.cross_entropy(s.reshape(-1, 7), TARGETS.reshape(-1))
    )


def test_the_T_squared_factor_keeps_the_soft_gradient_of_comparable_size():
    """Without T**2 the soft term's gradient shrinks like 1/T**2; with it, it settles as T grows."""
    t = logits(1)
    norms = []
    for T in (4.0, 8.0, 16.0):
        s = logits(0).requires_grad_()
        distillation_loss(s, t, TARGETS, T, alpha=1.0).backward()
        norms.append(s.grad.norm().item())
    assert max(norms) / min(norms) < 1.5, norms


def test_at_T_one_the_soft_term_pulls_towards_the_teacher_as_cross_entropy_pulls_towards_the_target():
    """Chapter 9's reading: with alpha = 1 and T = 1 the gradient on the logits is (p_s - p_t) / N, the
    cross-entropy's (p_s - one_hot(y)) / N with the teacher's distribution in place of the one-hot target."""
    t = logits(1)
    s = logits(0).requires_grad_()
    distillation_loss(s, t, TARGETS, temperature=1.0, alpha=1.0).backward()
    n_positions = TARGETS.numel()
    torch.testing.assert_close(s.grad, (torch.softmax(s, -1) - torch.softmax(t, -1)).detach() / n_positions)
    s_ce = logits(0).requires_grad_()
    F.cross_entropy(s_ce.reshape(-1, 7), TARGETS.reshape(-1)).backward()
    one_hot = F.one_hot(TARGETS, 7).float()
    torch.testing.assert_close(s_ce.grad, (torch.softmax(s_ce, -1) - one_hot).detach() / n_positions)


def test_the_gradient_is_right_and_never_reaches_the_teacher():
    s = logits(0, dtype=torch.float64).requires_grad_()
    t = logits(1, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda s: distillation_loss(s, t, TARGETS, 2.0, 0.7).double(), (s,))
    distillation_loss(s, t, TARGETS).backward()
    assert t.grad is None


def test_ignored_positions_count_in_neither_term():
    s, t = logits(0), logits(1)
    y = TARGETS.clone()
    y[:, -2:] = -100
    kept = distillation_loss(s[:, :-2], t[:, :-2], y[:, :-2], 2.0, 0.5)
    torch.testing.assert_close(distillation_loss(s, t, y, 2.0, 0.5), kept)


def test_bad_inputs_are_named():
    s, t = logits(0), logits(1)
    with pytest.raises(ValueError, match=r"same shape \(\.\.\., V\), got \(2, 5, 7\) and \(2, 5, 8\)"):
        distillation_loss(s, logits(1, (2, 5, 8)), TARGETS)
    with pytest.raises(ValueError, match=r"targets must have the logits' shape without the last axis, \(2, 5\)"):
        distillation_loss(s, t, TARGETS[:, :3])
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got 0"):
        distillation_loss(s, t, TARGETS, temperature=0)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0, 1\], got 1.5"):
        distillation_loss(s, t, TARGETS, alpha=1.5)
    with pytest.raises(ValueError, match="every target is ignore_index=-100"):
        distillation_loss(s, t, torch.full_like(TARGETS, -100))
    with pytest.raises(TypeError, match="student_logits must be a floating-point tensor"):
        distillation_loss(TARGETS, TARGETS, TARGETS)


def test_with_nothing_to_learn_from_the_loss_is_nan_where_checking_would_stall_a_gpu(monkeypatch):
    """On the CPU the ValueError above; on a GPU the check would wait for the device at every step."""
    monkeypatch.setattr(_validate, "_HOST_DEVICES", ())  # the path a GPU takes
    assert distillation_loss(logits(0), logits(1), torch.full_like(TARGETS, -100)).isnan()


def test_a_student_trains_on_a_frozen_teacher_with_the_trainer():
    config = GPTConfig(vocab_size=7, block_size=8, n_layers=1, n_heads=2, d_model=16, dropout=0.0)
    torch.manual_seed(0)
    teacher, student = GPT(config), GPT(config)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    x = torch.randint(0, 7, (4, 8), generator=torch.Generator().manual_seed(0))
    batch = (x, torch.roll(x, -1, 1))
    loss_fn = distillation_loss_fn(teacher, temperature=2.0, alpha=1.0)
    first = loss_fn(student, batch).item()
    cfg = TrainConfig(max_steps=30, lr=1e-2, warmup_steps=0, eval_interval=100, amp=False)
    Trainer(student, cfg, lambda g: batch, loss_fn=loss_fn, device="cpu").fit(progress=False)
    assert loss_fn(student, batch).item() < 0.5 * first  # the student moved towards the teacher
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())  # the teacher did not move
    assert not teacher.training
