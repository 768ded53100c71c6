"""The speed comparison compares like with like: the same model, the same recipe, the same batches."""

import math
import re
import subprocess
import sys
import time
import timeit
from functools import partial
from pathlib import Path

import pytest
import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.notebook import benchmark
from transformer_lib.notebook.benchmark import (
    copy_bytes_per_second,
    gpt_matmul_shapes,
    library_step_products,
    matmul_flops_per_second,
    op_time_shares,
    op_times,
    train_step_flops,
)
from transformer_lib.notebook.race import Race, mean_loss, races_in_turn, train_side_by_side
from transformer_lib.notebook.reference_gpt import ReferenceGPT, reference_train_step
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer

DATA = torch.arange(600) % 11


def pair(seed=0):
    torch.manual_seed(seed)
    ours = GPT(GPTConfig(vocab_size=11, block_size=16, n_layers=2, n_heads=2, d_model=16, bias=False))
    ref = ReferenceGPT(11, 16, 2, 2, 16, bias=False)
    return ours, ref


def test_reference_is_the_same_function_as_the_library_gpt():
    ours, ref = pair()
    ref.copy_from(ours)
    x, y = random_blocks(DATA, 4, 16)
    (lo, loss_o), (lr_, loss_r) = ours(x, y), ref(x, y)
    torch.testing.assert_close(lo, lr_)
    torch.testing.assert_close(loss_o, loss_r)
    loss_o.backward()
    loss_r.backward()
    torch.testing.assert_close(ours.blocks[1].ff.linear1.weight.grad, ref.blocks[1].mlp[0].weight.grad)
    torch.testing.assert_close(ours.tok_emb.weight.grad, ref.wte.weight.grad)  # tied head included


def test_copy_from_rejects_a_different_gpt():
    _, ref = pair()
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="bias=False, learned positions"):
        ref.copy_from(
            GPT(
                GPTConfig(
                    vocab_size=11, block_size=16, n_layers=2, n_heads=2, d_model=16, bias=False, positional="rope"
                )
            )
        )
    with pytest.raises(ValueError, match=r"\(11, 16, 2, 2, 16\); got .*n_heads=4"):
        ref.copy_from(GPT(GPTConfig(vocab_size=11, block_size=16, n_layers=2, n_heads=4, d_model=16, bias=False)))


def test_the_reference_step_decays_matrices_only(monkeypatch):
    ours, ref = pair()
    made = []

    def adamw(groups, *args, **kwargs):
        made.append(([dict(g) for g in groups], kwargs))  # as given, before SGD fills in its defaults
        return torch.optim.SGD(groups, 0.1)

    trainer = Trainer(ours, TrainConfig(weight_decay=0.3), lambda g: None, device="cpu")
    monkeypatch.setattr(torch.optim, "AdamW", adamw)
    reference_train_step(ref, trainer)
    [([decay, no_decay], kwargs)] = made
    assert kwargs["weight_decay"] == 0.3 and "weight_decay" not in decay and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(ref.parameters()))


@pytest.mark.slow
def test_side_by_side_trains_both_with_one_recipe():
    ours, ref = pair()
    cfg = TrainConfig(max_steps=40, lr=3e-3, min_lr=3e-4, warmup_steps=5, amp=False)
    trainer = Trainer(ours, cfg, lambda g: random_blocks(DATA, 8, 16, g), device="cpu")
    g = torch.Generator().manual_seed(0)
    val = [random_blocks(DATA, 8, 16, g) for _ in range(4)]
    before = mean_loss(ref, val), mean_loss(ours, val)
    result = train_side_by_side(trainer, ref, lambda: random_blocks(DATA, 8, 16, g), val)
    assert trainer.step == result.steps == 40 and result.tokens_per_step == 8 * 16
    assert result.ours_val_loss < before[1] - 0.7 and result.reference_val_loss < before[0] - 0.7
    # same data, schedule and (fp32) precision: the two runs end close to each other
    assert abs(result.ours_val_loss - result.reference_val_loss) < 0.3
    assert result.ours_step > 0 and result.speedup == pytest.approx(result.reference_step / result.ours_step)
    assert ref.training and ours.training


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_side_by_side_trains_the_reference_in_the_trainers_precision(monkeypatch, precision):
    monkeypatch.setenv("TRANSFORMER_LIB_PRECISION", precision)
    ours, ref = pair()
    cfg = TrainConfig(max_steps=7)  # amp=True: TRANSFORMER_LIB_PRECISION decides
    trainer = Trainer(ours, cfg, lambda g: random_blocks(DATA, 2, 16, g), device="cpu")
    seen = set()
    ref.blocks[0].mlp[0].register_forward_hook(lambda module, args, out: seen.add(out.dtype))
    train_side_by_side(trainer, ref, lambda: random_blocks(DATA, 2, 16), [random_blocks(DATA, 2, 16)], warmup=2)
    expected = torch.float32 if precision == "fp32" else torch.bfloat16
    assert trainer.amp_dtype == (None if precision == "fp32" else torch.bfloat16)
    # the reference's products in the trainer's precision (the final evaluation runs in fp32): a row compares engines
    assert expected in seen and (precision == "bf16" or seen == {torch.float32})


