"""The speed comparison compares like with like: the same model, the same recipe, the same batches."""

import math
import re
import subprocess
import sys
import timeit
from functools import partial
from pathlib import Path

import pytest
import torch

from transformer_lib import GPT, GPTConfig
from transformer_lib.notebook import benchmark
from transformer_lib.notebook.benchmark import (
    Race,
    ReferenceGPT,
    copy_bytes_per_second,
    fastest_in_turn,
    gpt_matmul_shapes,
    gpt_step_bytes,
    gpt_step_parts,
    gpt_tiny_step,
    library_step_products,
    matmul_flops_per_second,
    mean_loss,
    op_time_shares,
    op_times,
    products_as_called,
    races_in_turn,
    reference_optimizer,
    step_part,
    step_parts,
    step_products,
    train_side_by_side,
    train_step_bound,
    train_step_flops,
)
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


def test_reference_optimizer_decays_matrices_only():
    _, ref = pair()
    decay, no_decay = reference_optimizer(ref).param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])


@pytest.mark.slow
def test_side_by_side_trains_both_with_one_recipe():
    ours, ref = pair()
    cfg = TrainConfig(max_steps=40, lr=3e-3, min_lr=3e-4, warmup_steps=5, progress=False, amp=False)
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
    cfg = TrainConfig(max_steps=7, progress=False)  # amp=True: TRANSFORMER_LIB_PRECISION decides
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
    trainer = Trainer(
        ours, TrainConfig(max_steps=3, progress=False), lambda g: random_blocks(DATA, 2, 16, g), device="cpu"
    )
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
    rounding: the same weights, batches and recipe), the bound, the parts of the step; with two, a line compares
    each engine across the precisions; the last line gives the shares."""
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
    assert sum("matrix products" in line for line in lines) == races
    assert sum("the parts' bounds add up to" in line for line in lines) == races
    in_turn = r"timed in turn \(the fastest of 20 rounds each\): the step (\d+\.\d) ms .* the parts alone (\d+\.\d) ms"
    fastest = [(float(m[1]), float(m[2])) for line in lines if (m := re.search(in_turn, line))]
    assert len(fastest) == races and all(step > 0 and alone > 0 for step, alone in fastest)
    floor = (
        r"the fastest eager step here takes about (\d+\.\d) ms "
        r"\((\d+\.\d) products \+ (\d+\.\d) other parts alone \+ (\d+\.\d) PyTorch's own;.*"
        r"the step at its fastest \((\d+\.\d) ms\) is at (\d+)% of that"
    )
    floors = [[float(g) for g in m.groups()] for line in lines if (m := re.search(floor, line))]
    assert len(floors) == races
    for (total, *terms, step, percent), (fastest_step, _) in zip(floors, fastest, strict=True):
        assert all(t > 0 for t in terms) and abs(total - sum(terms)) < 0.2  # the three printed terms add up
        assert step == fastest_step  # the floor is set against the step at its fastest, timed in turn with it
        ratio, rounding = total / step, total / step * (0.05 / total + 0.05 / step)  # printed to 0.1 ms
        assert abs(percent / 100 - ratio) <= rounding + 0.005


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


def test_matmul_rate_is_the_products_over_their_fastest_round(monkeypatch):
    """On a simulated machine multiplying at 1 GFLOP/s, twice as slow (busy) for its first 100
    products: the rate is the products' operations over the time of the fastest round, 1 GFLOP/s."""
    from transformer_lib.notebook import benchmark

    shapes = gpt_matmul_shapes(64, 16, 64, 11)
    assert len(shapes) == 15 and (64, 16, 48) in shapes and (16, 64, 48) in shapes  # forward, weight gradient
    clock, products = FakeClock(), []

    def matmul(a, b):
        (m, k), n = a.shape, b.shape[1]
        products.append((m, k, n))
        clock.now += 2 * m * k * n / 1e9 * (2 if len(products) <= 100 else 1)
        return torch.zeros(m, n)

    monkeypatch.setattr(benchmark.time, "perf_counter", clock)
    monkeypatch.setattr(torch.Tensor, "__matmul__", matmul)
    rate = matmul_flops_per_second(shapes, seconds=0.01)
    assert set(products) == set(shapes) and len(products) > 200  # every product, in rounds past the busy stretch
    assert rate == pytest.approx(1e9)


