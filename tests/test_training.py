import dataclasses
import io
import math
import platform
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from transformer_lib import GPT, GPTConfig, checkpoint, training
from transformer_lib.checkpoint import CheckpointError
from transformer_lib.notebook import environment
from transformer_lib.notebook.plots import plot_history
from transformer_lib.precision import native_dtype
from transformer_lib.text import random_blocks
from transformer_lib.training import (
    NonFiniteLossError,
    TrainConfig,
    Trainer,
    autocast_dtype,
    default_loss,
    lr_at,
    make_optimizer,
)

DATA = torch.arange(400) % 7  # a periodic "text": easy to learn


def batches(generator):
    return random_blocks(DATA, 8, 16, generator)


def tiny_gpt(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**dict(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=0.1), **kw}))


def trainer(model, steps=20, loss_fn=default_loss, compile=False, **kw):
    settings = dict(max_steps=steps, lr=3e-3, warmup_steps=5, eval_interval=10, eval_steps=2, log_interval=5)
    cfg = TrainConfig(**{**settings, **kw})
    count = lambda b: b[0].numel()  # noqa: E731
    return Trainer(model, cfg, batches, batches, loss_fn=loss_fn, device="cpu", count=count, compile=compile)


def test_learning_rate_schedule():
    assert lr_at(0, 1.0, 0.1, 10, 100) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 0.1, 10, 100) == pytest.approx(1.0)
    assert lr_at(55, 1.0, 0.1, 10, 100) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_at(100, 1.0, 0.1, 10, 100) == pytest.approx(0.1)
    assert lr_at(500, 1.0, 0.1, 10, 100) == pytest.approx(0.1)


def test_weight_decay_skips_norms_and_biases():
    model = tiny_gpt()
    opt = make_optimizer(model, 1e-3, 0.1)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    norm_weight = model.blocks[0].norm1.weight
    assert any(p is norm_weight for p in no_decay["params"])


def test_training_lowers_the_loss_and_records_history():
    t = trainer(tiny_gpt(), steps=60)
    h = t.fit()
    assert h.val_loss[-1] < h.val_loss[0] - 0.5, h.val_loss
    assert h.eval_steps == [0, 10, 20, 30, 40, 50, 60]
    assert h.steps == list(range(5, 61, 5)) and len(h.train_loss) == 12
    assert h.items == 60 * 8 * 16 and h.items_per_second > 0
    assert plot_history(h).axes[0].get_xlabel() == "step"


def test_resume_gives_the_same_weights(tmp_path):
    straight = trainer(tiny_gpt(), steps=20)
    straight.fit()
    first = trainer(tiny_gpt(), steps=20)
    first.fit(steps=10)
    first.save(tmp_path / "ckpt.pt")
    torch.manual_seed(123)  # disturb every random stream before resuming
    resumed = trainer(tiny_gpt(seed=5), steps=20)
    resumed.load(tmp_path / "ckpt.pt")
    assert resumed.step == 10
    resumed.fit()
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    assert straight.history.val_loss == resumed.history.val_loss


