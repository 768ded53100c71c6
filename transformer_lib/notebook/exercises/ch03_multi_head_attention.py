"""Chapter 3, multi-head attention: ``check_split_heads`` (fix a head split that folds the heads into the batch in
the wrong order), ``check_multi_head_attention`` (fix a forward pass that reshapes keys and values with the query's
length) and ``check_attention_crossover`` (a prediction: the length from which attention outweighs the rest)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...attention import MultiHeadAttention, scaled_dot_product_attention
from ._framework import Checker, Hint, bug_table, checker

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> what gives its answer away
    "ex-split-heads": ("stack(x.split(d_head, dim=-1), dim=1)", "reshape(B * n_heads, T, d_head)", "example-major"),
    "ex-cross-attention": ("t.shape[1]", "key.shape[1]", "view(batch_size, t.shape"),
    "ex-crossover": ("2304", "2 d_model + d_ff", "2\\,d_\\text{model} + d_\\text{ff}", "2 * 384 + 1536"),
    "ex-heads-budget": ("rank at most", "64 times as many weights"),
    "ex-seeds": ("interchangeable at initialization", "permuting them"),
}


# ---------------------------------------------------------------- Spot the bug: heads folded into the batch

SPLIT_HEADS_STARTER = """\
def split_heads(x, n_heads):  # find and fix the bug
    \"\"\"Fold the heads into the batch for torch.bmm: row b * n_heads + h is head h of example b.

    Shapes: x (B, T, d_model) -> (B * n_heads, T, d_head).
    \"\"\"
    d_head = x.shape[-1] // n_heads
    return torch.cat(x.split(d_head, dim=-1), dim=0)  # n_heads pieces (B, T, d_head), one after the other
"""

_SPLIT_SECTION = "reread 'Splitting and merging heads'"


def _fold(x: Tensor, n_heads: int, *, bug: str = "") -> Tensor:
    """The fold, row b * n_heads + h = head h of example b, or a wrong one of :data:`_SPLIT_BUGS`."""
    B, T, d_model = x.shape
    d_head = d_model // n_heads
    if bug == "sequence-first":
        return x.reshape(T, B * n_heads, d_head).transpose(0, 1)
    if bug == "straight":
        return x.reshape(B * n_heads, T, d_head)
    heads = x.view(B, T, n_heads, d_head).transpose(1, 2)  # (B, n_heads, T, d_head)
    if bug == "not folded":
        return heads
    if bug == "head-major":
        return heads.transpose(0, 1).reshape(n_heads * B, T, d_head)
    return heads.reshape(B * n_heads, T, d_head)


_FOLD = "x.view(B, T, n_heads, d_head).transpose(1, 2).reshape(B * n_heads, T, d_head)"
_SPLIT_BUGS = {  # bug -> hint, for _fold(..., bug=bug)
    "sequence-first": Hint(  # F.multi_head_attention_forward's line
        "right for a batch of one, wrong beyond: that is the line for sequence-first input (T, B, d_model), "
        "which on batch-first x mixes the examples in a head (reread 'The batch flattened into the head split').",
        f"split with B as its own axis first, then fold: {_FOLD}.",
    ),
    "straight": Hint(
        "each 'head' is a run of T * d_head consecutive numbers of x: pieces of several positions, with the "
        f"features of every head, wrong even for one example ({_SPLIT_SECTION}).",
        f"view as (B, T, n_heads, d_head), transpose(1, 2), then fold: {_FOLD}.",
    ),
    "head-major": Hint(
        "your rows come in the order (head, example), row h * B + b; the layout asked for, row b * n_heads + h, is "
        f"what .view(B, n_heads, T, d_head) and repeat_interleave expect ({_SPLIT_SECTION}).",
        "put the head axis right after the batch axis, then fold: torch.stack(x.split(d_head, dim=-1), dim=1)"
        f".reshape(B * n_heads, T, d_head), or {_FOLD}.",
    ),
    "not folded": Hint(
        "you return (B, n_heads, T, d_head), the library's layout; torch.bmm takes 3-D tensors, so the two leading "
        "axes must become one.",
        "fold them: .reshape(B * n_heads, T, d_head).",
    ),
}


@checker(starter=SPLIT_HEADS_STARTER, reference=lambda x, h: x.view(*x.shape[:2], h, -1).transpose(1, 2).flatten(0, 1))
def check_split_heads(c: Checker, split_heads: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``split_heads(x, n_heads)``: row ``b * n_heads + h`` of the result is head h of example b.
    Shapes: x (B, T, d_model) -> (B * n_heads, T, d_head)."""
    g = torch.Generator().manual_seed(1)
    sizes = ((1, 4, 8, 2), (3, 5, 12, 3), (2, 7, 16, 4))  # B, T, d_model, n_heads
    with c.refuse_library_calls(
        MultiHeadAttention.split_heads,
        name="fixed by hand, without the chapter's split_heads",
        hint="the exercise asks you to fix the snippet's fold: MultiHeadAttention.split_heads, folded, is the "
        "layout the checker compares it with.",
    ):
        c.cases(
            split_heads,
            [
                (f"B={B}, T={T}, d_model={d}, n_heads={h}", {"x": torch.randn(B, T, d, generator=g), "n_heads": h})
                for B, T, d, h in sizes
            ],
            _fold,
            _SPLIT_BUGS,
            hint=Hint(
                "row b * n_heads + h must hold head h of example b: the features h * d_head to (h + 1) * d_head - 1 "
                f"of every position of that example ({_SPLIT_SECTION}).",
                f"{_FOLD}.",
            ),
        )


