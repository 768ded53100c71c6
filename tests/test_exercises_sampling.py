import torch

from transformer_lib.notebook import exercises as ex


def good_top_k(logits, k):
    kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def test_top_k_checker():
    assert ex.check_top_k_filter(good_top_k).passed
    assert "not 0" in ex.check_top_k_filter(lambda x, k: good_top_k(x, k).nan_to_num(neginf=0.0)).text
    flipped = ex.check_top_k_filter(lambda x, k: x.masked_fill(~torch.isinf(good_top_k(x, k)), float("-inf")))
    assert not flipped.passed
    assert (
        "min(k"
        in ex.check_top_k_filter(lambda x, k: x.masked_fill(x < x.topk(k, -1).values[..., -1:], float("-inf"))).text
    )


def test_top_p_checker():
    def good(logits, p):
        s, order = logits.sort(-1, descending=True)
        probs = s.softmax(-1)
        drop = probs.cumsum(-1) - probs >= p
        return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))

    def crosses(logits, p):
        s, order = logits.sort(-1, descending=True)
        drop = s.softmax(-1).cumsum(-1) > p
        return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))

    assert ex.check_top_p_filter(good).passed
    result = ex.check_top_p_filter(crosses)
    assert not result.passed and "makes the total cross p" in result.text
    unsorted = ex.check_top_p_filter(
        lambda x, p: x.masked_fill(x.softmax(-1).cumsum(-1) - x.softmax(-1) >= p, float("-inf"))
    )
    assert "sort the probabilities" in unsorted.text


def test_top_k_checker_blames_k_only_for_the_error_k_causes():
    def raises(logits, k):
        raise ValueError("not yet")

    result = ex.check_top_k_filter(raises)
    assert not result.passed and "min(k" not in result.text and result.text.count("Hint: kth = logits.topk") == 4
