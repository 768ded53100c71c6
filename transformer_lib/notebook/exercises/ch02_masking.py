"""Chapter 2, masking: ``check_decoder_mask`` (fix a causal + padding mask ported from PyTorch code),
``check_cheating_positions`` (a prediction: how many positions copy their target under a prefix-LM mask) and
``check_packed_mask`` (a mask for several documents packed into one row)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...masks import causal_mask, combine_masks, padding_mask, prefix_lm_mask
from ._framework import Checker, Hint, checker, two_bugs

ANSWER_MARKERS: dict[str, tuple[str, ...]] = {  # exercise label -> what gives its answer away
    "ex-decoder-mask": ("[:, None, None, :]", "~torch.triu(", "torch.tril(torch.ones(T, T"),
    "ex-prefix-cheat": ("positions 0, 1 and 2", "t + 1 < prefix_len", "t + 1 < 4"),
    "ex-packed-mask": ("doc_ids[:, :, None] == doc_ids[:, None, :]", "same_doc & causal"),
    "ex-left-padding": ("torch.eye(T, dtype=torch.bool)", "attend to itself", "a whole sequence is padding"),
}


# ---------------------------------------------------------------- Spot the bug: a decoder mask ported from PyTorch

DECODER_MASK_STARTER = """\
def decoder_mask(tokens, pad_id):
    # find and fix the bugs
    T = tokens.shape[1]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # (T, T)
    not_pad = (tokens != pad_id)[:, None, :, None]  # (B, 1, T, 1)
    return future & not_pad  # (B, 1, T, T), True = may attend