def test_interrupted_save_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    t = trainer(tiny_gpt(), steps=10)
    t.fit(steps=5)
    path = t.save(tmp_path / "ckpt.pt")
    good = path.read_bytes()
    t.fit()

    class Interrupted(io.FileIO):  # interrupted halfway through writing the file
        def write(self, data):
            super().write(bytes(data[: len(data) // 2]))
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "open", Interrupted, raising=False)
    with pytest.raises(KeyboardInterrupt):
        t.save(path)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # no temporary file left behind
    monkeypatch.undo()
    fresh = trainer(tiny_gpt(), steps=10)
    fresh.load(path)
    assert fresh.step == 5


def test_checkpoint_for_another_config_is_rejected(tmp_path):
    t = trainer(tiny_gpt(), steps=4)
    t.fit()
    t.save(tmp_path / "ckpt.pt")
    other = trainer(tiny_gpt(norm="rmsnorm"), steps=4)
    with pytest.raises(CheckpointError, match=r"ckpt.pt: .*another model config .*'norm': \('layernorm', 'rmsnorm'\)"):
        other.load(tmp_path / "ckpt.pt")
    assert other.step == 0  # and nothing was loaded


@pytest.mark.parametrize(
    "bad",
    [
        {"max_steps": 0},
        {"max_steps": -5},
        {"max_steps": 2.5},
        {"max_steps": True},
        {"eval_interval": 0},
        {"log_interval": 0},
        {"log_interval": 10.0},
        {"warmup_steps": -1},
        {"lr": 0.0},
        {"lr": -1e-3},
        {"lr": "1e-3"},
        {"min_lr": -1e-5},
        {"lr": float("nan")},
        {"lr": float("inf")},
        {"min_lr": float("nan")},
        {"min_lr": 1e-2},  # above lr=1e-3: the "decay" would climb
        {"eval_steps": 0},
        {"weight_decay": -0.1},
        {"weight_decay": float("inf")},
        {"betas": (0.9, 1.0)},
        {"betas": (-0.1, 0.9)},
        {"betas": (0.9,)},
        {"betas": (float("nan"), 0.9)},
        {"grad_clip": 0.0},
        {"grad_clip": -1.0},
        {"grad_clip": float("nan")},
        {"grad_clip": float("inf")},
        {"seed": 1.5},
        {"seed": 2**64},
        {"amp": "yes"},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_bad_config_is_rejected_naming_the_field(bad):
    (field,) = bad
    with pytest.raises(ValueError, match=rf"\b{field}\b must be .*got {re.escape(repr(bad[field]))}"):
        TrainConfig(**bad)


def test_config_error_says_what_is_allowed_and_lists_every_problem():
    with pytest.raises(ValueError) as info:
        TrainConfig(grad_clip=-1, eval_steps=0)
    message = str(info.value)
    assert "grad_clip must be a finite number > 0 (the largest gradient norm), or None for no clipping, got -1" in (
        message
    )
    assert "eval_steps must be a positive int, got 0" in message


def test_config_is_frozen_and_normalised():
    cfg = TrainConfig(max_steps=np.int64(10), lr=1, betas=[0.8, 0.9], grad_clip=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.eval_interval = 1000
    assert type(cfg.max_steps) is int and type(cfg.lr) is float and cfg.betas == (0.8, 0.9)
    assert type(cfg.grad_clip) is float
    assert dataclasses.replace(cfg, lr=0.5).lr == 0.5
    with pytest.raises(ValueError, match="lr"):
        dataclasses.replace(cfg, lr=-0.5)  # replace validates too


def test_warmup_longer_than_the_run_is_allowed():
    """The run then ends during the warm-up: shortening a run by max_steps alone stays valid."""
    cfg = TrainConfig(max_steps=3, warmup_steps=100)
    rates = [lr_at(s, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps) for s in range(cfg.max_steps)]
    assert rates == pytest.approx([cfg.lr * (s + 1) / 100 for s in range(3)])


def test_good_config_is_accepted():
    TrainConfig(max_steps=1, lr=1e-3, min_lr=0.0, warmup_steps=0, grad_clip=None, eval_interval=1, log_interval=1)


def test_callback_runs_after_every_evaluation_in_eval_mode():
    seen = []

    def record(tr):
        seen.append((tr.step, tr.model.training, torch.is_grad_enabled(), tr.history.val_loss[-1]))

    t = trainer(tiny_gpt(), steps=20)
    t.fit(steps=10, callback=record)
    t.fit(callback=record)  # resuming does not repeat the evaluation at step 10
    assert [s for s, *_ in seen] == t.history.eval_steps == [0, 10, 20]
    assert all(not training and not grad for _, training, grad, _ in seen)
    assert [v for *_, v in seen] == t.history.val_loss
    assert t.model.training  # back to training mode after the callback


@pytest.mark.parametrize("training", [True, False])
def test_fit_trains_in_train_mode_and_restores_the_callers_mode(training):
    modes = []

    def loss_fn(model, batch):
        if torch.is_grad_enabled():  # a training step, not an evaluation
            modes.append(model.training)
        return default_loss(model, batch)

    t = trainer(tiny_gpt(), steps=4, loss_fn=loss_fn)
    t.model.train(training)
    t.fit()
    assert modes == [True] * 4
    assert t.model.training is training


def turns_bad_at(step, make_bad):
    """A loss_fn that applies ``make_bad(loss, model)`` at training step ``step`` (evaluations are left alone)."""
    calls = []

    def loss_fn(model, batch):
        loss = default_loss(model, batch)
        if not torch.is_grad_enabled():
            return loss
        calls.append(1)
        return make_bad(loss, model) if len(calls) - 1 == step else loss

    return loss_fn


def nan_gradient(loss, model):
    """The same, finite loss, but a NaN gradient: sqrt'(0) = inf, times 0."""
    weight = next(model.parameters())
    return loss + torch.sqrt(0 * weight.sum())


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_loss_stops_training_naming_the_step(value):
    t = trainer(tiny_gpt(), steps=20, loss_fn=turns_bad_at(3, lambda loss, model: loss * value))
    t.model.eval()
    with pytest.raises(NonFiniteLossError, match=r"the training loss is not finite \(NaN or inf\) at step 3 ") as info:
        t.fit()
    message = str(info.value)
    for advice in ("lower learning rate", "grad_clip", "inputs", "amp=False"):
        assert advice in message
    assert isinstance(info.value, FloatingPointError)
    assert t.step == 5  # found at the next log interval (log_interval=5), where the loop syncs anyway
    assert not t.model.training  # the caller's mode, even on the way out with an error


def test_a_non_finite_gradient_stops_training_naming_the_step():
    t = trainer(tiny_gpt(), steps=20, loss_fn=turns_bad_at(3, nan_gradient))
    with pytest.raises(NonFiniteLossError, match=r"gradient norm is not finite \(NaN or inf\) at step 3, while"):
        t.fit()


def test_with_the_fp16_scaler_a_non_finite_gradient_is_skipped_not_an_error():
    t = trainer(tiny_gpt(), steps=20, loss_fn=turns_bad_at(3, nan_gradient))
    t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)  # as on CUDA in fp16, where it skips such steps
    h = t.fit()
    assert t.step == 20 and all(math.isfinite(v) for v in h.train_loss + h.val_loss)
    assert all(torch.isfinite(p).all() for p in t.model.parameters())
    assert t.scaler.get_scale() == 2.0**7  # the one bad step lowered the scale


def test_with_the_fp16_scaler_a_non_finite_loss_is_still_an_error():
    t = trainer(tiny_gpt(), steps=20, loss_fn=turns_bad_at(7, lambda loss, model: loss * float("nan")))
    t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    with pytest.raises(NonFiniteLossError, match="loss is not finite .* at step 7 "):
        t.fit()
    assert t.step == 10


def test_a_nan_validation_loss_stops_training_before_a_saving_callback_sees_it(tmp_path):
    """Review 2026-11-25, N3: a NaN at step 4 and a callback that saves after every evaluation wrote NaN
    weights over the good checkpoint at step 6, then said "reload the last checkpoint"."""
    path = tmp_path / "ckpt.pt"
    saved_at = []

    def save(tr):
        tr.save(path)
        saved_at.append(tr.step)

    settings = dict(steps=20, eval_interval=3, log_interval=10)
    t = trainer(tiny_gpt(), loss_fn=turns_bad_at(4, lambda loss, model: loss * math.nan), **settings)
    with pytest.raises(NonFiniteLossError, match=r"training loss is not finite \(NaN or inf\) at step 4 .*reload the"):
        t.fit(callback=save)
    assert t.step == 6 and saved_at == [0, 3]  # the evaluation at step 6 raised before the callback
    assert all(math.isfinite(v) for v in t.history.val_loss)
    resumed = trainer(tiny_gpt(), **settings)
    resumed.load(path)  # the last checkpoint is one worth reloading
    assert resumed.step == 3 and all(torch.isfinite(p).all() for p in resumed.model.parameters())


def test_a_nan_validation_loss_alone_is_an_error_too():
    def nan_in_evaluation(model, batch):
        loss = default_loss(model, batch)
        return loss if torch.is_grad_enabled() else loss * math.nan

    t = trainer(tiny_gpt(), steps=20, loss_fn=nan_in_evaluation)
    with pytest.raises(NonFiniteLossError, match="the validation loss at step 0 is nan"):
        t.fit()
    assert t.history.eval_steps == t.history.val_loss == []  # nothing half-recorded


def test_fit_at_max_steps_says_how_to_train_longer():
    """Review 2026-11-25, F11: fit() and fit(n) after max_steps did nothing, silently."""
    t = trainer(tiny_gpt(), steps=4)
    t.fit()
    for steps in (None, 3):
        with pytest.raises(ValueError, match=r"already at max_steps=4 \(step 4\).*raise max_steps.*replace"):
            t.fit(steps)
    t.config = dataclasses.replace(t.config, max_steps=6)  # what the message says
    t.fit()
    assert t.step == 6 and t.history.eval_steps == [0, 4, 6]


def test_autocast_dtype_follows_the_hardware(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert autocast_dtype(torch.device("cpu")) is None  # emulated bf16 would be slower than fp32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert autocast_dtype(torch.device("cpu")) == torch.bfloat16
    assert autocast_dtype(torch.device("mps")) is None


def test_the_precision_switch_overrides_the_hardware_for_every_device(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "fp32")
    assert autocast_dtype(cpu) is None  # forced fp32 even where bf16 is native
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "auto")
    assert autocast_dtype(cpu) == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", " BF16 ")
    assert autocast_dtype(cpu) == torch.bfloat16  # forced bf16 even where it is emulated
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "fp16")
    assert autocast_dtype(torch.device("mps")) == torch.float16
    monkeypatch.delenv("TRANSFORMER_LIB_PRECISION")
    assert autocast_dtype(cpu) is None  # unset means auto, read at call time
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "fp32")
    assert autocast_dtype(cpu) is None and native_dtype(cpu) == torch.bfloat16  # the hardware, whatever is forced


@pytest.mark.parametrize(
    "cap, native",
    [
        ("AVX2", False),
        ("avx512_core_vnni", False),
        (" AVX512_CORE ", False),
        ("AVX512_CORE_BF16", True),
        ("AVX10_1_512_AMX", True),
        ("ALL", True),
        ("", True),
    ],
)
def test_auto_leaves_bf16_where_onednn_is_capped_below_it(monkeypatch, cap, native):
    monkeypatch.delenv("TRANSFORMER_LIB_PRECISION", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)  # a CPU with bf16 in hardware
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)  # ... that oneDNN may be told not to use
    cpu = torch.device("cpu")
    assert native_dtype(cpu) == (torch.bfloat16 if native else None)
    assert autocast_dtype(cpu) == native_dtype(cpu)
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "bf16")
    assert autocast_dtype(cpu) == torch.bfloat16  # forcing bf16 still forces it


