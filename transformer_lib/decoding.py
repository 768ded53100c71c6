"""Decoding an encoder-decoder model: greedy search and beam search (chapter 6).

The encoder runs once and the decoder keeps key/value caches, so each step feeds only the newest token.
``bos_id`` starts every output, ``eos_id`` ends it, ``pad_id`` (default: the model's) fills finished rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validate import _validate_int, _validate_token_ids
from .attention import KVCache
from .models import Seq2SeqTransformer
from .utils import eval_mode


def _validate_decoding(model: Seq2SeqTransformer, src: Tensor, max_len: int, **special_ids: int) -> None:
    """Check the source, the output length against the model's context, and the special ids, before any work."""
    if not isinstance(model, Seq2SeqTransformer):
        raise TypeError(f"model must be a Seq2SeqTransformer, got {type(model).__name__}")
    c = model.config
    _validate_token_ids("src", src, c.src_vocab_size, c.max_len)
    if src.shape[0] == 0:
        raise ValueError("src is an empty batch (B = 0): there is nothing to decode")
    _validate_int("max_len", max_len)
    if max_len > c.max_len:
        raise ValueError(
            f"max_len={max_len}: decoding that many tokens feeds the decoder up to {max_len} positions, "
            f"more than the model's context of {c.max_len}"
        )
    for name, value in special_ids.items():
        if not isinstance(value, int) or not 0 <= value < c.tgt_vocab_size:
            raise ValueError(f"{name} must be a token id in [0, {c.tgt_vocab_size}), got {value!r}")


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqTransformer,
    src: Tensor,
    max_len: int,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """The most likely next token at every step, until every sequence has produced ``eos_id`` (eval mode).

    Shapes: src (B, S) -> (B, <= max_len + 1): ``bos_id`` followed by the generated ids
    (``pad_id`` after a sequence's ``eos_id``).

    Defined in chapter 6, Encoder-decoder.
    """
    pad_id = model.config.pad_id if pad_id is None else pad_id
    _validate_decoding(model, src, max_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    with eval_mode(model):
        return _greedy(model, src, max_len, bos_id, eos_id, pad_id, use_cache)


def _greedy(
    model: Seq2SeqTransformer, src: Tensor, max_len: int, bos_id: int, eos_id: int, pad_id: int, use_cache: bool
) -> Tensor:
    memory = model.encode(src)  # (B, S, d_model), computed once
    caches = model.new_caches() if use_cache else None
    out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        step_in = out[:, -1:] if use_cache else out
        logits = model.decode(step_in, memory, src, caches=caches)[:, -1]  # (B, V)
        next_id = logits.argmax(-1).masked_fill(done, pad_id)
        out = torch.cat([out, next_id[:, None]], dim=1)
        done |= next_id == eos_id
        if done.all():
            break
    return out


def _reorder(caches: list[tuple[KVCache, KVCache]], index: Tensor) -> None:
    """Keep the self-attention caches of the surviving beams (cross caches are shared per example)."""
    for self_cache, _ in caches:
        if self_cache.k is not None and self_cache.v is not None:
            self_cache.k, self_cache.v = self_cache.k.index_select(0, index), self_cache.v.index_select(0, index)


@torch.no_grad()
def beam_search(
    model: Seq2SeqTransformer,
    src: Tensor,
    max_len: int,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int | None = None,
    beam_size: int = 4,
    length_penalty: float = 1.0,
) -> Tensor:
    """Keep the ``beam_size`` most likely partial outputs at every step; return the best finished one (eval mode).

    Finished hypotheses are ranked by log-probability / length**length_penalty.

    Shapes: src (B, S) -> (B, <= max_len + 1), like :func:`greedy_decode`.

    Defined in chapter 6, Encoder-decoder.
    """
    pad_id = model.config.pad_id if pad_id is None else pad_id
    _validate_decoding(model, src, max_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    _validate_int("beam_size", beam_size)
    with eval_mode(model):
        return _beam(model, src, max_len, bos_id, eos_id, pad_id, beam_size, length_penalty)


def _beam(
    model: Seq2SeqTransformer,
    src: Tensor,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    beam_size: int,
    length_penalty: float,
) -> Tensor:
    B, k, device = src.shape[0], beam_size, src.device
    src_k = src.repeat_interleave(k, dim=0)  # (B k, S): each example once per beam
    memory = model.encode(src_k)
    caches = model.new_caches()
    seqs = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep only one alive at first
    best: list[tuple[float, Tensor] | None] = [None] * B  # per example: (normalized score, finished output)
    for t in range(1, max_len + 1):
        logp = model.decode(seqs[:, -1:], memory, src_k, caches=caches)[:, -1].log_softmax(-1)  # (B k, V)
        total = (scores.reshape(B * k, 1) + logp).reshape(B, -1)  # (B, k V)
        top, flat = total.topk(2 * k, dim=-1)  # (B, 2k): room to replace beams that just finished
        beams = _next_beams(top, flat, logp.shape[-1], seqs, best, eos_id, pad_id, t**length_penalty)
        new_scores, rows, tokens = zip(*beams, strict=True)
        index = torch.tensor(rows, device=device)  # (B k,)
        _reorder(caches, index)
        seqs = torch.cat([seqs.index_select(0, index), torch.tensor(tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(new_scores, dtype=scores.dtype, device=device).view(B, k)
        # stop when no live beam can beat the best finished hypothesis of its example
        bound = (scores.max(-1).values / (max_len**length_penalty if length_penalty > 0 else 1.0)).tolist()
        if all(kept is not None and bound[b] <= kept[0] for b, kept in enumerate(best)):
            break
    # an example where nothing finished: its best live beam
    live, best_live = seqs.cpu(), scores.argmax(-1).tolist()
    results = [live[b * k + best_live[b]] if kept is None else kept[1] for b, kept in enumerate(best)]
    return torch.nn.utils.rnn.pad_sequence(results, batch_first=True, padding_value=pad_id).to(device)


def _next_beams(
    top: Tensor,
    flat: Tensor,
    V: int,
    seqs: Tensor,
    best: list[tuple[float, Tensor] | None],
    eos_id: int,
    pad_id: int,
    length_norm: float,
) -> list[tuple[float, int, int]]:
    """The ``k`` live beams of each example, from its best candidates: ``(score, row of seqs it extends, new
    token)``, ``B k`` in all. A candidate ending in ``eos_id`` is finished instead: it replaces ``best[b]``
    when its score / ``length_norm`` is higher.

    Shapes: top, flat (B, 2k), candidate f extending beam f // V by token f % V; seqs (B k, t).
    """
    k = seqs.shape[0] // top.shape[0]
    # Per example and per candidate, in Python on lists copied from the device once (element by element on a
    # GPU, every read would wait for the GPU).
    finished_from = None
    chosen: list[tuple[float, int, int]] = []
    for b, (top_row, flat_row) in enumerate(zip(top.tolist(), flat.tolist(), strict=True)):
        live: list[tuple[float, int, int]] = []
        for score, f in zip(top_row, flat_row, strict=True):
            if score == float("-inf") or len(live) == k:
                break
            row, tok = b * k + f // V, f % V
            kept = best[b]
            if tok != eos_id:
                live.append((score, row, tok))
            elif kept is None or score / length_norm > kept[0]:  # a finished hypothesis, the best so far
                finished_from = seqs.cpu() if finished_from is None else finished_from  # (B k, t)
                best[b] = (score / length_norm, torch.cat([finished_from[row], torch.tensor([eos_id])]))
        chosen += live + [(float("-inf"), 0, pad_id)] * (k - len(live))
    return chosen