"""

_PITFALL = "reread 'A pitfall: nn.MultiheadAttention reads boolean masks the other way'"
_PADDING = "reread 'Padding masks: batches of different lengths'"


_KEYS = "(tokens != pad_id)[:, None, None, :], shape (B, 1, 1, T)"
_PARTS = {  # a wrong causal part (T, T) or padding part (broadcastable to (B, 1, T, T)): what is wrong with it
    "future": Hint(
        "the causal part is True on the FUTURE keys, the convention of nn.MultiheadAttention and "
        f"nn.Transformer, where True means blocked; here True means 'may attend' ({_PITFALL}).",
        "the lower triangle, torch.tril(torch.ones(T, T, dtype=torch.bool)) (or ~ of the triu).",
    ),
    "strict": Hint(
        "the diagonal is masked, yet a position may attend to itself: key j is allowed for j <= i.",
        "torch.tril with diagonal=0.",
    ),
    "queries": Hint(
        "the padding is on the QUERY axis, (B, 1, T, 1): that empties the rows of the padding positions, "
        f"which nobody needs, and hides no padding from the real queries ({_PADDING}).",
        f"hide the padding as KEYS, from every query: {_KEYS}.",
    ),
    "both": Hint(
        "you hide the padding queries as well as the padding keys: the emptied rows are NaN with a plain "
        "softmax (reread 'Fully masked rows: NaN, or zeros').",
        f"hide the keys only: {_KEYS}.",
    ),
    "inverted": Hint(
        "the padding part is inverted: it lets the queries see the padding and hides the real tokens.",
        "tokens != pad_id marks the real tokens, which may be attended to.",
    ),
    "none": Hint(f"the padding keys are not hidden ({_PADDING}).", f"AND the causal part with {_KEYS}."),
}
_NO_HEAD_AXIS = Hint(
    "right values, but shape (B, T, T) does not broadcast over the heads: the mask needs a head axis.",
    "add the head axis, (B, 1, T, T): mask[:, None].",
)
_DECODER_MASK_BUGS = {  # "causal + padding" -> hint, for _decoder_mask(..., bug=bug): every wrong combination
    f"{causal} + {padding}".strip(" +"): two_bugs(_PARTS[causal], _PARTS[padding])
    if causal and padding
    else _PARTS[causal or padding]
    for causal in ("", "future", "strict")
    for padding in ("", "queries", "both", "inverted", "none")
    if causal or padding
} | {"no head axis": _NO_HEAD_AXIS}


def _decoder_mask(tokens: Tensor, pad_id: int, *, bug: str = "") -> Tensor:
    """The mask by hand (the checker refuses the library's masks), or with a bug of :data:`_DECODER_MASK_BUGS`."""
    T, real = tokens.shape[1], tokens != pad_id  # real: (B, T)
    ones, parts = torch.ones(T, T, dtype=torch.bool), bug.split(" + ")
    causal = ones.triu(diagonal=1) if "future" in parts else ones.tril(diagonal=-1 if "strict" in parts else 0)
    paddings = {
        "keys": real[:, None, None, :],
        "queries": real[:, None, :, None],
        "both": real[:, None, :, None] & real[:, None, None, :],
        "inverted": (~real)[:, None, None, :],
        "none": torch.ones_like(real)[:, None, None, :],
    }
    mask = causal & paddings[next((p for p in parts if p in paddings), "keys")]
    return mask[:, 0] if bug == "no head axis" else mask


@checker(starter=DECODER_MASK_STARTER, reference=_decoder_mask)
def check_decoder_mask(c: Checker, decoder_mask: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``decoder_mask(tokens, pad_id)``, boolean, True where query i may attend to key j (j <= i and token j
    not padding), built without the library's masks. Shapes: tokens (B, T) -> (B, 1, T, T)."""
    cases = (
        ("no padding: one sequence of 4 tokens", torch.tensor([[5, 6, 7, 8]]), 0),
        ("right padding, pad_id=0", torch.tensor([[5, 6, 7, 0, 0], [8, 9, 3, 4, 1]]), 0),
        ("left padding, as for batched generation, pad_id=0", torch.tensor([[0, 0, 4, 6, 1], [0, 5, 3, 8, 2]]), 0),
        ("left and right padding, pad_id=3", torch.tensor([[3, 1, 2, 3], [4, 5, 6, 7], [3, 3, 8, 9]]), 3),
    )
    with c.refuse_library_calls(
        causal_mask,
        padding_mask,
        combine_masks,
        prefix_lm_mask,
        name="fixed by hand, without transformer_lib's mask functions",
        hint="the exercise asks you to find the two bugs of the ported code and fix them; the library's "
        "causal_mask, padding_mask and combine_masks already hold the answer, so calling them fixes nothing.",
    ):
        c.cases(
            decoder_mask,
            [(name, {"tokens": tokens, "pad_id": pad_id}) for name, tokens, pad_id in cases],
            lambda tokens, pad_id: combine_masks(causal_mask(tokens.shape[1]), padding_mask(tokens, pad_id)),
            _DECODER_MASK_BUGS,
            _decoder_mask,
            hint=Hint(
                "query i may attend to key j when j <= i and token j is not padding: a causal part AND a "
                "padding part, with True = may attend (reread 'Combining masks').",
                "causal & not_padding, with causal = torch.tril(torch.ones(T, T, dtype=torch.bool)) and the "
                "padding keys hidden: not_padding = (tokens != pad_id)[:, None, None, :].",
            ),
        )


# ---------------------------------------------------------------- Predict, then run: positions that cheat

CHEATING_SETUP = {"T_in": 7, "prefix_len": 4}
"""The exercise's model: chapter 2's TinyLM on T_in = 7 input tokens (targets shifted by one), with
prefix_lm_mask(7, 4) instead of the causal mask."""


def cheating_positions(T_in: int, prefix_len: int) -> int:
    """How many queries t the prefix-LM mask lets attend to their target, input token t + 1."""
    mask = prefix_lm_mask(T_in, prefix_len)
    return sum(bool(mask[t, t + 1]) for t in range(T_in - 1))  # the last target is not among the inputs


@checker(answer="value", reference=cheating_positions(**CHEATING_SETUP))  # measured: test_exercises_ch02.py
def check_cheating_positions(c: Checker, prediction: int) -> None:
    """Check ``prediction``, the number of positions (of 7) at which chapter 2's TinyLM, trained on random tokens
    with ``prefix_lm_mask(7, prefix_len=4)`` instead of the causal mask, learns to copy its target."""
    T_in, prefix_len = CHEATING_SETUP["T_in"], CHEATING_SETUP["prefix_len"]
    bugs = {
        0: "the prefix is bidirectional: a query inside it sees the LATER prefix tokens too, and the next token is "
        "one of them.",
        prefix_len: f"off by one: the last prefix position, {prefix_len - 1}, has its target at position "
        f"{prefix_len}, after the prefix, where it cannot look.",
        T_in - 1: "that is the unmasked model's count: after the prefix the mask is causal, and a causal query "
        "cannot see the next token.",
    }
    c.case(
        f"positions that can see their target, {T_in} inputs, prefix_len={prefix_len}",
        lambda: prediction,
        float(cheating_positions(T_in, prefix_len)),
        bugs=bugs,
        hint=Hint(
            "the target of position t is input token t + 1 (reread 'Why decoders need a causal mask'), so position "
            "t can copy it exactly when the mask lets query t attend to key t + 1: look at the prefix-LM mask "
            "(reread 'Prefix-LM masks') just above its diagonal.",
            "under the prefix-LM mask query t sees key t + 1 exactly when t + 1 is inside the prefix: "
            "t + 1 < prefix_len.",
        ),
        atol=0.4,
    )


# ---------------------------------------------------------------- Extend: packed documents


def reference_packed_mask(doc_ids: Tensor) -> Tensor:
    """Causal within each document, nothing across documents. doc_ids (B, T) -> (B, 1, T, T)."""
    same = doc_ids[:, :, None] == doc_ids[:, None, :]  # (B, T_q, T_k)
    return (same & causal_mask(doc_ids.shape[1], device=doc_ids.device))[:, None]


def _wrong_packed_mask(doc_ids: Tensor, *, bug: str) -> Tensor:
    if bug == "inverted":
        return ~reference_packed_mask(doc_ids)
    if bug == "no head axis":
        return reference_packed_mask(doc_ids)[:, 0]
    if bug == "not causal":
        return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]
    causal = causal_mask(doc_ids.shape[1])  # "one document"
    return causal.expand(doc_ids.shape[0], 1, *causal.shape)


_SAME_DOCUMENT = "doc_ids[:, :, None] == doc_ids[:, None, :]"
_PACKED_BUGS = {  # bug -> hint, for _wrong_packed_mask(..., bug=bug)
    "inverted": Hint(
        "the polarity is inverted: True must mean 'may attend' (reread 'A mask is a table of allowed pairs').",
        "invert the mask with ~.",
    ),
    "not causal": Hint(
        "a document's tokens see their own future: within a document the mask must still be causal.",
        "AND the same-document mask with the causal mask.",
    ),
    "one document": Hint(
        "the documents see each other: the causal mask alone lets a token attend to the documents before its own "
        "(reread 'Combining masks').",
        f"AND it with a same-document mask, {_SAME_DOCUMENT}.",
    ),
    "no head axis": _NO_HEAD_AXIS,
}


@checker(
    reference=lambda doc_ids: causal_mask(doc_ids.shape[1]) & (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]
)
def check_packed_mask(c: Checker, packed_mask: Callable[[Tensor], Tensor]) -> None:
    """Check ``packed_mask(doc_ids)``, boolean, True where query i may attend to key j (j <= i, both in the same
    document). Shapes: doc_ids (B, T) integer ids, each document a contiguous run -> (B, 1, T, T)."""
    cases = (
        ("one row, documents of lengths 3, 2, 3", torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])),
        ("a batch of 2 rows, any ids", torch.tensor([[7, 7, 3, 3, 3, 3, 9, 9], [1, 1, 1, 1, 1, 2, 2, 2]])),
        ("one document: the causal mask", torch.tensor([[4, 4, 4, 4, 4]])),
        ("every token its own document", torch.tensor([[0, 1, 2, 3]])),
    )
    c.cases(
        packed_mask,
        [(name, {"doc_ids": doc_ids}) for name, doc_ids in cases],
        reference_packed_mask,
        _PACKED_BUGS,
        _wrong_packed_mask,
        hint=Hint(
            "query i may attend to key j when j <= i and both lie in the same document: compare every "
            "query's document with every key's, (B, T_q, T_k), and combine that with the causal mask "
            "(reread 'Combining masks').",
            f"{_SAME_DOCUMENT} (B, T_q, T_k), AND it with the causal mask, and add the head axis: (B, 1, T, T).",
        ),
    )
