"""Training speed against a well-known minimal GPT, measured side by side (chapter 7).

:class:`ReferenceGPT` has the architecture of nanoGPT's ``model.py`` (Pre-LN blocks with one
fused ``c_attn`` projection, ``F.scaled_dot_product_attention(is_causal=True)``, exact-GELU
MLP, learned positions, tied output head, ``bias`` on or off for linears and norms), written
here from its description, and is trained with nanoGPT's recipe: AdamW with decay on
matrices, fp32 on the CPU, gradient clipping, the loss read back every step.
:func:`compare_training_speed` alternates training steps of it and of the library's
:class:`~transformer_lib.models.GPT` on the same batches, so both see the same machine load.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Norm(nn.Module):
    def __init__(self, d: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class SelfAttention(nn.Module):
    def __init__(self, d: int, n_head: int, bias: bool) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, bias: bool) -> None:
        super().__init__()
        self.ln_1, self.attn = Norm(d, bias), SelfAttention(d, n_head, bias)
        self.ln_2 = Norm(d, bias)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=bias), nn.GELU(), nn.Linear(4 * d, d, bias=bias))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d: int, bias: bool) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, d), nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(Block(d, n_head, bias) for _ in range(n_layer))
        self.ln_f = Norm(d, bias)
        self.lm_head = nn.Linear(d, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.blocks:
            for p in (block.attn.c_proj.weight, block.mlp[2].weight):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def _step_fn(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor, torch.Tensor], float]:
    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()
    return step


def reference_optimizer(model: nn.Module, lr: float = 1e-3, weight_decay: float = 0.1) -> torch.optim.AdamW:
    """nanoGPT's optimizer on the CPU: AdamW, decay on parameters with 2+ dimensions, not fused."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.99))


def compare_training_speed(ours: nn.Module, ours_optimizer: torch.optim.Optimizer, reference: nn.Module,
                           batches: Callable[[], tuple[torch.Tensor, torch.Tensor]], steps: int = 50,
                           warmup: int = 5) -> dict[str, float]:
    """Median seconds per training step of each model, alternating steps on the same batches.

    Returns ``{"ours": s, "reference": s, "speedup": reference / ours}``.
    """
    runs = {"ours": _step_fn(ours, ours_optimizer), "reference": _step_fn(reference, reference_optimizer(reference))}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(warmup + steps):
        x, y = batches()
        for name, step in runs.items():
            t0 = time.perf_counter()
            step(x, y)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    result = {name: statistics.median(t) for name, t in times.items()}
    result["speedup"] = result["reference"] / result["ours"]
    return result