# ---------------------------------------------------------------- Spot the bug: keys reshaped with the query's length

MHA_FORWARD_STARTER = """\
def mha_forward(mha, query, key, value):  # find and fix the bug
    batch_size, seq_len, d_model = query.shape
    n_heads, d_head = mha.n_heads, d_model // mha.n_heads

    def heads(t):  # (B, T, d_model) -> (B, n_heads, T, d_head)
        return t.view(batch_size, seq_len, n_heads, d_head).transpose(1, 2)

    q, k, v = heads(mha.q_proj(query)), heads(mha.k_proj(key)), heads(mha.v_proj(value))
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_head), dim=-1)  # (B, n_heads, T_q, T_k)
    out = (weights @ v).transpose(1, 2).reshape(batch_size, seq_len, d_model)  # (B, T_q, d_model)
    return mha.out_proj(out)
"""


def _heads(x: Tensor, n_heads: int, bug: str = "") -> Tensor:
    """(B, T, d_model) -> (B, n_heads, T, d_head), or with a bug of :data:`_MHA_BUGS`."""
    B, T, _ = x.shape
    if bug == "sequence-first":
        return x.reshape(T, B * n_heads, -1).transpose(0, 1).reshape(B, n_heads, T, -1)
    if bug == "plain reshape":
        return x.reshape(B, n_heads, T, -1)
    return x.view(B, T, n_heads, -1).transpose(1, 2)


_SHAPE_ERROR_WORDS = ("is invalid for input of size", "must match the size", "Expected size", "size mismatch")


def _query_length_hint(error: BaseException) -> Hint | str:
    if any(words in str(error) for words in _SHAPE_ERROR_WORDS):
        return Hint(
            "this shape error comes only when the keys are not as many as the queries: check where each length "
            "that your split uses comes from, tensor by tensor.",
            "read each length from the tensor being split, t.view(B, t.shape[1], n_heads, d_head) (or -1 for it), "
            "not from query.shape.",
        )
    return ""


def _mha_by_hand(mha: MultiHeadAttention, query: Tensor, key: Tensor, *, bug: str) -> Tensor:
    q, k, v = (_heads(t, mha.n_heads, bug) for t in (mha.q_proj(query), mha.k_proj(key), mha.v_proj(key)))
    scale = 1.0 if bug == "unscaled" else None  # None: 1 / sqrt(d_head)
    out, _ = scaled_dot_product_attention(q, k, v, scale=scale)  # (B, n_heads, T_q, d_head)
    if bug not in ("no transpose", "plain reshape"):
        out = out.transpose(1, 2)
    return mha.out_proj(out.reshape(query.shape))


_MHA_BUGS = {  # bug -> hint, for _mha_by_hand(..., bug=bug)
    "sequence-first": Hint(
        "right for a batch of one, wrong beyond: the batch axis got mixed into the head split (reread 'The batch "
        "flattened into the head split').",
        "keep B as its own axis: x.view(B, T, n_heads, d_head).transpose(1, 2).",
    ),
    "unscaled": Hint(
        "the scores are not scaled: attention divides them by the square root of the head's size (chapter 1).",
        "divide the scores by math.sqrt(d_head).",
    ),
    "no transpose": Hint(
        "merging the heads must bring the positions back in front of the heads before the reshape; a plain "
        "reshape interleaves positions and heads (reread 'Where view fails').",
        "out.transpose(1, 2).reshape(B, T_q, d_model).",
    ),
    "plain reshape": Hint(
        f"you split and merge the heads with a plain reshape: each 'head' gets pieces of several positions "
        f"({_SPLIT_SECTION}).",
        "split with x.view(B, T, n_heads, d_head).transpose(1, 2); merge with transpose(1, 2) then "
        "reshape(B, T, d_model).",
    ),
}