def test_the_older_name_of_onednns_cap_counts_too(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "AVX2")
    assert native_dtype(torch.device("cpu")) is None


@pytest.mark.parametrize("value", ["bogus", "float32", "fp8"])
def test_an_unknown_precision_is_a_value_error_naming_the_choices(monkeypatch, value):
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", value)
    with pytest.raises(
        ValueError, match=f"TRANSFORMER_LIB_PRECISION must be one of auto, fp32, bf16, fp16, got '{value}'"
    ):
        autocast_dtype(torch.device("cpu"))


def test_the_trainer_follows_the_precision_switch(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "fp32")
    assert trainer(tiny_gpt(), steps=2).amp_dtype is None
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", "fp16")
    t = trainer(tiny_gpt(), steps=4)
    assert t.amp_dtype == torch.float16 and t.scaler.is_enabled()  # fp16 on a CPU: with its loss scaler
    t.fit()
    assert t.step == 4


@pytest.mark.slow
def test_cpu_mixed_precision_multiplies_in_bf16_and_learns_like_fp32(monkeypatch):
    monkeypatch.setattr(training, "autocast_dtype", lambda device: torch.bfloat16)  # also on CPUs without it
    model = tiny_gpt()
    seen = []
    model.blocks[0].ff.linear1.register_forward_hook(lambda module, inputs, out: seen.append(out.dtype))
    mixed = trainer(model, steps=60)
    assert mixed.amp_dtype == torch.bfloat16
    h = mixed.fit()
    assert seen[0] == torch.bfloat16  # the MLP multiplied in bf16 ...
    assert all(p.dtype == torch.float32 for p in model.parameters())  # ... while the weights stay fp32
    x, _ = batches(torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(x)
    assert logits.dtype == torch.float32  # and so do the logits: the output projection is not rounded
    full = trainer(tiny_gpt(), steps=60, amp=False)
    assert full.amp_dtype is None
    h32 = full.fit()
    assert h.val_loss[-1] < h.val_loss[0] - 0.5
    assert abs(h.val_loss[-1] - h32.val_loss[-1]) < 0.1, (h.val_loss, h32.val_loss)


def test_the_default_loss_is_the_second_output_of_forward_x_y():
    model, x = tiny_gpt(dropout=0.0), torch.randint(0, 7, (2, 16))
    calls = []

    class Spy(torch.nn.Module):  # any model whose forward(x, y) returns (logits, loss)
        def forward(self, x, y):
            calls.append((x, y))
            return None, torch.tensor(1.5)

    assert default_loss(Spy(), (x, x + 1)).item() == 1.5
    assert len(calls) == 1 and torch.equal(calls[0][1], x + 1)
    assert torch.equal(default_loss(model, (x, x)), model(x, x)[1])


def test_how_a_run_executes_is_the_trainers_not_the_configs():
    """compile belongs to the Trainer (a bool or torch.compile's mode), the progress bar to fit; neither is a
    field of TrainConfig, which says what a run computes (and a checkpoint compares)."""
    for name in ("compile", "progress", "cuda_graph"):
        assert name not in {f.name for f in dataclasses.fields(TrainConfig)}
    model = tiny_gpt(dropout=0.0)
    assert not trainer(model).compiled and trainer(model).forward_model is model
    for compile in (True, "reduce-overhead"):
        t = trainer(model, compile=compile)  # torch.compile is lazy: nothing is compiled until a step
        assert t.compiled and t.forward_model is not model
    for bad in (1, None, 0.5):
        with pytest.raises(TypeError, match="compile must be True, False or a torch.compile mode"):
            trainer(model, compile=bad)
    t = trainer(model, steps=2)
    with pytest.raises(TypeError, match="progress must be True or False, got 1"):
        t.fit(progress=1)
    assert t.step == 0


@pytest.mark.slow
def test_compiled_training_follows_the_eager_run_and_saves_plain_weights(tmp_path):
    """Trainer(compile=True) trains the same parameters through torch.compile: the same losses and
    weights as eager training (up to the fused kernels' rounding), and a checkpoint without the wrapper's
    ``_orig_mod.`` names, loadable by an eager trainer."""
    # fp32 (amp=False) on every CPU: under bf16 autocast the compiled kernels round differently from eager ones
    eager = trainer(tiny_gpt(dropout=0.0), steps=6, amp=False)
    compiled = trainer(tiny_gpt(dropout=0.0), steps=6, compile=True, amp=False)
    assert compiled.forward_model is not compiled.model  # the wrapper, sharing its parameters
    bad = torch.full((2, 16), 7)
    with pytest.raises(ValueError, match="token id 7, outside the vocabulary"):  # checked under compile too
        compiled.forward_model(bad, bad)
    h_eager, h_compiled = eager.fit(), compiled.fit()
    np.testing.assert_allclose(h_compiled.train_loss, h_eager.train_loss, rtol=1e-4)
    for (name, a), b in zip(eager.model.state_dict().items(), compiled.model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
    compiled.save(tmp_path / "ckpt.pt")
    resumed = trainer(tiny_gpt(dropout=0.0), steps=6, amp=False)  # compile may differ on a resume; amp may not
    resumed.load(tmp_path / "ckpt.pt")
    assert resumed.step == 6
    torch.testing.assert_close(resumed.model.state_dict(), compiled.model.state_dict())


@pytest.mark.slow
def test_a_gpt_compiled_block_by_block_traces_one_block_and_trains_as_the_eager_one():
    """Regional compilation, as chapter 8's compiled race does it: ``block.compile()`` on each block, in place.
    The blocks run the same code on weights of the same shapes, so one traced graph serves all of them (what
    the chapter tells), and the steps give the eager steps' losses and weights up to the fused kernels' rounding."""
    eager, regional = tiny_gpt(dropout=0.0, n_layers=3), tiny_gpt(dropout=0.0, n_layers=3)
    for block in regional.blocks:
        block.compile()
    runs = [trainer(model, steps=5, amp=False) for model in (eager, regional)]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        batch = batches(g)
        losses = [run.train_step(batch).item() for run in runs]
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # three blocks, one graph
    for (name, a), b in zip(eager.state_dict().items(), regional.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)  # and the state's names are the model's


def test_the_update_is_fused_on_one_cpu_process():
    """make_optimizer fuses AdamW's update on a device (one process here); under DDP on a CPU it does not
    (asserted inside the torchrun worker of test_distributed.py)."""
    assert make_optimizer(tiny_gpt(), 1e-3, 0.1, device=torch.device("cpu")).defaults["fused"]
    assert not make_optimizer(tiny_gpt(), 1e-3, 0.1).defaults["fused"]


def test_a_clipped_step_equals_pytorchs_loop_to_the_last_bit():
    """The Trainer clips over the parameters it was built with (a list kept from construction, in the
    model's order): the same norm, so the same weights, as clip_grad_norm_(model.parameters()) in a
    plain loop with the same AdamW, clipping at every step (max norm 0.05). Both in fp32: on a CPU with
    native bf16 the Trainer's default amp=True would train in bf16, and the loop does not."""
    model_a, model_b = tiny_gpt(0, dropout=0.0), tiny_gpt(0, dropout=0.0)
    t = trainer(model_a, steps=5, grad_clip=0.05, warmup_steps=0, min_lr=1e-3, lr=1e-3, amp=False)
    opt = training.make_optimizer(model_b, 1e-3, t.config.weight_decay, t.config.betas, torch.device("cpu"))
    g = torch.Generator().manual_seed(7)
    norms = []
    for _ in range(5):
        x, y = batches(g)
        t.train_step((x, y))
        opt.zero_grad(set_to_none=True)
        model_b(x, y)[1].backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model_b.parameters(), 0.05, foreach=True))
        opt.step()
    assert min(norms) > 0.05  # every step clipped
    for p, q in zip(model_a.parameters(), model_b.parameters(), strict=True):
        assert torch.equal(p, q)


