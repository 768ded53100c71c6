"""Decoding an encoder-decoder model: greedy search and beam search (chapter 6).

The encoder runs once; the decoder's cross-attention projects the encoder's output into
keys and values once (static caches) and its self-attention keeps a growing key/value
cache, so each step feeds only the newest token.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention import KVCache
from .models import Seq2SeqTransformer
from .tasks import BOS, EOS, PAD


@torch.no_grad()
def greedy_decode(model: Seq2SeqTransformer, src: Tensor, max_len: int, use_cache: bool = True) -> Tensor:
    """The most likely next token at every step, until every sequence has produced ``<eos>``.

    Shapes: src (B, S) -> (B, <= max_len + 1): ``<bos>`` followed by the generated ids
    (``<pad>`` after a sequence's ``<eos>``).
    """
    memory = model.encode(src)  # (B, S, d_model), computed once
    caches = model.new_caches() if use_cache else None
    out = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        step_in = out[:, -1:] if use_cache else out
        logits = model.decode(step_in, memory, src, caches=caches)[:, -1]  # (B, V)
        next_id = logits.argmax(-1).masked_fill(done, PAD)
        out = torch.cat([out, next_id[:, None]], dim=1)
        done |= next_id == EOS
        if done.all():
            break
    return out


def _reorder(caches: list[tuple[KVCache, KVCache]], index: Tensor) -> None:
    """Keep the self-attention caches of the surviving beams (cross caches are shared per example)."""
    for self_cache, _ in caches:
        self_cache.k = self_cache.k.index_select(0, index)
        self_cache.v = self_cache.v.index_select(0, index)


@torch.no_grad()
def beam_search(model: Seq2SeqTransformer, src: Tensor, max_len: int, beam_size: int = 4,
                length_penalty: float = 1.0) -> Tensor:
    """Keep the ``beam_size`` most likely partial outputs at every step; return the best finished one.

    Finished hypotheses are ranked by log-probability / length**length_penalty.

    Shapes: src (B, S) -> (B, <= max_len + 1), like :func:`greedy_decode`.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    B, k, device = src.shape[0], beam_size, src.device
    src_k = src.repeat_interleave(k, dim=0)  # (B k, S): each example once per beam
    memory = model.encode(src_k)
    caches = model.new_caches()
    seqs = torch.full((B * k, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep only one alive at first
    best: list[tuple[float, Tensor] | None] = [None] * B
    for t in range(1, max_len + 1):
        logp = model.decode(seqs[:, -1:], memory, src_k, caches=caches)[:, -1].log_softmax(-1)  # (B k, V)
        V = logp.shape[-1]
        total = (scores.reshape(B * k, 1) + logp).reshape(B, k * V)
        top, flat = total.topk(2 * k, dim=-1)  # (B, 2k): room to replace beams that just finished
        beam, token = flat // V, flat % V
        new_scores = torch.full((B, k), float("-inf"), device=device)
        new_index = torch.zeros(B, k, dtype=torch.long, device=device)
        new_token = torch.full((B, k), PAD, dtype=torch.long, device=device)
        for b in range(B):
            filled = 0
            for j in range(2 * k):
                score, src_beam, tok = top[b, j].item(), beam[b, j].item(), token[b, j].item()
                if score == float("-inf"):
                    break
                if tok == EOS:  # a finished hypothesis: keep the best by normalized score
                    seq = torch.cat([seqs[b * k + src_beam], torch.tensor([EOS], device=device)])
                    norm = score / (t ** length_penalty)
                    if best[b] is None or norm > best[b][0]:
                        best[b] = (norm, seq)
                    continue
                new_scores[b, filled], new_index[b, filled], new_token[b, filled] = score, b * k + src_beam, tok
                filled += 1
                if filled == k:
                    break
        index = new_index.flatten()
        _reorder(caches, index)
        seqs = torch.cat([seqs.index_select(0, index), new_token.flatten()[:, None]], dim=1)
        scores = new_scores
        # stop when no live beam can beat the best finished hypothesis of its example
        bound = scores.max(-1).values / (max_len ** length_penalty if length_penalty > 0 else 1.0)
        if all(best[b] is not None and (bound[b].item() <= best[b][0]) for b in range(B)):
            break
    results = []
    for b in range(B):
        if best[b] is None:  # nothing finished: take the best live beam
            best[b] = (0.0, seqs[b * k + int(scores[b].argmax())])
        results.append(best[b][1])
    return torch.nn.utils.rnn.pad_sequence(results, batch_first=True, padding_value=PAD)
