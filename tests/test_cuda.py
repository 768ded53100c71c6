"""The library on a CUDA GPU: what the CPU suite cannot see. Skipped where there is no GPU.

The rest of the suite runs on the CPU; these run the same promises on CUDA, where the kernels,
the mixed precision (bf16 autocast, or fp16 with a loss scaler on GPUs without bf16) and the
asynchronous queue are different: the training step never waits for the GPU, the cache gives
the uncached tokens, the library's GPT equals nanoGPT's on the same weights, and
``fit_together`` trains GPU runs one after the other, each as it trains alone.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from conftest import generate_with_logits
from transformer_lib import GPT, GPTConfig
from transformer_lib.notebook.benchmark import matmul_flops_per_second, op_times
from transformer_lib.notebook.reference_gpt import ReferenceGPT
from transformer_lib.notebook.runs import fit_together
from transformer_lib.precision import fused_attention, output_in_fp32
from transformer_lib.text import random_blocks
from transformer_lib.training import TrainConfig, Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DATA = torch.arange(3000) % 89  # a periodic text: every model learns it


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    config = dict(vocab_size=97, block_size=32, n_layers=2, n_heads=4, d_model=64, dropout=0.0, bias=False)
    return GPT(GPTConfig(**(config | overrides)))


def trainer_for(model: GPT, steps: int = 20, log_interval: int = 10**6, **kw) -> Trainer:
    config = TrainConfig(max_steps=steps, lr=3e-3, warmup_steps=2, eval_interval=10**6, log_interval=log_interval)
    return Trainer(model, config, lambda g: random_blocks(DATA, 8, 32, g), device=torch.device("cuda"), **kw)


def test_the_training_step_never_waits_for_the_gpu():
    trainer = trainer_for(tiny_gpt())
    assert trainer.amp_dtype in (torch.bfloat16, torch.float16)  # the GPU's native reduced precision
    g = torch.Generator().manual_seed(0)
    batches = [tuple(t.cuda() for t in random_blocks(DATA, 8, 32, g)) for _ in range(6)]
    trainer.train_step(batches[0])  # the first step creates the optimizer's state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync raises
    try:
        for batch in batches[1:]:
            loss = trainer.train_step(batch)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert loss.is_cuda and torch.isfinite(loss).item()


def test_fit_learns_on_the_gpu():
    trainer = trainer_for(tiny_gpt(), steps=150, log_interval=10)
    history = trainer.fit(progress=False)
    assert history.train_loss[-1] < 0.5 * history.train_loss[0], history.train_loss


def test_a_reduce_overhead_compiled_trainer_trains_as_the_eager_one():
    """Trainer(compile="reduce-overhead"): torch.compile replays each step as a CUDA graph. The losses follow
    the eager run's (to the fused kernels' rounding and bf16's), and the weights stay the model's own."""
    eager = trainer_for(tiny_gpt(), steps=40, log_interval=5)
    graphed = trainer_for(tiny_gpt(), steps=40, log_interval=5, compile="reduce-overhead")
    assert graphed.compiled and not eager.compiled
    h_eager, h_graphed = eager.fit(progress=False), graphed.fit(progress=False)
    assert graphed.step == 40 and h_graphed.steps == h_eager.steps
    torch.testing.assert_close(h_graphed.train_loss, h_eager.train_loss, atol=5e-2, rtol=5e-2)
    assert h_graphed.train_loss[-1] < 0.5 * h_graphed.train_loss[0], h_graphed.train_loss
    assert next(graphed.model.parameters()).is_cuda and graphed.model is not graphed.forward_model


def test_the_cache_gives_the_uncached_tokens_on_the_gpu():
    model = tiny_gpt().cuda().eval()
    prompt = torch.randint(0, 97, (3, 5), device="cuda")
    cached, logits_cached = generate_with_logits(model, prompt, 20, temperature=0, use_cache=True)
    plain, logits_plain = generate_with_logits(model, prompt, 20, temperature=0, use_cache=False)
    assert cached.is_cuda and torch.equal(cached, plain)
    torch.testing.assert_close(logits_cached, logits_plain, atol=1e-4, rtol=1e-4)


def test_the_library_gpt_equals_nanogpt_on_the_gpu():
    ours = tiny_gpt().cuda()
    reference = ReferenceGPT(97, 32, 2, 4, 64, bias=False).cuda().copy_from(ours)
    x, y = (t.cuda() for t in random_blocks(DATA, 4, 32, torch.Generator().manual_seed(1)))
    with torch.no_grad():
        torch.testing.assert_close(ours(x, y)[1], reference(x, y)[1], atol=1e-5, rtol=1e-5)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            torch.testing.assert_close(ours(x, y)[1], reference(x, y)[1].float(), atol=2e-2, rtol=2e-2)


def test_the_head_under_autocast_gives_fp32_logits_on_the_gpu():
    torch.manual_seed(0)
    head, h = torch.nn.Linear(64, 1000).cuda(), torch.randn(2, 8, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16):
        logits = output_in_fp32(head, h)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, F.linear(h, head.weight, head.bias), atol=1e-2, rtol=1e-2)  # TF32 or fp32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_attention_on_the_gpu_equals_the_formula(dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32, device="cuda", dtype=dtype) for _ in range(3))
    out = fused_attention(q, k, v, is_causal=True)
    scores = (q.float() @ k.float().transpose(-2, -1)) / 32**0.5
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    expected = scores.softmax(-1) @ v.float()
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


def test_fit_together_trains_gpu_runs_each_as_alone():
    """On a GPU the runs go one after the other. Not bitwise: CUDA's embedding backward adds with atomics."""
    together = [trainer_for(tiny_gpt(seed), steps=30, log_interval=10) for seed in (0, 1)]
    fit_together(together, progress=False)
    for seed, trainer in zip((0, 1), together, strict=True):
        alone = trainer_for(tiny_gpt(seed), steps=30, log_interval=10)
        alone.fit(progress=False)
        assert trainer.step == alone.step == 30
        torch.testing.assert_close(trainer.history.train_loss, alone.history.train_loss, atol=2e-2, rtol=2e-2)