PAGE_FAULTS_PROBE = """\
import ctypes, resource, sys
import torch
from transformer_lib import GPT, GPTConfig, training
from transformer_lib.text import random_blocks
from transformer_lib.notebook.environment import _M_MMAP_THRESHOLD, keep_freed_memory
# glibc's defaults fault a step's pages in anew in some runs and not in others (its threshold moves):
# fix the threshold at its starting value, 128 KiB, so that they do in every run.
ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, 128 << 10)
if sys.argv[1] == "with":
    assert keep_freed_memory()  # as setup_chapter does on a CPU
torch.set_num_threads(1)
torch.manual_seed(0)
data = torch.randint(0, 65, (20_000,))
model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layers=2, n_heads=4, d_model=128))
config = training.TrainConfig(max_steps=60, eval_interval=60, eval_steps=1, amp=False)
trainer = training.Trainer(model, config, lambda g: random_blocks(data, 16, 64, g), device="cpu")
trainer.fit(20, progress=False)  # the first steps fault their pages in either way
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
trainer.fit(30, progress=False)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 30)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library is not glibc: nothing to keep")
@pytest.mark.slow
def test_keeping_freed_memory_makes_a_cpu_trainers_steps_fault_no_pages():
    # In a fresh process each: this process's allocator may already be set (setup_chapter, earlier tests).
    faults = {}
    for how in ("with", "without"):
        done = subprocess.run([sys.executable, "-c", PAGE_FAULTS_PROBE, how], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        faults[how] = float(done.stdout.split()[-1])
    # Measured here: 0.03-26 a step with it (the machine's own reclaim can take a page back now and then),
    # thousands without (activations of 512 KiB-2 MiB mapped anew).
    assert faults["with"] < 60, faults
    assert faults["without"] > 300, faults  # the probe can tell


def test_keep_freed_memory_changes_nothing_where_the_c_library_is_not_glibc(monkeypatch):
    monkeypatch.setattr(environment.sys, "platform", "darwin")
    environment.keep_freed_memory.cache_clear()
    try:
        assert environment.keep_freed_memory() is False
    finally:
        environment.keep_freed_memory.cache_clear()


@pytest.mark.parametrize("device, kept", [("cpu", True), ("cuda", False)])
def test_setup_chapter_keeps_freed_memory_on_a_cpu_only(monkeypatch, capsys, device, kept):
    calls = []
    monkeypatch.setattr(environment, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(environment, "get_device", lambda: torch.device(device))
    monkeypatch.setattr(environment, "threads_for_a_busy_cpu", lambda: torch.get_num_threads())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "a GPU")
    assert environment.setup_chapter(seed=None) == torch.device(device)
    assert calls == ([1] if kept else [])