def test_copy_bandwidth_counts_the_bytes_read_and_written_over_the_fastest_copy(monkeypatch):
    """On a simulated machine copying at 1 GB/s (read plus write), twice as slow for its first two copies: the
    bandwidth is 2 x n_bytes over the fastest copy, 1e9 bytes/s, and the copy really copies."""
    from transformer_lib.notebook import benchmark

    clock, copies, real_copy = FakeClock(), [], torch.Tensor.copy_

    def copy_(dst, src, *args, **kwargs):
        copies.append(src.nbytes)
        clock.now += 2 * src.nbytes / 1e9 * (2 if len(copies) <= 2 else 1)
        return real_copy(dst, src, *args, **kwargs)

    monkeypatch.setattr(benchmark.time, "perf_counter", clock)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    assert copy_bytes_per_second(4096, repeats=4) == pytest.approx(1e9)
    assert copies == [4096] * 5  # a warm-up, then the repeats, each of the whole tensor


@pytest.mark.parametrize("kwargs", [{"n_bytes": 6}, {"n_bytes": 0}, {"n_bytes": 4.0}, {"repeats": 0}])
def test_copy_bandwidth_rejects_bad_sizes(kwargs):
    with pytest.raises(ValueError, match="n_bytes|repeats"):
        copy_bytes_per_second(**kwargs)


@pytest.mark.slow
def test_a_compiled_reference_trains_as_the_eager_one():
    """nanoGPT's --compile=True: torch.compile of the same model, the same losses up to rounding."""
    results = []
    for compile_reference in (False, True):
        ours, ref = pair()
        ref.copy_from(ours)
        cfg = TrainConfig(max_steps=8, warmup_steps=2, progress=False, amp=False)
        trainer = Trainer(ours, cfg, lambda g: random_blocks(DATA, 4, 16, g), device="cpu")
        val = [random_blocks(DATA, 4, 16, torch.Generator().manual_seed(1))]
        draw = partial(random_blocks, DATA, 4, 16, torch.Generator().manual_seed(0))
        result = train_side_by_side(trainer, ref, draw, val, warmup=2, compile_reference=compile_reference)
        results.append(result)
    eager, compiled = results
    assert compiled.reference_val_loss == pytest.approx(eager.reference_val_loss, rel=1e-4)
    assert compiled.ours_val_loss == pytest.approx(eager.ours_val_loss, rel=1e-6)


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
    trainer = Trainer(ours, TrainConfig(max_steps=9, progress=False, amp=False), lambda g: None, device="cpu")
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
        Trainer(pair()[0], TrainConfig(max_steps=6, progress=False, amp=False), lambda g: None, device="cpu"),
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
        cfg = TrainConfig(max_steps=10, lr=lr, warmup_steps=2, progress=False, amp=False)
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
    short = Race(Trainer(ours, TrainConfig(max_steps=8, progress=False), lambda g: None, device="cpu"), ref)
    ours, ref = pair()
    long = Race(Trainer(ours, TrainConfig(max_steps=9, progress=False), lambda g: None, device="cpu"), ref)
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


def test_step_products_and_the_bound_run_each_product_once(monkeypatch):
    shapes, head = [(8, 4, 6), (6, 8, 4)], [(8, 4, 3)]
    seen = []
    real_matmul = torch.Tensor.__matmul__
    monkeypatch.setattr(
        torch.Tensor, "__matmul__", lambda a, b: seen.append((a.shape, b.shape, a.dtype)) or real_matmul(a, b)
    )
    step_products(shapes, torch.bfloat16, fp32_shapes=head)()
    assert seen == [((8, 4), (4, 6), torch.bfloat16), ((6, 8), (8, 4), torch.bfloat16), ((8, 4), (4, 3), torch.float32)]
    seen.clear()
    assert train_step_bound(shapes, rounds=3) > 0
    assert len(seen) == 2 * (1 + 3)  # one warm-up run, then 3 timed rounds


def test_library_step_products_multiply_the_head_as_the_library_does(monkeypatch):
    blocks, head = [(8, 4, 6)], [(8, 4, 3)]
    seen = []
    real_matmul = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: seen.append(a.dtype) or real_matmul(a, b))
    for dtype, expected in ((None, [torch.float32] * 2), (torch.bfloat16, [torch.bfloat16, torch.float32])):
        seen.clear()
        library_step_products(blocks, head, dtype)()
        assert seen == expected, dtype
    monkeypatch.setattr(benchmark, "head_product_dtype", lambda device, dtype: torch.bfloat16)  # a CUDA GPU's rule
    seen.clear()
    library_step_products(blocks, head, torch.bfloat16)()
    assert seen == [torch.bfloat16] * 2


