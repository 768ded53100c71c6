"""Trainer checkpoints: atomic and concurrent saves, integrity checks, all-or-nothing loads, and many
save/resume cycles that end bit-identical to an uninterrupted run."""

import copy
import errno
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import transformer_lib
from transformer_lib import GPT, GPTConfig, checkpoint
from transformer_lib.checkpoint import CheckpointError
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer

DATA = torch.arange(400) % 7
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _one_thread():
    """Models this small gain nothing from a second thread, and lose a lot on a busy CPU (CI runs in parallel)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def batches(generator):
    return random_blocks(DATA, 4, 16, generator)


def trainer(seed=0, steps=20, norm="layernorm", **kw):
    """A tiny trainer; dropout is on, so resuming must restore torch's random state too."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=0.1, norm=norm))
    settings = dict(max_steps=steps, lr=3e-3, warmup_steps=5, eval_interval=10, eval_steps=2, log_interval=5)
    return Trainer(model, TrainConfig(**{**settings, **kw}), batches, batches, device="cpu")


def trained(steps, **kw):
    t = trainer(**kw)
    t.fit(steps=steps, progress=False)
    return t


def snapshot(t):
    """Everything a load could change, copied (the history's wall-clock seconds aside)."""
    state = t.state_dict()
    state["history"].pop("train_seconds")
    return copy.deepcopy(state)


def same(a, b):
    """Exact equality of nested dicts, lists and tensors (bit for bit, dtype and shape included)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def assert_rejected(t, path, pattern, error=CheckpointError):
    """Loading ``path`` into ``t`` raises ``error`` naming the file, and changes nothing."""
    before, optimizer = snapshot(t), t.optimizer
    with pytest.raises(error, match=pattern) as info:
        t.load(path)
    assert str(path) in str(info.value)
    assert same(snapshot(t), before) and t.optimizer is optimizer


@pytest.fixture
def saved(tmp_path):
    """A checkpoint after 10 steps, and a trainer after 5 that would change if it were loaded."""
    path = trained(10).save(tmp_path / "ckpt.pt")
    return path, trained(5)


def test_a_round_trip_is_bit_exact(tmp_path):
    t = trained(10)
    t.save(tmp_path / "ckpt.pt")
    fresh = trainer(seed=7)
    fresh.load(tmp_path / "ckpt.pt")
    assert same(snapshot(fresh), snapshot(t))


@pytest.mark.slow
def test_save_resume_cycles_end_bit_identical_to_an_uninterrupted_run(tmp_path):
    plan = [1 + i % 2 for i in range(20)]  # train 1 or 2 steps between resumes
    settings = dict(steps=sum(plan), log_interval=1)  # every step's loss is in the history
    straight = trainer(**settings)
    straight.fit(progress=False)
    path, t = tmp_path / "ckpt.pt", trainer(**settings)
    for cycle, steps in enumerate(plan):
        t.save(path)
        t = trainer(seed=100 + cycle, **settings)  # fresh: other weights, other random streams
        t.load(path)
        t.fit(steps=steps, progress=False)
    assert t.step == straight.step == sum(plan) and len(t.history.train_loss) == sum(plan)
    assert same(snapshot(t), snapshot(straight))  # weights, optimizer moments, losses, random streams


@pytest.mark.slow
def test_two_processes_saving_to_one_path_leave_one_whole_checkpoint(tmp_path):
    package_root = Path(transformer_lib.__file__).resolve().parents[1]  # the same transformer_lib as here
    script = f"""
import sys
sys.path[:0] = [{str(package_root)!r}, {str(TESTS)!r}]
from test_checkpoints import trained
t = trained(int(sys.argv[1]))
for _ in range(15):
    t.save(sys.argv[2])