def test_side_by_side_needs_steps_beyond_the_warmup():
    ours, ref = pair()
    trainer = Trainer(ours, TrainConfig(max_steps=3), lambda g: random_blocks(DATA, 2, 16, g), device="cpu")
    with pytest.raises(ValueError, match="steps must exceed warmup=5"):
        train_side_by_side(trainer, ref, lambda: random_blocks(DATA, 2, 16), [random_blocks(DATA, 2, 16)])


def test_op_time_shares_finds_the_matmul_and_prints_nothing(capfd):
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    shares = op_time_shares(lambda: (a @ b).relu())
    assert shares[0][0] == "aten::mm"
    assert sum(share for _, share in shares) == pytest.approx(1.0)
    assert any(name == "aten::relu" or name == "aten::clamp_min" for name, _ in shares)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # the profiler's own start/stop lines are silenced


def test_op_times_are_seconds_per_call_of_each_operator():
    """Five calls profiled, each operator's time divided by five: the product's time is one product's."""
    a = torch.randn(384, 384)
    times = op_times(lambda: a @ a, "cpu", repeats=5)
    (name, seconds), *_ = times
    assert name == "aten::mm"
    one = min(timeit.repeat(lambda: a @ a, number=1, repeat=20))
    assert one / 3 < seconds < one * 10, (seconds, one)  # a rate, per call: not the five calls' total
    with pytest.raises(ValueError, match="no PyTorch operators"):
        op_times(lambda: None, "cpu")
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"repeats must be a positive int, got {bad!r}"):
            op_times(lambda: a @ a, "cpu", repeats=bad)


def test_op_time_shares_drops_the_profilers_cycle_note_and_keeps_other_warnings(monkeypatch):
    """On CUDA the profiler warns that it "clears events at the end of each cycle" (chapter 8's GPU run printed it)."""
    import warnings

    import torch.profiler

    class NotingProfile(torch.profiler.profile):
        def __exit__(self, *exc):
            note = "Warning: Profiler clears events at the end of each cycle.Only events from the current cycle"
            warnings.warn(note, stacklevel=2)
            return super().__exit__(*exc)

    monkeypatch.setattr(torch.profiler, "profile", NotingProfile)
    a = torch.randn(64, 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op_time_shares(lambda: a @ a)
        warnings.warn("another warning", stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]


SCRIPT_TEXT = "To be, or not to be, that is the question.\n" * 300


def run_script(name: str, *args: str, tmp_path) -> str:
    """The last line the script prints."""
    return script_lines(name, *args, tmp_path=tmp_path)[-1]


def script_lines(name: str, *args: str, tmp_path, device: str = "cpu") -> list[str]:
    """The lines a benchmark script prints, run on a small GPT over a short text on ``device``."""
    text = tmp_path / "text.txt"
    text.write_text(SCRIPT_TEXT, encoding="utf-8")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / name),
            "--text",
            str(text),
            "--device",
            device,
            "--n-layer",
            "1",
            "--d-model",
            "32",
            "--block-size",
            "16",
            "--batch-size",
            "4",
            "--warmup",
            "2",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.benchmark
