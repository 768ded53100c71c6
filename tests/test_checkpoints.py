"""Trainer checkpoints: the file format, atomic and concurrent saves, integrity checks, all-or-nothing
loads, and many save/resume cycles that end bit-identical to an uninterrupted run."""

import copy
import dataclasses
import errno
import hashlib
import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import transformer_lib
from transformer_lib import GPT, GPTConfig, checkpoint
from transformer_lib.checkpoint import CHECKPOINT_FORMAT, CheckpointError
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


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=7, block_size=16, n_layers=1, n_heads=2, d_model=16, dropout=0.1))


def trainer(seed=0, steps=20, **kw):
    """A tiny trainer; dropout is on, so resuming must restore torch's random state too."""
    settings = dict(max_steps=steps, lr=3e-3, warmup_steps=5, eval_interval=10, eval_steps=2, log_interval=5)
    cfg = TrainConfig(**{**settings, "progress": False, **kw})
    return Trainer(tiny_gpt(seed), cfg, batches, batches, device="cpu", count=lambda b: b[0].numel())


def trained(steps, **kw):
    t = trainer(**kw)
    t.fit(steps=steps)
    return t


def same(a, b):
    """Exact equality of nested dicts, lists and tensors (bit for bit, dtype and shape included)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def snapshot(t):
    """Everything a load could change, copied."""
    history = dataclasses.asdict(t.history)
    del history["train_seconds"]  # wall-clock time: never the same twice
    return copy.deepcopy(
        {
            "model": t.model.state_dict(),
            "optimizer": t.optimizer.state_dict(),
            "scaler": t.scaler.state_dict(),
            "step": t.step,
            "history": history,
            "generator": t.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
    )


def unpack(path):
    """The trainer state inside a checkpoint file, read the documented way."""
    outer = torch.load(path, weights_only=True)
    return torch.load(io.BytesIO(outer["payload"].numpy().tobytes()), weights_only=True)


def repack(state, path):
    """Write ``state`` as a checkpoint with a valid checksum: for checkpoints whose content is wrong."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    torch.save({"format": CHECKPOINT_FORMAT, "sha256": hashlib.sha256(data).hexdigest(), "payload": payload}, path)


def assert_rejected(t, path, pattern):
    """Loading ``path`` into ``t`` raises a CheckpointError naming the file, and changes nothing."""
    before = snapshot(t)
    optimizer = t.optimizer
    with pytest.raises(CheckpointError, match=pattern) as info:
        t.load(path)
    assert isinstance(info.value, ValueError)
    assert str(path) in str(info.value)
    assert same(snapshot(t), before)
    assert t.optimizer is optimizer
    return info.value


# ------------------------------------------------------------------ the format


def test_the_file_holds_a_format_a_checksum_and_the_payload(tmp_path):
    path = trained(10).save(tmp_path / "ckpt.pt")
    outer = torch.load(path, weights_only=True)
    assert sorted(outer) == ["format", "payload", "sha256"]
    assert outer["format"] == "transformer_lib.checkpoint/1" == CHECKPOINT_FORMAT
    payload = outer["payload"]
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert outer["sha256"] == hashlib.sha256(payload.numpy().tobytes()).hexdigest()
    state = unpack(path)
    assert state["step"] == 10 and state["train_config"]["max_steps"] == 20


def test_a_round_trip_is_bit_exact(tmp_path):
    t = trained(10)
    t.save(tmp_path / "ckpt.pt")
    fresh = trainer(seed=7)
    fresh.load(tmp_path / "ckpt.pt")
    assert same(snapshot(fresh), snapshot(t))


# ------------------------------------------------------------------ saving