def test_the_multiply_rate_on_the_gpu_times_the_kernels_not_their_launches():
    """Timed by torch.utils.benchmark.Timer, which waits for the GPU: an fp32 rate below a petaflop."""
    assert 1e9 < matmul_flops_per_second([(4096, 4096, 4096)], device="cuda", seconds=0.05) < 1e15


def test_op_times_on_cuda_are_the_kernels_own_time():
    """The GPU kernels' rows alone: an operator's row (aten::mm) or a region's (record_function, as the
    optimizer's step is marked) would count its kernels' time twice."""
    a = torch.randn(2048, 2048, device="cuda")

    def marked_product() -> None:
        with torch.profiler.record_function("a region"):
            a @ a

    times = op_times(marked_product, "cuda", repeats=5)
    assert times and not any(name.startswith("aten::") or name == "a region" for name, _ in times), times
    total = sum(seconds for _, seconds in times)
    assert 2 * 2048**3 / total < 1e15, times  # one fp32 product per call is not faster than a petaflop


def test_compare_gpt_races_on_the_gpu(tmp_path):
    """The CPU's benchmark runs on CUDA too: both races' losses agree, and the last line gives the shares."""
    from test_benchmark import script_lines  # tests/, on the path as pytest runs this file

    lines = script_lines("compare_gpt.py", "--iters", "12", tmp_path=tmp_path, device="cuda")
    assert re.fullmatch(r"share_of_bound fp32=\d\.\d\d bf16=(\d\.\d\d|none)", lines[-1]), lines[-1]
    losses = [float(m[1]) for line in lines if (m := re.search(r"val_loss (\d+\.\d+)", line))]
    assert len(losses) in (2, 4)
    for reference, ours in zip(losses[::2], losses[1::2], strict=True):
        assert abs(reference - ours) < 0.05


def test_beam_search_on_the_gpu_finds_what_the_cpu_finds():
    """The same weights decode the same outputs on CUDA as on the CPU (chapter 6's beams), up to the ties that
    the two devices' rounding may break differently: every output is as likely under the model as the CPU's."""
    from transformer_lib import Seq2SeqConfig, Seq2SeqTransformer
    from transformer_lib.decoding import beam_search

    torch.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig(11, 11, 32, 4, 1, 1, d_ff=64, dropout=0.0, max_len=32)).eval()
    src = torch.randint(3, 11, (16, 6), generator=torch.Generator().manual_seed(0))
    on_cpu = beam_search(model, src, 10, bos_id=1, eos_id=2, beam_size=4)
    on_gpu = beam_search(model.cuda(), src.cuda(), 10, bos_id=1, eos_id=2, beam_size=4).cpu()
    model.cpu()

    @torch.no_grad()
    def logp(out: torch.Tensor) -> torch.Tensor:  # (B,): log p(output | source), up to and including <eos>
        token_logp = model(src, out[:, :-1]).log_softmax(-1).gather(-1, out[:, 1:, None])[..., 0]  # (B, L - 1)
        is_eos = (out[:, 1:] == 2).long()
        return (token_logp * (is_eos.cumsum(1) - is_eos == 0)).sum(1)

    width = max(on_gpu.shape[1], on_cpu.shape[1])  # pad both to one width (pad id 0)
    on_gpu, on_cpu = (torch.nn.functional.pad(out, (0, width - out.shape[1])) for out in (on_gpu, on_cpu))
    assert on_gpu.eq(on_cpu).all(1).sum() >= 12, (on_gpu, on_cpu)  # the same outputs but for a tie or so
    torch.testing.assert_close(logp(on_gpu), logp(on_cpu), atol=1e-3, rtol=0)