def test_train_gpt_script_prints_speed_and_loss_last(tmp_path):
    last = run_script("train_gpt.py", "--iters", "20", "--eval-iters", "2", "--eval-interval", "10", tmp_path=tmp_path)
    match = re.fullmatch(r"tokens_per_s=(\d+) val_loss=(\d+\.\d+)", last)
    assert match, last
    assert int(match[1]) > 0 and float(match[2]) < math.log(len(set(SCRIPT_TEXT)))  # below uniform guessing


@pytest.mark.benchmark
def test_compare_gpt_script_prints_each_precisions_share_of_the_bound_last(tmp_path):
    """One race per precision the machine runs natively, all in one rotation; each prints both losses (equal to
    rounding: the same weights, batches and recipe) and the bound; with two, a line compares each engine across
    the precisions; the last line gives the shares."""
    from transformer_lib.precision import native_dtype

    lines = script_lines("compare_gpt.py", "--iters", "12", tmp_path=tmp_path)
    match = re.fullmatch(r"share_of_bound fp32=(\d\.\d\d) bf16=(\d\.\d\d|none)", lines[-1])
    assert match, lines[-1]
    races = 2 if native_dtype(torch.device("cpu")) == torch.bfloat16 else 1
    assert (match[2] != "none") == (races == 2)
    assert 0 < float(match[1]) < 1.5
    losses = [float(m[1]) for line in lines if (m := re.search(r"val_loss (\d+\.\d+)", line))]
    assert len(losses) == 2 * races  # reference and library, per race
    for reference, ours in zip(losses[::2], losses[1::2], strict=True):
        assert abs(reference - ours) < 0.05
    assert sum(line.startswith("the bound: ") for line in lines) == races
    assert sum(line.startswith("racing ") and "in one rotation" in line for line in lines) == 1
    alone = r"precision alone \(.*\): library (\d+\.\d\d)x, reference (\d+\.\d\d)x"
    ratios = [(float(m[1]), float(m[2])) for line in lines if (m := re.search(alone, line))]
    assert len(ratios) == races - 1 and all(0 < r < 10 for pair in ratios for r in pair)


