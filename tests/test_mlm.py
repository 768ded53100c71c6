"""BERT's masking recipe (transformer_lib.mlm.mask_tokens): the proportions over a large sample, the labels,
the special tokens, the loss that skips unselected positions, and the errors."""

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.mlm import IGNORE_INDEX, mask_tokens

PAD, CLS, MASK, V = 0, 1, 2, 1000


def sample(B: int = 400, T: int = 500, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, T), generator=g)
    ids[:, 0] = CLS
    ids[:, -20:] = PAD
    inputs, labels = mask_tokens(ids, MASK, V, special_ids=(PAD, CLS), generator=g)
    return ids, inputs, labels


def test_proportions_follow_the_recipe_over_a_large_sample():
    ids, inputs, labels = sample()
    maskable = (ids != PAD) & (ids != CLS)
    selected = labels != IGNORE_INDEX
    n = int(maskable.sum())  # 192,000 positions: the binomial standard deviations are below 0.1%
    assert abs(selected.sum().item() / n - 0.15) < 0.005
    s = int(selected.sum())
    to_mask = (inputs == MASK) & selected
    unchanged = (inputs == ids) & selected
    replaced = ~to_mask & ~unchanged & selected
    assert abs(to_mask.sum().item() / s - 0.8) < 0.015
    assert abs(replaced.sum().item() / s - 0.1 * (1 - 1 / (V - 3))) < 0.01  # a random id may equal the original
    assert abs(unchanged.sum().item() / s - 0.1) < 0.01


def test_labels_hold_the_originals_at_the_selected_positions_only():
    ids, inputs, labels = sample(B=50, T=100)
    selected = labels != IGNORE_INDEX
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(inputs[~selected], ids[~selected])  # unselected positions are never corrupted
    assert ((inputs != ids) <= selected).all()


def test_special_tokens_are_never_selected_nor_drawn_as_random_replacements():
    ids, inputs, labels = sample(B=100, T=200)
    assert (labels[(ids == PAD) | (ids == CLS)] == IGNORE_INDEX).all()
    replaced = (inputs != ids) & (inputs != MASK)
    assert replaced.any() and (inputs[replaced] >= 3).all()  # neither [PAD], [CLS] nor [MASK]
    # a vocabulary of one ordinary id: every random replacement is that id
    ids = torch.full((20, 50), 3)
    inputs, labels = mask_tokens(ids, MASK, 4, p=1.0, special_ids=(PAD, CLS), generator=torch.Generator())
    assert ((inputs == MASK) | (inputs == 3)).all() and (labels == 3).all()


def test_the_loss_counts_only_the_selected_positions():
    ids, inputs, labels = sample(B=4, T=60)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(*ids.shape, V, generator=g)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    selected = labels != IGNORE_INDEX
    changed = logits.clone()
    changed[~selected] = torch.randn(int((~selected).sum()), V, generator=g) * 10  # unselected positions
    assert torch.equal(F.cross_entropy(changed.flatten(0, 1), labels.flatten()), loss)
    by_hand = -logits.log_softmax(-1)[selected].gather(1, ids[selected][:, None]).mean()
    torch.testing.assert_close(loss, by_hand)


def test_same_generator_same_masks_and_a_1d_input():
    a = mask_tokens(torch.arange(3, 103), MASK, V, generator=torch.Generator().manual_seed(5))
    b = mask_tokens(torch.arange(3, 103)[None], MASK, V, generator=torch.Generator().manual_seed(5))
    assert a[0].shape == (100,) and torch.equal(a[0], b[0][0]) and torch.equal(a[1], b[1][0])
    assert a[0].dtype == a[1].dtype == torch.long
    none = mask_tokens(torch.arange(3, 103), MASK, V, p=0.0)
    assert torch.equal(none[0], torch.arange(3, 103)) and (none[1] == IGNORE_INDEX).all()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(ids=torch.zeros(2, 3).float()), TypeError, "integer token ids"),
        (dict(ids=[[3, 4]]), TypeError, "torch.Tensor"),
        (dict(ids=torch.zeros(2, 3, 4, dtype=torch.long)), ValueError, r"\(B, T\) or \(T,\)"),
        (dict(ids=torch.tensor([[3, V]])), ValueError, "vocab"),
        (dict(mask_id=V), ValueError, "mask_id must be < vocab_size"),
        (dict(p=1.5), ValueError, "p must be a probability"),
        (dict(special_ids=(V + 1,)), ValueError, "special_ids must be < vocab_size"),
        (dict(vocab_size=3, ids=torch.tensor([[0, 1]])), ValueError, "no id is left"),
        (dict(special_ids=None), TypeError, "special_ids must be an iterable of ints, got NoneType"),
        (dict(special_ids="01"), TypeError, "special_ids must be an iterable of ints, got str"),
        (dict(generator=5), TypeError, "generator must be a CPU torch.Generator or None, got 5"),
        (dict(ids=torch.tensor([[3, 4, 5]]).to_sparse()), TypeError, "ids must be a dense tensor, got layout"),
    ],
)
def test_bad_input_gets_a_clear_error(kwargs, error, match):
    args = dict(ids=torch.tensor([[3, 4, 5]]), mask_id=MASK, vocab_size=V, special_ids=(PAD, CLS)) | kwargs
    with pytest.raises(error, match=match):
        mask_tokens(**args)


def test_a_huge_vocabulary_costs_nothing_and_draws_only_ordinary_ids():
    """No tensor the size of the vocabulary: a 2**40 vocabulary (a 1 TB mask of allowed ids before) draws
    random replacements from the ids that are neither special nor mask_id, uniformly as for a small one."""
    big = 2**40
    ids = torch.tensor([[5, 6, 7, 8] * 500])
    specials = (0, 1, big - 1)
    inputs, labels = mask_tokens(ids, 2, big, p=1.0, special_ids=specials, generator=torch.Generator().manual_seed(0))
    drawn = inputs[(inputs != 2) & (inputs != ids)]
    assert len(drawn) > 100 and ((drawn > 2) & (drawn < big - 1)).all()
    assert drawn.max() > 2**39  # drawn over the whole range
    small = mask_tokens(ids, 2, 10, p=1.0, special_ids=(0, 1, 9), generator=torch.Generator().manual_seed(0))[0]
    assert set(small[(small != 2) & (small != ids)].tolist()) == {3, 4, 5, 6, 7, 8}  # every ordinary id, no other