@checker(starter=MHA_FORWARD_STARTER, reference=lambda mha, query, key, value: mha(query, key, value))
def check_multi_head_attention(c: Checker, mha_forward: Callable[..., Tensor]) -> None:
    """Check ``mha_forward(mha, query, key, value)`` equals ``mha(query, key, value)``, by hand with ``mha``'s
    projections. Shapes: query (B, T_q, d_model), key/value (B, T_k, d_model) -> (B, T_q, d_model)."""
    torch.manual_seed(2)  # @checker restores the reader's random state afterwards
    cases = (
        ("self-attention, batch of 1", 1, 5, 5),
        ("self-attention, batch of 3", 3, 5, 5),
        ("cross-attention, T_q=4 queries, T_k=9 keys", 2, 4, 9),
        ("decoding with a cache: 1 new query, T_k=6 keys", 2, 1, 6),
    )
    for name, B, T_q, T_k in cases:
        mha = MultiHeadAttention(16, 4).eval()
        query = torch.randn(B, T_q, 16)
        key = query if T_q == T_k else torch.randn(B, T_k, 16)
        with torch.no_grad():
            c.case(
                name,
                lambda mha, query, key, value: mha_forward(mha, query, key, value),
                mha(query, key, key),
                bugs=bug_table(_MHA_BUGS, _mha_by_hand, mha, query, key),
                hint=Hint(
                    "the steps of MultiHeadAttention.forward: project with the module's own projections, split "
                    "every tensor into heads, attend with the scale 1/sqrt(d_head), merge the heads, project out "
                    f"({_SPLIT_SECTION}).",
                    "project with mha.q_proj/k_proj/v_proj, split into heads (each tensor with its own length), "
                    "attend with scale 1/sqrt(d_head), merge heads (transpose(1, 2) then reshape), then mha.out_proj.",
                ),
                error_hint="" if T_q == T_k else _query_length_hint,
                inputs={"mha": mha, "query": query, "key": key, "value": key},
            )


# ---------------------------------------------------------------- Predict, then run: where attention starts to dominate

CROSSOVER_SETUP = {"d_model": 384, "n_heads": 12, "d_ff": 1536}
"""all-MiniLM-L6-v2's encoder layer: d_model 384, 12 heads, a feed-forward layer of width 1536."""


def attention_crossover(d_model: int, d_ff: int) -> float:
    """The length T at which an encoder layer's attention products cost as many multiply-adds as the rest of it:
    2 T² d_model (scores, weighted sum) = 4 T d_model² (projections) + 2 T d_model d_ff (feed-forward)."""
    return float(2 * d_model + d_ff)


@checker(answer="value", reference=attention_crossover(CROSSOVER_SETUP["d_model"], CROSSOVER_SETUP["d_ff"]))
def check_attention_crossover(c: Checker, prediction: float) -> None:
    """Check ``prediction``, the length T at which the attention products of all-MiniLM-L6-v2's encoder layer
    (d_model 384, 12 heads, d_ff 1536) cost as many multiply-adds as its projections and feed-forward layer."""
    d_model, n_heads, d_ff = (CROSSOVER_SETUP[k] for k in ("d_model", "n_heads", "d_ff"))
    expected = attention_crossover(d_model, d_ff)
    bugs: dict[float, str | Hint] = {
        2 * d_model: Hint(
            f"{2 * d_model} = 2 d_model is where attention overtakes the four projections alone (the chapter's "
            "table). The feed-forward layer belongs to the rest too.",
            "the feed-forward layer adds 2 T d_model d_ff to the rest.",
        ),
        d_ff: Hint(
            f"{d_ff} is the feed-forward layer's width, not a length: count its multiply-adds, and the four "
            "projections' as well.",
            "the feed-forward layer is two products, (T, d_model) x (d_model, d_ff) and back, 2 T d_model d_ff in "
            "all; the projections 4 T d_model².",
        ),
        2 * expected: "attention has two products of T² d_model each, the scores Q K^T and the weights times V: "
        "2 T² d_model, not T² d_model.",
        expected * n_heads: "the heads do not change the count: n_heads heads of size d_head = d_model / n_heads "
        "do n_heads T² d_head = T² d_model multiply-adds per product.",
    }
    c.case(
        f"T at which attention costs as much as the rest, d_model={d_model}, d_ff={d_ff}",
        lambda: prediction,
        expected,
        bugs=bugs,
        hint=Hint(
            "count the multiply-adds of every product as 'What attention costs' does: attention grows like T², the "
            "rest like T, and the crossover is where the two counts are equal.",
            "attention costs 2 T² d_model (scores and weighted sum), the rest 4 T d_model² (projections) plus "
            "2 T d_model d_ff (feed-forward). Divide both sides by 2 T d_model and solve for T.",
        ),
        atol=50.0,
    )
