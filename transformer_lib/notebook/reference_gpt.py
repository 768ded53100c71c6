"""A minimal GPT in the shape of nanoGPT's ``model.py``, and nanoGPT's ``train.py`` step for it (chapter 8).

:class:`ReferenceGPT` has nanoGPT's architecture (Pre-LN blocks with one fused ``c_attn`` projection,
``F.scaled_dot_product_attention(is_causal=True)``, exact-GELU MLP, learned positions, tied output head,
``bias`` on or off for linears and norms), written here from its description; :func:`reference_train_step`
trains it as nanoGPT's loop does. :mod:`~transformer_lib.notebook.race` races the two against the library.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models import GPT
from ..training import Trainer, lr_at


class RefNorm(nn.Module):
    def __init__(self, d: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class RefAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, bias: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class RefBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, bias: bool) -> None:
        super().__init__()
        self.ln_1, self.attn = RefNorm(d, bias), RefAttention(d, n_heads, bias)
        self.ln_2 = RefNorm(d, bias)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=bias), nn.GELU(), nn.Linear(4 * d, d, bias=bias))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


# A block's weights with the library's name for each: ReferenceGPT's on the left, GPT's on the right.
_SAME_WEIGHTS = {
    "attn.c_proj": "self_attn.out_proj",
    "ln_1": "norm1",
    "ln_2": "norm2",
    "mlp.0": "ff.linear1",
    "mlp.2": "ff.linear2",
}


class ReferenceGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layers: int, n_heads: int, d: int, bias: bool) -> None:
        super().__init__()
        self.n_heads, self.d = n_heads, d
        self.wte, self.wpe = nn.Embedding(vocab_size, d), nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(RefBlock(d, n_heads, bias) for _ in range(n_layers))
        self.ln_f = RefNorm(d, bias)
        self.lm_head = nn.Linear(d, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():  # nanoGPT's: the residual branches' last products scaled down
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):  # the norms' weights stay ones
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("c_proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    @torch.no_grad()
    def copy_from(self, gpt: GPT) -> ReferenceGPT:
        """Take the weights of a library :class:`~transformer_lib.models.GPT` of the same shape (``bias=False``,
        learned positions, GELU, LayerNorm), so that both models start from the same point; else ValueError."""
        c = gpt.config
        kind, size = (c.bias, c.positional, c.activation, c.norm), (c.vocab_size, c.block_size, c.n_layers)
        shape = (self.wte.num_embeddings, self.wpe.num_embeddings, len(self.blocks), self.n_heads, self.d)
        if kind != (False, "learned", "gelu", "layernorm") or (*size, c.n_heads, c.d_model) != shape:
            raise ValueError(
                f"need a GPT with bias=False, learned positions, gelu, layernorm and (vocab_size, "
                f"block_size, n_layers, n_heads, d_model) = {shape}; got {c}"
            )
        theirs = gpt.state_dict()
        mine = {"wte.weight": theirs["tok_emb.weight"], "wpe.weight": theirs["pos.weight"]}
        for i in range(len(self.blocks)):
            block = f"blocks.{i}."
            qkv = [theirs[f"{block}self_attn.{x}_proj.weight"] for x in "qkv"]
            mine[block + "attn.c_attn.weight"] = torch.cat(qkv)  # c_attn is q, k, v stacked
            mine |= {f"{block}{ref}.weight": theirs[f"{block}{lib}.weight"] for ref, lib in _SAME_WEIGHTS.items()}
        mine |= {"ln_f.weight": theirs["norm_f.weight"], "lm_head.weight": theirs["tok_emb.weight"]}
        self.load_state_dict(mine)
        return self

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def reference_train_step(
    reference: nn.Module, trainer: Trainer, compile_reference: bool = False
) -> Callable[[Tensor, Tensor, int], None]:
    """nanoGPT's training step for ``reference`` in ``trainer``'s recipe: ``step(x, y, i)`` trains on one batch.

    AdamW with weight decay on the parameters of 2 or more dimensions only (fused on CUDA), the trainer's
    learning-rate schedule at step ``i``, betas and clipping, under the trainer's autocast (fp32 where it
    has none), and the loss read back every step; ``compile_reference=True`` runs the model through
    ``torch.compile``, as nanoGPT's ``--compile=True``. Each call makes a new optimizer.
    """
    cfg, device = trainer.config, trainer.device
    decay = [p for p in reference.parameters() if p.dim() >= 2]
    no_decay = [p for p in reference.parameters() if p.dim() < 2]
    groups: list[dict[str, Any]] = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(groups, cfg.lr, cfg.betas, weight_decay=cfg.weight_decay, fused=fused)
    amp = trainer.amp_dtype  # the trainer's precision, so that a race compares engines, not precisions
    ctx = torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext()
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    forward = torch.compile(reference) if compile_reference else reference

    def step(x: Tensor, y: Tensor, i: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(i, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        with ctx:
            _, loss = forward(x, y)
        scaler.scale(loss).backward()
        if cfg.grad_clip is not None:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(reference.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    return step