def test_two_saves_to_one_path_at_once_leave_one_whole_checkpoint(tmp_path, monkeypatch):
    """One writer pauses halfway through its file while another saves to the same path."""
    path = tmp_path / "ckpt.pt"
    slow, fast = trained(10), trained(5)
    half_written, fast_done = threading.Event(), threading.Event()

    class Pausing(io.FileIO):  # the file a save writes to; in the thread "slow", it pauses halfway
        def write(self, data):
            if threading.current_thread().name != "slow":
                return super().write(data)
            super().write(bytes(data[: len(data) // 2]))
            self.flush()
            half_written.set()
            assert fast_done.wait(30)
            return super().write(bytes(data[len(data) // 2 :])) + len(data) // 2

    errors = []

    def save_slowly():
        try:
            slow.save(path)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            half_written.set()

    monkeypatch.setattr(checkpoint, "open", Pausing, raising=False)
    writer = threading.Thread(target=save_slowly, name="slow")
    writer.start()
    assert half_written.wait(30)
    try:
        fast.save(path)
    finally:
        fast_done.set()
        writer.join(30)
    monkeypatch.undo()
    assert not errors, errors
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left behind
    resumed = trainer(seed=3)
    resumed.load(path)
    assert resumed.step == 10  # the last rename wins, whole


@pytest.mark.slow
def test_two_processes_saving_to_one_path_leave_one_whole_checkpoint(tmp_path):
    package_root = Path(transformer_lib.__file__).resolve().parents[1]  # the same transformer_lib as here
    script = f"""
import sys
import torch
sys.path[:0] = [{str(package_root)!r}, {str(TESTS)!r}]
from test_checkpoints import trained
torch.set_num_threads(1)
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
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    resumed = trainer(seed=3)
    resumed.load(path)
    assert resumed.step in (4, 6)


def test_a_full_disk_names_the_file_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """Review 2026-11-25, N7: a full disk gave "RuntimeError: [enforce fail at inline_container.cc:672] .
    unexpected pos 832 vs 726", with no path and no "disk full"."""
    t = trained(5)
    path = t.save(tmp_path / "ckpt.pt")
    good = path.read_bytes()
    t.fit(steps=1)

    class FullDisk(io.FileIO):  # the disk fills up a few hundred bytes into the file
        def write(self, data):
            super().write(bytes(data[:300]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "open", FullDisk, raising=False)
    expected = re.escape(f"No space left on device writing checkpoint {path}; the file there is unchanged")
    with pytest.raises(OSError, match=expected) as info:
        t.save(path)
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_a_save_removes_the_temporaries_of_killed_saves(tmp_path, monkeypatch):
    """Review 2026-11-25, N8: every kill -9 during a save left a full-size ``ckpt.pt.<uuid>.tmp`` for ever.
    A save now removes those of its path that are over a minute old and whose writer no longer runs."""
    path = tmp_path / "ckpt.pt"
    temporaries = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: temporaries.append(Path(src).name) or real_replace(src, dst))
    t = trained(2)
    t.save(path)
    monkeypatch.undo()
    assert re.fullmatch(rf"ckpt\.pt\.{os.getpid()}\.[0-9a-f]+\.tmp", temporaries[0])  # the writer's pid is in the name

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a process that has ended
    names = {
        f"ckpt.pt.{dead}.0a1b2c.tmp": ("killed", True),
        "ckpt.pt.9f86d081884c7d659a2feaa0c55ad015.tmp": ("killed, named by an older transformer_lib", True),
        f"ckpt.pt.{os.getpid()}.3d4e5f.tmp": ("its writer still runs", False),
        f"other.pt.{dead}.0a1b2c.tmp": ("another file's", False),
        f"ckpt.pt.{dead}.6a7b8c.tmp": ("too recent to judge (a writer on another machine?)", False),
    }
    an_hour_ago = time.time() - 3600
    for name in names:
        (tmp_path / name).write_bytes(b"half a checkpoint")
        if "6a7b8c" not in name:
            os.utime(tmp_path / name, (an_hour_ago, an_hour_ago))
    t.save(path)
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"ckpt.pt"} | {name for name, (_, removed) in names.items() if not removed}, left


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    """Review 2026-11-25, N3: a trainer whose weights had turned NaN saved them over the last good checkpoint."""
    t = trained(5)
    path = t.save(tmp_path / "ckpt.pt")
    good = path.read_bytes()
    t.fit(steps=1)
    weight = t.model.tok_emb.weight
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"not saving .*ckpt.pt: .* not finite \(NaN or inf\): tok_emb.weight"):
        t.save(path)
    assert path.read_bytes() == good
    with torch.no_grad():
        weight[0, 0] = 0.0
    t.optimizer.state[weight]["exp_avg_sq"][0, 0] = float("inf")
    with pytest.raises(CheckpointError, match="the optimizer's exp_avg_sq of parameter"):
        t.save(path)
    assert path.read_bytes() == good


def test_a_checkpoint_with_weights_that_are_not_finite_is_refused(saved):
    path, t = saved
    state = unpack(path)
    state["model"]["tok_emb.weight"][3, 1] = float("nan")
    repack(state, path)
    assert_rejected(t, path, r"holds weights that are not finite \(NaN or inf\): tok_emb.weight")


def test_a_resume_under_another_train_config_names_each_difference(saved):
    """Review 2026-11-25, F7: a resume with grad_accum 1 -> 4, max_steps 20 -> 100 and lr x 50 was accepted silently."""
    path, _ = saved
    other = trainer(steps=100, lr=0.15, grad_accum_steps=4, weight_decay=0.5)
    error = assert_rejected(other, path, "was written under another TrainConfig")
    for difference in (
        "max_steps: 20 in the checkpoint, 100 here",
        "lr: 0.003 in the checkpoint, 0.15 here",
        "weight_decay: 0.1 in the checkpoint, 0.5 here",
        "grad_accum_steps: 1 in the checkpoint, 4 here",
        "load(path, allow_config_change=True)",
    ):
        assert difference in str(error)
    other.load(path, allow_config_change=True)  # this trainer's config wins, the optimizer's settings too
    assert other.step == 10 and other.config.max_steps == 100
    assert [g["weight_decay"] for g in other.optimizer.param_groups] == [0.5, 0.0]
    other.fit(steps=1)
    assert other.step == 11


def test_a_resume_may_change_how_the_run_is_shown_and_executed(saved):
    path, _ = saved
    t = trainer(progress=True, compile=True, cuda_graph=True)  # not what is computed: accepted
    t.load(path)
    assert t.step == 10


def test_a_checkpoint_holds_the_optimizer_as_a_step_run_as_usual_leaves_it(tmp_path):
    """A CUDA graph's replayed steps (transformer_lib.cuda_graphs) keep the learning rate in a device tensor
    and make the optimizer capturable, which a CPU's AdamW refuses: the file holds plain values, and a CPU
    trainer resumes from it as from a file written by plain steps."""
    graphed, plain = trained(10), trained(10)
    for group in graphed.optimizer.param_groups:  # as the graph leaves them (on a CPU here: the file is the point)
        group.update(lr=torch.tensor(group["lr"]), capturable=True)
    saved = checkpoint.load_checkpoint(graphed.save(tmp_path / "graphed.pt"))["optimizer"]["param_groups"]
    expected = checkpoint.load_checkpoint(plain.save(tmp_path / "plain.pt"))["optimizer"]["param_groups"]
    assert saved == expected and all(type(g["lr"]) is float and g["capturable"] is False for g in saved)
    assert torch.is_tensor(graphed.optimizer.param_groups[0]["lr"])  # the trainer's own groups are untouched
    resumed = {name: trainer() for name in ("graphed", "plain")}
    for name, t in resumed.items():  # each load restores the random states too: the same dropout masks
        t.load(tmp_path / f"{name}.pt")
        t.fit(steps=2)
    assert resumed["graphed"].history.train_loss == resumed["plain"].history.train_loss


# ------------------------------------------------------------------ damaged or foreign files


@pytest.fixture
def saved(tmp_path):
    """A checkpoint after 10 steps, and a trainer after 5 that would change if it were loaded."""
    path = trained(10).save(tmp_path / "ckpt.pt")
    return path, trained(5)


def test_a_flipped_byte_is_detected(saved):
    path, t = saved
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the weights
    path.write_bytes(bytes(data))
    assert_rejected(t, path, r"is truncated or corrupted \(checksum mismatch")


@pytest.mark.parametrize("keep", [0.5, 0.99, 0.0])
def test_a_truncated_file_is_detected(saved, keep):
    path, t = saved
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    assert_rejected(t, path, r"cannot be read: it is truncated, corrupted, or not a file written by torch.save \(")


def test_a_plain_state_dict_is_named_as_such(saved):
    path, t = saved
    torch.save(tiny_gpt().state_dict(), path)
    assert_rejected(t, path, r"is not a transformer_lib checkpoint but a plain state_dict .*model.load_state_dict")


def test_a_trainer_state_without_checksum_is_named_as_such(saved):
    path, t = saved
    torch.save(trained(3).state_dict(), path)  # what Trainer.save wrote before checkpoints had a format
    assert_rejected(t, path, "is a Trainer state without format and checksum")


@pytest.mark.parametrize(
    "content", [os.urandom(4096), b"step: 10\n", b"PK\x03\x04" + os.urandom(100)], ids=["random", "text", "zip"]
)
def test_a_file_of_another_kind_is_rejected(saved, content):
    path, t = saved
    path.write_bytes(content)
    assert_rejected(t, path, "cannot be read: ")


def test_other_torch_files_and_formats_are_rejected(saved):
    path, t = saved
    torch.save([1, 2, 3], path)
    assert_rejected(t, path, r"is not a transformer_lib checkpoint \(it holds a list\)")
    torch.save({"format": "transformer_lib.checkpoint/2", "sha256": "", "payload": torch.zeros(1)}, path)
    assert_rejected(t, path, "has format 'transformer_lib.checkpoint/2'; this transformer_lib reads")


def test_a_missing_file_is_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint file at"):
        trainer().load(tmp_path / "nowhere.pt")


# ------------------------------------------------------------------ all or nothing


def first_weight(state):
    return next(iter(state["model"]))


BROKEN = {
    "an optimizer moment missing": (
        lambda s: s["optimizer"]["state"][0].pop("exp_avg_sq"),
        r"optimizer state whose exp_avg_sq for a parameter of shape \(7, 16\) is None",
    ),
    "an optimizer moment of another shape": (
        lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)),
        r"exp_avg for a parameter of shape \(7, 16\) is a tensor of shape \(3,\)",
    ),
    "an optimizer group missing": (
        lambda s: s["optimizer"]["param_groups"].pop(),
        "optimizer state that does not fit this model",
    ),
    "an optimizer without state": (lambda s: s["optimizer"].pop("state"), "optimizer state that does not fit"),
    "optimizer state for an unknown parameter": (
        lambda s: s["optimizer"]["state"].update({999: {}}),
        "optimizer state for parameter 999",
    ),
    "a weight missing": (lambda s: s["model"].pop(first_weight(s)), r"missing weights \['tok_emb.weight'\]"),
    "a weight of another shape": (
        lambda s: s["model"].update({first_weight(s): torch.zeros(1)}),
        r"has tok_emb.weight as a tensor of shape \(1,\); the model's has shape \(7, 16\)",
    ),
    "no history": (lambda s: s.pop("history"), "is incomplete: it has no history"),
    "a history with an unknown field": (
        lambda s: s["history"].update(bogus=1),
        "has a history that does not fit History",
    ),
    "a broken data generator state": (
        lambda s: s.update(generator=torch.zeros(3, dtype=torch.uint8)),
        "random state generator",
    ),
    "a negative step": (lambda s: s.update(step=-1), "has step -1, not an integer >= 0"),
    "an incomplete scaler state": (lambda s: s.update(scaler={"scale": 1.0}), "gradient-scaler state without"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_checkpoint_leaves_the_trainer_as_it_was(saved, case):
    path, t = saved
    change, pattern = BROKEN[case]
    state = unpack(path)
    change(state)
    repack(state, path)
    assert_rejected(t, path, pattern)
    t.fit(steps=1)  # and it still trains
    assert t.step == 6


def test_a_checkpoint_that_is_not_a_trainer_state_is_rejected(saved):
    path, t = saved
    repack([1, 2], path)
    assert_rejected(t, path, "holds a list, not a trainer state")


# ------------------------------------------------------------------ soak


@pytest.mark.slow
def test_fifty_save_resume_cycles_end_bit_identical_to_an_uninterrupted_run(tmp_path):
    plan = [1 + i % 2 for i in range(50)]  # train 1 or 2 steps between resumes
    total = sum(plan)
    settings = dict(steps=total, log_interval=1)  # every step's loss is in the history

    straight = trainer(**settings)
    straight.fit()

    path = tmp_path / "ckpt.pt"
    t = trainer(**settings)
    for cycle, steps in enumerate(plan):
        t.save(path)
        t = trainer(seed=100 + cycle, **settings)  # fresh: other weights, other random streams
        t.load(path)
        t.fit(steps=steps)

    assert t.step == straight.step == total
    assert len(t.history.train_loss) == total
    assert same(snapshot(t), snapshot(straight))  # weights, optimizer moments, losses, random streams
