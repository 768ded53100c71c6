"""Bad input gets a clear error that names what was expected and what was given."""

import pytest
import torch

from transformer_lib import (
    GPT,
    EncoderLayer,
    EncoderOnlyConfig,
    EncoderOnlyTransformer,
    GPTConfig,
    LayerNorm,
    MultiHeadAttention,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    causal_mask,
    combine_masks,
    padding_mask,
    prefix_lm_mask,
    scaled_dot_product_attention,
)


def test_every_model_config_is_checked_when_made():
    with pytest.raises(ValueError, match=r"Seq2SeqConfig.d_model \(10\) must be divisible by n_heads \(3\)"):
        Seq2SeqConfig(5, 5, d_model=10, n_heads=3)
    with pytest.raises(ValueError, match="Seq2SeqConfig.positional must be 'learned' or 'sinusoidal', got 'rope'"):
        Seq2SeqConfig(5, 5, positional="rope")
    with pytest.raises(ValueError, match="Seq2SeqConfig.pad_id must be an int >= 0, got -1"):
        Seq2SeqConfig(5, 5, pad_id=-1)
    with pytest.raises(ValueError, match="EncoderOnlyConfig.activation must be one of"):
        EncoderOnlyConfig(5, activation="tanh")
    with pytest.raises(ValueError, match="EncoderOnlyConfig.norm_eps must be a finite number > 0"):
        EncoderOnlyConfig(5, norm_eps=0.0)
    with pytest.raises(ValueError, match="EncoderOnlyConfig.dropout must be a probability"):
        EncoderOnlyConfig(5, dropout=1.0)
    with pytest.raises(TypeError, match="Seq2SeqTransformer expects a Seq2SeqConfig, got dict"):
        Seq2SeqTransformer({"src_vocab_size": 5})
    with pytest.raises(TypeError, match="EncoderOnlyTransformer expects an EncoderOnlyConfig, got GPTConfig"):
        EncoderOnlyTransformer(GPTConfig(vocab_size=5, block_size=8))


def test_d_model_not_divisible_by_n_heads():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(3\)"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=5, block_size=8, n_heads=3, d_model=10)


def test_sequence_longer_than_block_size():
    model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layers=1, n_heads=1, d_model=8))
    with pytest.raises(ValueError, match="length 9, longer than the model's context of 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_token_id_outside_vocabulary():
    model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layers=1, n_heads=1, d_model=8))
    with pytest.raises(ValueError, match=r"token id 7, outside the vocabulary \[0, 5\)"):
        model(torch.tensor([[1, 2, 7]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[1, -1]]))
    s2s = Seq2SeqTransformer(Seq2SeqConfig(5, 6, d_model=8, n_heads=2, d_ff=16))
    with pytest.raises(ValueError, match=r"tgt contains token id 6"):
        s2s(torch.tensor([[1, 2]]), torch.tensor([[6]]))


def test_mask_that_cannot_broadcast():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"mask of shape \(4, 4\) cannot broadcast to .* \(2, 2, 5, 5\)"):
        mha(x, mask=causal_mask(4))
    with pytest.raises(ValueError, match="cannot broadcast"):
        scaled_dot_product_attention(x, x, x, mask=torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="torch.bool"):
        mha(x, mask=torch.ones(5, 5))
    with pytest.raises(TypeError, match="boolean"):
        combine_masks(causal_mask(3), torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        padding_mask(torch.zeros(5, dtype=torch.long), 0)


def test_mask_shapes_and_prefixes_checked_where_they_enter():
    # a mask that broadcasts with the scores but adds axes would silently add axes to the output
    q = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 3, 3\) cannot broadcast .* \(3, 3\)"):
        scaled_dot_product_attention(q, q, q, mask=torch.ones(2, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"masks of shapes \(3, 3\) and \(2, 1, 1, 4\) cannot broadcast"):
        combine_masks(causal_mask(3), padding_mask(torch.ones(2, 4, dtype=torch.long), 0))
    with pytest.raises(ValueError, match=r"between 0 and T=4, got \[7, -1\]"):
        prefix_lm_mask(4, torch.tensor([7, -1]))
    assert prefix_lm_mask(4, torch.tensor([0, 4])).shape == (2, 1, 4, 4)  # the limits themselves are fine


def test_wrong_rank_and_dtype():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"query must have rank 3, got rank 2 with shape \(5, 8\)"):
        mha(torch.randn(5, 8))
    with pytest.raises(ValueError, match="last dimension 8"):
        mha(torch.randn(2, 5, 6))
    with pytest.raises(TypeError, match="floating-point"):
        mha(torch.ones(2, 5, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        GPT(GPTConfig(vocab_size=5, block_size=8, n_layers=1, n_heads=1, d_model=8))(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="rank 2"):
        GPT(GPTConfig(vocab_size=5, block_size=8, n_layers=1, n_heads=1, d_model=8))(torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        LayerNorm(4)([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="k and v must have the same length"):
        scaled_dot_product_attention(torch.randn(2, 4), torch.randn(3, 4), torch.randn(5, 4))


def test_bad_config_names():
    with pytest.raises(ValueError, match="activation must be one of"):
        EncoderLayer(8, 2, 16, activation="tanh")
    with pytest.raises(ValueError, match="positional must be one of"):
        GPTConfig(vocab_size=5, block_size=8, positional="t5-relative")
    assert GPTConfig(vocab_size=5, block_size=8, positional="alibi").positional == "alibi"  # chapter 4's ALiBi
    with pytest.raises(ValueError, match=r"norm must be one of \('layernorm', 'rmsnorm'\)"):
        GPTConfig(vocab_size=5, block_size=8, norm="batchnorm")


def test_seeds_and_counts_outside_their_range():
    from transformer_lib import set_seed
    from transformer_lib.tasks import make_pairs

    for seed in (2**64, -(2**63) - 1, 2**70):
        with pytest.raises(ValueError, match=r"seed must be an int in \[-2\*\*63, 2\*\*64\)"):
            set_seed(seed)
    with pytest.raises(TypeError, match="seed must be an int, got True"):
        set_seed(True)
    assert set_seed(2**64 - 1).initial_seed() == 2**64 - 1
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        make_pairs("copy", 0)