class FakeClock:
    """``time.perf_counter`` on a simulated machine: it moves only when the simulated work says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_best_time_warms_up_then_keeps_the_fastest_run(monkeypatch):
    from transformer_lib import utils

    clock = FakeClock()
    monkeypatch.setattr(utils.time, "perf_counter", clock)
    durations = iter([0.2, 0.03, 0.01, 0.02])  # the warm-up is the slowest; the fastest timed call is 0.01 s

    def work():
        clock.now += next(durations)

    assert utils.best_time(work, repeats=3) == pytest.approx(0.01)
    assert next(durations, "all used") == "all used"  # one warm-up call, then exactly `repeats` timed ones
    with pytest.raises(ValueError, match="repeats must be a positive int, got 0"):
        utils.best_time(work, repeats=0)


def test_num_threads_sets_the_count_inside_and_restores_the_callers_even_after_an_error():
    from transformer_lib.utils import num_threads

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with pytest.raises(KeyError):
        with num_threads(other):
            assert torch.get_num_threads() == other
            raise KeyError("inside")
    assert torch.get_num_threads() == before
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=f"n must be a positive int, got {bad!r}"):
            with num_threads(bad):
                pass
    assert torch.get_num_threads() == before


def test_train_step_flops_counts_every_product_of_forward_and_backward():
    """The count by hand: each linear's 2 M K N forward and twice that backward (input and weight
    gradients), the tied head with no separate embedding product. The CPU's fused attention kernel is
    not among the operators FlopCounterMode counts."""
    ours, ref = pair()
    B, T, d, V, L = 4, 16, 16, 11, 2
    x, y = random_blocks(DATA, B, T)
    N = B * T
    linears = 2 * N * d * (3 * d + d + 4 * d + 4 * d)  # q/k/v, out, the MLP's two
    forward = L * linears + 2 * N * d * V
    assert train_step_flops(ref, x, y) == 3 * forward
    assert train_step_flops(ours, x, y) == 3 * forward  # the same arithmetic, split into q, k and v
    assert all(p.grad is None for p in ours.parameters())  # counting leaves no gradient behind


def test_fastest_seconds_is_the_fastest_block_per_call_with_the_callers_threads():
    threads = []

    def nap():
        threads.append(torch.get_num_threads())
        time.sleep(0.002)

    seconds = benchmark._fastest_seconds(nap, seconds=0.02)
    assert 0.002 <= seconds < 1 and set(threads) == {torch.get_num_threads()}  # not Timer's default of one thread


def test_matmul_rate_is_the_products_operations_over_their_fastest_time(monkeypatch):
    shapes = gpt_matmul_shapes(64, 16, 64, 11)
    assert len(shapes) == 15 and (64, 16, 48) in shapes and (16, 64, 48) in shapes  # forward, weight gradient
    products = []
    real_matmul = torch.Tensor.__matmul__
    monkeypatch.setattr(
        torch.Tensor, "__matmul__", lambda a, b: products.append((*a.shape, b.shape[1])) or real_matmul(a, b)
    )
    monkeypatch.setattr(benchmark, "_fastest_seconds", lambda fn, seconds: (fn(), 0.5)[1])
    rate = matmul_flops_per_second(shapes, seconds=0.01)
    assert products == shapes and rate == sum(2 * m * k * n for m, k, n in shapes) / 0.5


def test_copy_bandwidth_is_the_bytes_read_and_written_over_the_fastest_copy(monkeypatch):
    copies, real_copy = [], torch.Tensor.copy_

    def copy_(dst, src, *args, **kwargs):
        copies.append(src.nbytes)
        return real_copy(dst, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    monkeypatch.setattr(benchmark, "_fastest_seconds", lambda fn, seconds: (fn(), 2e-6)[1])
    assert copy_bytes_per_second(4096) == pytest.approx(2 * 4096 / 2e-6)
    assert copies == [4096]  # the whole tensor


@pytest.mark.parametrize("kwargs", [{"n_bytes": 6}, {"n_bytes": 0}, {"n_bytes": 4.0}])
def test_copy_bandwidth_rejects_bad_sizes(kwargs):
    with pytest.raises(ValueError, match="n_bytes"):
        copy_bytes_per_second(**kwargs)


@pytest.mark.slow
def test_a_compiled_reference_trains_as_the_eager_one():
    """nanoGPT's --compile=True: torch.compile of the same model, the same losses up to rounding."""
    results = []
    for compile_reference in (False, True):
        ours, ref = pair()
        ref.copy_from(ours)
        cfg = TrainConfig(max_steps=8, warmup_steps=2, amp=False)
        trainer = Trainer(ours, cfg, lambda g: random_blocks(DATA, 4, 16, g), device="cpu")
        val = [random_blocks(DATA, 4, 16, torch.Generator().manual_seed(1))]
        draw = partial(random_blocks, DATA, 4, 16, torch.Generator().manual_seed(0))
        result = train_side_by_side(trainer, ref, draw, val, warmup=2, compile_reference=compile_reference)
        results.append(result)
    eager, compiled = results
    assert compiled.reference_val_loss == pytest.approx(eager.reference_val_loss, rel=1e-4)
    assert compiled.ours_val_loss == pytest.approx(eager.ours_val_loss, rel=1e-6)