def test_step_parts_sorts_operators_into_the_parts_of_a_step():
    assert step_part("aten::mm") == step_part("aten::addmm") == "matrix products"
    assert step_part("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention kernel"
    assert step_part("aten::gelu_backward") == "GELU"
    assert step_part("aten::native_layer_norm_backward") == "norms"
    assert step_part("aten::_fused_adamw_") == step_part("Optimizer.step#AdamW.step") == "optimizer and clipping"
    assert step_part("aten::_to_copy") == "casts and copies"
    assert step_part("aten::add_") == "the rest"
    assert step_part("## Call CompiledFxGraph fzoqgrnbtup67 ##") == "compiled kernels"
    parts = step_parts([("aten::mm", 0.5), ("aten::gelu", 0.1), ("aten::addmm", 0.2), ("aten::add", 0.2)])
    assert list(parts) == ["matrix products", "the rest", "GELU"]
    assert parts["matrix products"] == pytest.approx(0.7)


def test_gpt_step_bytes_counts_each_memory_bound_pass():
    n = gpt_step_bytes(n_tokens=10, d_model=4, d_ff=16, n_layers=2, vocab_size=7, n_params=100, act_bytes=2)
    assert n == {
        "GELU": 5 * 10 * 16 * 2 * 2,  # 5 tensors of (tokens, d_ff) per layer, 2 bytes each
        "norms": 5 * 10 * 4 * 5 * 4,  # 2 norms per layer and the final one, fp32
        "loss": 4 * 10 * 7 * 4,
        "optimizer and clipping": 10 * 100 * 4,
    }


def test_gpt_step_parts_run_each_parts_own_kernels_on_the_steps_shapes():
    """Each part runs its operators as often as the step does, on the step's shapes and dtypes;
    the optimizer steps a copy, so the model is untouched."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            first = args[0] if args and isinstance(args[0], torch.Tensor) else None
            shape = (tuple(first.shape), first.dtype) if first is not None else None
            self.seen[func.overloadpacket.__name__, shape] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layers=3, n_heads=2, d_model=8, bias=False))
    before = [p.detach().clone() for p in model.parameters()]
    parts = gpt_step_parts(model, batch_size=4, block_size=16, act_dtype=torch.bfloat16)
    assert list(parts) == ["attention kernel", "GELU", "norms", "loss", "optimizer and clipping"]
    n = 2
    with Calls() as calls:
        for _ in range(n):
            for part in parts.values():
                part()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    seen = calls.seen
    assert seen["gelu", ((64, 32), torch.bfloat16)] == 3 * n  # (B T, d_ff) in the activations' dtype, once per layer
    assert seen["gelu_backward", ((64, 32), torch.bfloat16)] == 3 * n
    assert seen["native_layer_norm", ((64, 8), torch.float32)] == (2 * 3 + 1) * n  # two per layer and the final one
    attention = [c for (op, _), c in seen.items() if op.startswith("_scaled_dot_product") and "backward" not in op]
    assert attention == [3 * n]  # once per layer, on (B, n_heads, T, d_head) in fp32 on a CPU
    assert any(op.startswith("_scaled_dot_product") and shape == ((4, 2, 16, 4), torch.float32) for op, shape in seen)
    assert sum(c for (op, _), c in seen.items() if op == "_fused_adamw_") == 2 * n  # one fused call per decay group
    assert sum(c for (op, _), c in seen.items() if op == "nll_loss_forward") == n
    # No backward adds into an earlier gradient (in the step each layer's tensors are its own).
    assert not [key for key in seen if key[0] in ("add", "add_") and key[1] and key[1][0] in ((4, 2, 16, 4), (64, 32))]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"block_size": 0}, ValueError),
        ({"batch_size": 0}, ValueError),
        ({"model": torch.nn.Linear(2, 2)}, TypeError),
    ],
)
def test_gpt_step_parts_rejects_bad_input(kwargs, error):
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layers=1, n_heads=2, d_model=8))
    args = {"model": model, "batch_size": 2, "block_size": 8} | kwargs
    with pytest.raises(error, match=next(iter(kwargs))):
        gpt_step_parts(**args)


def test_fastest_in_turn_times_each_once_a_round_in_turn_and_keeps_each_ones_fastest(monkeypatch):
    """A warm-up call of each, then rounds in which each runs once, the first place moving on every round;
    each one's fastest call is kept, so a slow moment of the machine weighs on whichever ran in it."""
    from transformer_lib.notebook import benchmark

    clock = FakeClock()
    monkeypatch.setattr(benchmark.time, "perf_counter", clock)
    order = []
    slow = iter([0.0] * 3 + [5.0] + [0.0] * 7 + [5.0] + [0.0] * 10)  # slow moments: the first and last timed calls

    def work(name, seconds):
        def run():
            order.append(name)
            clock.now += seconds + next(slow)

        return run

    fastest = fastest_in_turn({"a": work("a", 1.0), "b": work("b", 2.0), "c": work("c", 3.0)}, rounds=3)
    assert fastest == {"a": 1.0, "b": 2.0, "c": 3.0}
    assert order == ["a", "b", "c"] + ["a", "b", "c"] + ["b", "c", "a"] + ["c", "a", "b"]
    fastest = fastest_in_turn({"a": work("a", 1.0)}, rounds=1)
    assert fastest == {"a": 1.0}


@pytest.mark.parametrize(
    "runs, rounds, error, match",
    [({"a": lambda: None}, 0, ValueError, "rounds"), ({}, 2, TypeError, "runs"), ({"a": 3}, 2, TypeError, "runs")],
)
def test_fastest_in_turn_rejects_bad_input(runs, rounds, error, match):
    with pytest.raises(error, match=match):
        fastest_in_turn(runs, rounds=rounds)


def test_products_as_called_replays_each_product_with_its_layout_on_operands_of_its_own():
    """The replay runs the step's products, and nothing else, with the same shapes, strides and dtypes, on new
    operands, each call its own; the step itself runs once, to be recorded."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    from transformer_lib.notebook.benchmark import PRODUCT_OPS

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = Counter()
            self.pointers = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.seen[func.overloadpacket.__name__, tuple((tuple(t.shape), t.stride(), t.dtype) for t in tensors)] += 1
            self.pointers += [t.data_ptr() for t in tensors]
            return func(*args, **(kwargs or {}))

    a, w = torch.randn(6, 4), torch.randn(5, 4)
    bias, x = torch.randn(2, dtype=torch.float64), torch.randn(3, 4, 2, dtype=torch.float64)
    runs = []

    def step():
        runs.append(1)
        h = torch.relu(a @ w.t())  # mm with a transposed operand, stride (1, 4); relu is no product
        h @ w  # (6, 5) @ (5, 4)
        torch.addmm(bias, x[0].t(), x[1])  # (2, 4) @ (4, 2) + bias, in float64
        torch.bmm(x.transpose(1, 2), x)  # (3, 2, 4) @ (3, 4, 2)

    with Calls() as recorded:
        replay = products_as_called(step)
    assert len(runs) == 1
    with Calls() as replayed:
        replay()
    products = Counter({key: n for key, n in recorded.seen.items() if key[0] in PRODUCT_OPS})
    assert len(products) == 4 and replayed.seen == products  # the same products and layouts, nothing else
    assert ("mm", (((6, 4), (4, 1), torch.float32), ((4, 5), (1, 4), torch.float32))) in products
    assert (
        "addmm",
        (((2,), (1,), torch.float64), ((2, 4), (1, 2), torch.float64), ((4, 2), (2, 1), torch.float64)),
    ) in products
    assert not {t.data_ptr() for t in (a, w, bias, x)} & set(replayed.pointers)  # never the step's tensors
    assert len(set(replayed.pointers)) == len(replayed.pointers) == 9  # each call's operands its own


def test_gpt_tiny_step_runs_the_models_structure_at_a_tiny_width(monkeypatch):
    """It runs Trainer steps of a GPT with the model's layers, heads and kinds of parts, 4 channels per head."""
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layers=3, n_heads=2, d_model=16, norm="rmsnorm", bias=False))
    seen = []
    train_step = Trainer.train_step

    def spy(self, *batches):
        seen.append((self.model.config, batches[0][0].shape, self.step))
        return train_step(self, *batches)

    monkeypatch.setattr(Trainer, "train_step", spy)
    state = torch.random.get_rng_state()
    step = gpt_tiny_step(model, amp=False)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random numbers are not drawn
    assert not seen
    for _ in range(3):
        step()
    assert [s for *_, s in seen] == [0, 1, 2]  # each call one more step
    config, shape, _ = seen[-1]
    assert (config.n_layers, config.n_heads, config.d_model, config.norm, config.bias) == (3, 2, 8, "rmsnorm", False)
    assert tuple(shape) == (1, 4)
    assert model.config.d_model == 16  # the caller's model is not touched


@pytest.mark.parametrize("kwargs, error", [({"model": torch.nn.Linear(2, 2)}, TypeError), ({"amp": "yes"}, ValueError)])
def test_gpt_tiny_step_rejects_bad_input(kwargs, error):
    args = {"model": GPT(GPTConfig(vocab_size=11, block_size=16, n_layers=1, n_heads=2, d_model=8))} | kwargs
    with pytest.raises(error, match=next(iter(kwargs))):
        gpt_tiny_step(**args)


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