"""
    path = tmp_path / "ckpt.pt"
    writers = [
        subprocess.Popen([sys.executable, "-c", script, str(steps), str(path)], stderr=subprocess.PIPE, text=True)
        for steps in (4, 6)
    ]
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left behind
    resumed = trainer(seed=3)
    resumed.load(path)
    assert resumed.step in (4, 6)


def test_a_full_disk_keeps_the_last_checkpoint_and_leaves_no_temporary(tmp_path, monkeypatch):
    t = trained(5)
    path = t.save(tmp_path / "ckpt.pt")
    good = path.read_bytes()
    t.fit(steps=1, progress=False)

    class FullDisk(io.FileIO):  # the disk fills up a few hundred bytes into the file
        def write(self, data):
            super().write(bytes(data[:300]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "open", FullDisk, raising=False)
    with pytest.raises(OSError) as info:
        t.save(path)
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_weights_that_are_not_finite_are_never_saved_nor_loaded(tmp_path):
    """Review 2026-11-25, N3: a trainer whose weights had turned NaN saved them over the last good checkpoint."""
    t = trained(5)
    path = t.save(tmp_path / "ckpt.pt")
    good = path.read_bytes()
    weight = t.model.tok_emb.weight
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"not saving .*ckpt.pt: .* not finite \(NaN or inf\): tok_emb.weight"):
        t.save(path)
    with torch.no_grad():
        weight[0, 0] = 0.0
    t.optimizer.state[weight]["exp_avg_sq"][0, 0] = float("inf")
    with pytest.raises(CheckpointError, match="the optimizer's exp_avg_sq of parameter"):
        t.save(path)
    assert path.read_bytes() == good
    state = checkpoint.load(path)
    state["model"]["tok_emb.weight"][3, 1] = float("nan")
    checkpoint.save(state, path)  # written by hand: save refuses nothing
    assert_rejected(trained(2), path, r"holds weights that are not finite \(NaN or inf\): tok_emb.weight")


def test_a_resume_under_another_train_config_names_each_difference(saved):
    """Review 2026-11-25, F7: a resume with grad_accum 1 -> 4, max_steps 20 -> 100 and lr x 50 was accepted silently."""
    path, _ = saved
    other = trainer(steps=100, lr=0.15, grad_accum_steps=4, weight_decay=0.5)
    with pytest.raises(CheckpointError, match="was written under another TrainConfig") as info:
        other.load(path)
    for difference in (
        "max_steps: 20 in the checkpoint, 100 here",
        "lr: 0.003 in the checkpoint, 0.15 here",
        "weight_decay: 0.1 in the checkpoint, 0.5 here",
        "grad_accum_steps: 1 in the checkpoint, 4 here",
        "load(path, allow_config_change=True)",
    ):
        assert difference in str(info.value)
    assert other.step == 0
    other.load(path, allow_config_change=True)  # this trainer's config wins, the optimizer's settings too
    assert other.step == 10 and other.config.max_steps == 100
    assert [g["weight_decay"] for g in other.optimizer.param_groups] == [0.5, 0.0]
    other.fit(steps=1, progress=False)
    assert other.step == 11


def _moments_of_another_shape(state):
    state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(3)


BROKEN = {
    "a weight of another shape": (lambda s: s["model"].update({"tok_emb.weight": torch.zeros(1)}), "does not fit"),
    "a key missing": (lambda s: s.pop("history"), "is not a trainer state"),
    "optimizer moments of another shape": (_moments_of_another_shape, r"exp_avg of shape \(3,\) no weight has"),
    "another model config": (lambda s: s["model_config"].update(norm="rmsnorm"), "another model config"),
    "another number of processes": (lambda s: s["generators"].append(s["generators"][0]), "by 2 process"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_state_leaves_the_trainer_as_it_was(saved, case):
    path, t = saved
    change, pattern = BROKEN[case]
    state = checkpoint.load(path)
    change(state)
    checkpoint.save(state, path)
    assert_rejected(t, path, pattern)
    t.fit(steps=1, progress=False)  # and it still trains
    assert t.step == 6


@pytest.mark.parametrize("keep", [0.5, 0.99, 0.0])
def test_a_truncated_file_is_a_checkpoint_error(saved, keep):
    path, t = saved
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    assert_rejected(t, path, "cannot be read: it is truncated, corrupted")


def test_a_flipped_byte_is_a_checkpoint_error(saved):
    path, t = saved
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the weights
    path.write_bytes(bytes(data))
    assert_rejected(t, path, "is corrupted: entry .* fails its checksum")


def test_a_missing_file_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint file at"):
        trainer().load(tmp_path / "nowhere.pt")


@pytest.mark.parametrize("content", [[1, 2, 3], "state_dict"], ids=["a list", "a model's state_dict"])
def test_a_file_that_is_not_a_trainer_state_is_a_checkpoint_error(saved, content):
    path, t = saved
    torch.save(t.model.state_dict() if content == "state_dict" else content, path)
    assert_rejected(t, path, "holds a list, not a trainer state" if content != "state_dict" else "not a trainer state")


def test_compressed_entries_are_refused_before_anything_is_inflated(saved, monkeypatch):
    """Audit L6: a deflated checkpoint of 0.5 MB could take 1 GiB to inflate before any check. torch.save
    stores its entries: one that is compressed is refused from the archive's directory alone."""
    path, t = saved
    deflated = path.with_name("deflated.pt")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    opened = []
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, *a, **kw: opened.append(a) or pytest.fail("inflated"))
    monkeypatch.setattr(torch, "load", lambda *a, **kw: opened.append(a) or pytest.fail("torch.load"))
    assert_rejected(t, deflated, "has compressed entries")
    assert opened == []