@pytest.mark.slow  # torch.compile builds kernels
def test_mean_loss_evaluates_a_model_compiled_in_place_eagerly_and_without_gradients():
    """Evaluation compiles nothing (a compiled block would otherwise be compiled again, for eval mode) and
    records no autograd graph; the loss is the eager model's, and the model goes back to training mode."""
    ours, _ = pair()
    val = [random_blocks(DATA, 2, 16, torch.Generator().manual_seed(i)) for i in range(2)]
    expected = mean_loss(ours, val)
    for block in ours.blocks:
        block.compile()
    ours.train()
    grad_enabled = []
    ours.register_forward_pre_hook(lambda module, args: grad_enabled.append(torch.is_grad_enabled()))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert mean_loss(ours, val) == expected
    assert not torch._dynamo.utils.counters["stats"]["unique_graphs"] and grad_enabled == [False, False]
    assert ours.training
    ours(*val[0])  # outside mean_loss the blocks run compiled again
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_side_by_side_times_alongside_in_the_same_rotation():
    """``alongside`` runs once per step, taking every place in the order in turn; its median is reported."""
    ours, ref = pair()
    trainer = Trainer(ours, TrainConfig(max_steps=9, amp=False), lambda g: None, device="cpu")
    order = []
    ref.register_forward_pre_hook(lambda module, args: order.append("reference"))
    ours.register_forward_pre_hook(lambda module, args: order.append("ours"))
    val = [random_blocks(DATA, 2, 16)]
    before = len(order)
    result = train_side_by_side(
        trainer, ref, lambda: random_blocks(DATA, 2, 16), val, warmup=3, alongside=lambda: order.append("alongside")
    )
    runs = order[before : before + 27]  # 9 steps of 3 runs; the evaluation comes after
    assert [runs[i : i + 3] for i in (0, 3, 6)] == [
        ["ours", "reference", "alongside"],
        ["reference", "alongside", "ours"],
        ["alongside", "ours", "reference"],
    ]
    assert result.alongside_step is not None and result.alongside_step >= 0
    plain = train_side_by_side(
        Trainer(pair()[0], TrainConfig(max_steps=6, amp=False), lambda g: None, device="cpu"),
        pair()[1],
        lambda: random_blocks(DATA, 2, 16),
        val,
        warmup=2,
    )
    assert plain.alongside_step is None


def test_races_in_turn_rotate_every_engine_of_every_race_and_train_each_as_alone():
    """Two races in one rotation: the four engines and the alongside take every place in turn on the same
    batches, and each race ends exactly where it ends raced on its own (same weights, batches and recipe)."""

    def new_race(lr: float, alongside=None) -> Race:
        ours, ref = pair()
        cfg = TrainConfig(max_steps=10, lr=lr, warmup_steps=2, amp=False)
        return Race(Trainer(ours, cfg, lambda g: None, device="cpu"), ref, alongside)

    order = []
    races = {"a": new_race(3e-3, alongside=lambda: order.append("a alongside")), "b": new_race(1e-3)}
    for name, race in races.items():
        race.trainer.model.register_forward_pre_hook(lambda module, args, name=name: order.append(f"{name} ours"))
        race.reference.register_forward_pre_hook(lambda module, args, name=name: order.append(f"{name} reference"))

    def batches():  # the same batches at every call of a new one
        g = torch.Generator().manual_seed(1)
        return lambda: random_blocks(DATA, 4, 16, g)

    val = [random_blocks(DATA, 4, 16, torch.Generator().manual_seed(9))]
    results = races_in_turn(races, batches(), val, warmup=3)
    engines = ["a ours", "a reference", "a alongside", "b ours", "b reference"]
    assert [order[5 * i : 5 * i + 5] for i in range(5)] == [engines[i:] + engines[:i] for i in range(5)]
    assert results["a"].alongside_step is not None and results["b"].alongside_step is None
    assert results["a"].steps == results["b"].steps == 10
    for name, lr in (("a", 3e-3), ("b", 1e-3)):
        alone = new_race(lr)
        solo = train_side_by_side(alone.trainer, alone.reference, batches(), val, warmup=3)
        assert results[name].ours_val_loss == solo.ours_val_loss
        assert results[name].reference_val_loss == solo.reference_val_loss
    assert results["a"].ours_val_loss != results["b"].ours_val_loss  # two different races, not one twice


def test_races_in_turn_refuses_trainers_with_different_steps_left_or_devices():
    ours, ref = pair()
    short = Race(Trainer(ours, TrainConfig(max_steps=8), lambda g: None, device="cpu"), ref)
    ours, ref = pair()
    long = Race(Trainer(ours, TrainConfig(max_steps=9), lambda g: None, device="cpu"), ref)
    val = [random_blocks(DATA, 2, 16)]
    with pytest.raises(ValueError, match=r"different numbers of steps left \({'short': 8, 'long': 9}\)"):
        races_in_turn({"short": short, "long": long}, lambda: random_blocks(DATA, 2, 16), val)
    with pytest.raises(ValueError, match="at least one Race"):
        races_in_turn({}, lambda: random_blocks(DATA, 2, 16), val)
    long.trainer.config = short.trainer.config
    long.trainer.device = torch.device("meta")  # as a trainer on another device would hold it
    one_device = r"one device, to share each step's batch, got {'short': 'cpu', 'long': 'meta'}"
    with pytest.raises(ValueError, match=one_device):
        races_in_turn({"short": short, "long": long}, lambda: random_blocks(DATA, 2, 16), val)


