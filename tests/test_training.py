import sys

import pytest
import torch

from transformer_lib import GPT, GPTConfig, training
from transformer_lib.notebook.plots import plot_history
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer, autocast_dtype, lr_at, make_optimizer

DATA = torch.arange(400) % 7  # a periodic "text": easy to learn


def batches(generator):
    return random_blocks(DATA, 8, 16, generator)


def tiny_gpt(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=0.1, **kw))


def trainer(model, steps=20, **kw):
    cfg = TrainConfig(
        max_steps=steps, lr=3e-3, warmup_steps=5, eval_interval=10, eval_steps=2, log_interval=5, progress=False, **kw
    )
    return Trainer(model, cfg, batches, batches, device="cpu", count=lambda b: b[0].numel())


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

    def crash(obj, f, *a, **k):
        with open(f, "wb") as fh:
            fh.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        t.save(path)
    assert path.read_bytes() == good
    monkeypatch.undo()
    fresh = trainer(tiny_gpt(), steps=10)
    fresh.load(path)
    assert fresh.step == 5


def test_checkpoint_for_another_config_is_rejected(tmp_path):
    t = trainer(tiny_gpt(), steps=4)
    t.fit()
    t.save(tmp_path / "ckpt.pt")
    other = trainer(tiny_gpt(norm="rmsnorm"), steps=4)
    with pytest.raises(ValueError, match=r"different model config; differing fields: \['norm', 'norm_eps'\]"):
        other.load(tmp_path / "ckpt.pt")


def test_no_host_sync_between_log_intervals(monkeypatch):
    calls = []
    item = torch.Tensor.item

    def counting_item(self):  # count the syncs our own code asks for (PyTorch's CPU AdamW has its own)
        if "transformer_lib" in sys._getframe(1).f_code.co_filename:
            calls.append(1)
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    t = trainer(tiny_gpt(), steps=20)
    t.config.eval_interval = 1000
    t.fit()
    # one .item() per log interval (4) and one per evaluation (at step 0 and at the end)
    assert len(calls) == 4 + 2, len(calls)


def _not_rejected_yet(**kw):
    return pytest.param(
        kw,
        marks=pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason="issue 11: TrainConfig accepts it"),
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"max_steps": 0},
        {"max_steps": -5},
        {"eval_interval": 0},
        {"log_interval": 0},
        {"warmup_steps": -1},
        {"lr": 0.0},
        {"lr": -1e-3},
        {"min_lr": -1e-5},
        _not_rejected_yet(lr=float("nan")),
        _not_rejected_yet(lr=float("inf")),
        _not_rejected_yet(min_lr=1e-2),  # above lr=1e-3: the "decay" would climb
        _not_rejected_yet(eval_steps=0),
        _not_rejected_yet(weight_decay=-0.1),
        _not_rejected_yet(betas=(0.9, 1.0)),
        _not_rejected_yet(grad_clip=0.0),
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_bad_config_is_rejected_naming_the_field(bad):
    (field,) = bad
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TrainConfig(**bad)


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


def test_autocast_dtype_follows_the_hardware(monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert autocast_dtype(torch.device("cpu")) is None  # emulated bf16 would be slower than fp32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert autocast_dtype(torch.device("cpu")) == torch.bfloat16
    assert autocast_dtype(torch.device("mps")) is None


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