def test_library_step_products_run_each_product_once_in_the_librarys_precisions(monkeypatch):
    blocks, head = [(8, 4, 6), (6, 8, 4), (8, 4, 6)], [(8, 4, 3)]
    seen = []
    real_matmul = torch.Tensor.__matmul__
    monkeypatch.setattr(
        torch.Tensor, "__matmul__", lambda a, b: seen.append((*a.shape, b.shape[1], a.dtype)) or real_matmul(a, b)
    )
    for dtype, low in ((None, torch.float32), (torch.bfloat16, torch.bfloat16)):
        seen.clear()
        library_step_products(blocks, head, dtype)()
        assert seen == [(*s, low) for s in blocks] + [(8, 4, 3, torch.float32)], dtype  # the head in fp32


@pytest.mark.benchmark
@pytest.mark.parametrize(
    "script, args",
    [
        (
            "fit_together.py",
            ["--runs", "2", "--steps", "10", "--d-model", "16", "--block-size", "8", "--batch-size", "4"],
        ),
        ("explore_pictures.py", ["--frames", "3", "--repeats", "1"]),
    ],
)
def test_side_by_side_scripts_report_equal_results_and_a_speedup(script, args):
    """fit_together.py (training runs) and explore_pictures.py (the book's pictures): one after the other
    against side by side, ending with ``speedup=<x> equal=True``."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / script), *args], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    match = re.fullmatch(r"speedup=(\d+\.\d+) equal=(True|False)", out.stdout.strip().splitlines()[-1])
    assert match and float(match[1]) > 0 and match[2] == "True", out.stdout


@pytest.mark.benchmark
def test_mfu_script_prints_each_engines_rate_over_the_peak(tmp_path):
    """On a CPU with a stated peak: every row's MFU is its TFLOP/s over that peak, and the last line gives both."""
    lines = script_lines(
        "mfu.py",
        *("--n-head", "2", "--vocab-size", "64", "--iters", "8", "--warmup-steps", "3"),
        *("--eager", "--peak-tflops", "0.001", "--profile"),
        tmp_path=tmp_path,
    )
    for who in ("ours", "reference"):  # --profile: each engine's operators, longest first, in ms per step
        i = next(
            i for i, line in enumerate(lines) if re.fullmatch(rf"{who}: [\d.]+ ms per step in operators; .*", line)
        )
        top = [float(line.split()[0]) for line in lines[i + 1 : i + 16]]
        assert (
            len(top) == 15
            and top == sorted(top, reverse=True)
            and any("aten::mm" in line for line in lines[i + 1 : i + 16])  # top 5 on an idle machine, not a busy one
        ), lines
    rows = [m.groups() for line in lines if (m := re.search(r"([\d.e+-]+) TFLOP/s, MFU (\d+\.\d)%", line))]
    assert len(rows) == 2, lines  # reference, library
    for rate, mfu in rows:
        assert float(mfu) == pytest.approx(float(rate) / 0.001 * 100, rel=0.01, abs=0.1)
    match = re.fullmatch(r"mfu ours=(\d+\.\d{3}) reference=(\d+\.\d{3})", lines[-1])
    assert match, lines[-1]
    losses = [float(m[1]) for line in lines if (m := re.search(r"val_loss (\d+\.\d+)", line))]
    assert len(losses) == 2 and abs(losses[0] - losses[1]) < 0.05  # same weights, batches and recipe


def test_published_peaks_pick_the_specific_variant_first():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from mfu import published_peak, step_flops
    finally:
        sys.path.pop(0)
    assert published_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert published_peak("NVIDIA H100 PCIe") == 756e12
    assert published_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert published_peak("Tesla T4") is None  # no bf16 tensor cores: MFU is then 'none'
    # nanoGPT's estimate for GPT-2 small (N = 124M less the 1024 x 768 position table), per token of T = 1024
    assert step_flops(124_337_664 - 786_432, 12, 768, 1024, 1) == 6 * 123_551_232 + 12 * 12 * 768 * 1024
