"""The library's models equal Hugging Face's GPT-2, LLaMA (grouped-query attention, RoPE theta 500000,
RMSNorm eps 1e-5) and BERT, after copying randomly initialised weights with the mappings written here.

Logits, greedy generation (with and without the KV cache) and left-padded batched generation
are compared. The GPT-2 and LLaMA mappings written here document how such a checkpoint loads; BERT goes through the
library's own mapping, the one that loads the real MiniLM.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from conftest import generate_with_logits, importorskip_unless_ci
from transformer_lib import GPT, EncoderOnlyConfig, EncoderOnlyTransformer, GPTConfig
from transformer_lib.pretrained import _bert_to_ours

transformers = importorskip_unless_ci("transformers")

ATOL = 1e-5
VOCAB, BLOCK = 61, 32


def _quiet(model):
    """Generation settings that make Hugging Face's greedy search comparable: no EOS stop, no warnings."""
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    return model.eval()


# --------------------------------------------------------------------------- GPT-2


def gpt2_pair(n_layers: int = 2, n_heads: int = 4, d_model: int = 32) -> tuple[GPT, torch.nn.Module]:
    hf_config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=BLOCK,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    hf = _quiet(transformers.GPT2LMHeadModel(hf_config))
    ours = GPT(
        GPTConfig(
            vocab_size=VOCAB,
            block_size=BLOCK,
            n_layers=n_layers,
            n_heads=n_heads,
            d_model=d_model,
            activation="gelu_tanh",
            norm_eps=1e-5,
            positional="learned",
            tie_weights=True,
        )
    ).eval()
    sd = hf.state_dict()
    mine = {
        "tok_emb.weight": sd["transformer.wte.weight"],
        "pos.weight": sd["transformer.wpe.weight"],
        "norm_f.weight": sd["transformer.ln_f.weight"],
        "norm_f.bias": sd["transformer.ln_f.bias"],
        "lm_head.weight": sd["transformer.wte.weight"],
    }
    for i in range(n_layers):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        # GPT-2 stores its linear layers as Conv1D: weight (in, out), the transpose of nn.Linear's.
        q, k, v = sd[h + "attn.c_attn.weight"].t().chunk(3)  # (d_model, d_model) each
        qb, kb, vb = sd[h + "attn.c_attn.bias"].chunk(3)
        mine |= {
            b + "self_attn.q_proj.weight": q,
            b + "self_attn.k_proj.weight": k,
            b + "self_attn.v_proj.weight": v,
            b + "self_attn.q_proj.bias": qb,
            b + "self_attn.k_proj.bias": kb,
            b + "self_attn.v_proj.bias": vb,
            b + "self_attn.out_proj.weight": sd[h + "attn.c_proj.weight"].t(),
            b + "self_attn.out_proj.bias": sd[h + "attn.c_proj.bias"],
            b + "ff.linear1.weight": sd[h + "mlp.c_fc.weight"].t(),
            b + "ff.linear1.bias": sd[h + "mlp.c_fc.bias"],
            b + "ff.linear2.weight": sd[h + "mlp.c_proj.weight"].t(),
            b + "ff.linear2.bias": sd[h + "mlp.c_proj.bias"],
        }
        for n in (1, 2):
            for p in ("weight", "bias"):
                mine[f"{b}norm{n}.{p}"] = sd[f"{h}ln_{n}.{p}"]
    ours.load_state_dict(mine, strict=True)
    return ours, hf


# --------------------------------------------------------------------------- LLaMA


def rope_halves_to_pairs(w: Tensor, n_heads: int) -> Tensor:
    """Reorder a q/k projection's output rows from Hugging Face's RoPE layout to this library's.

    Hugging Face rotates dimension i of a head with dimension i + d_head/2 ("rotate_half"); this
    library rotates neighbours (2i, 2i+1). Row i of each head goes to 2i, row i + d_head/2 to 2i + 1;
    q.k is unchanged because q and k are permuted alike.

    Shapes: w (n_heads * d_head, d_model) -> same.
    """
    d_head = w.shape[0] // n_heads
    w = w.view(n_heads, 2, d_head // 2, -1)  # (heads, halves, pairs, d_model)
    return w.transpose(1, 2).reshape(n_heads * d_head, -1)  # (heads, pairs, halves, d_model) -> rows 2i, 2i+1


def llama_pair(
    n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2, d_model: int = 32, d_ff: int = 72
) -> tuple[GPT, torch.nn.Module]:
    hf_config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=d_model,
        intermediate_size=d_ff,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=BLOCK,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    hf = _quiet(transformers.LlamaForCausalLM(hf_config))
    ours = GPT(
        GPTConfig(
            vocab_size=VOCAB,
            block_size=BLOCK,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            d_model=d_model,
            d_ff=d_ff,
            positional="rope",
            rope_base=500000.0,
            norm="rmsnorm",
            norm_eps=1e-5,
            activation="swiglu",
            bias=False,
            tie_weights=False,
        )
    ).eval()
    sd = hf.state_dict()
    mine = {
        "tok_emb.weight": sd["model.embed_tokens.weight"],
        "norm_f.weight": sd["model.norm.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(n_layers):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        mine |= {
            b + "self_attn.q_proj.weight": rope_halves_to_pairs(sd[h + "self_attn.q_proj.weight"], n_heads),
            b + "self_attn.k_proj.weight": rope_halves_to_pairs(sd[h + "self_attn.k_proj.weight"], n_kv_heads),
            b + "self_attn.v_proj.weight": sd[h + "self_attn.v_proj.weight"],
            b + "self_attn.out_proj.weight": sd[h + "self_attn.o_proj.weight"],
            # SwiGLU: linear1 computes [gate; value] = [gate_proj; up_proj], hidden = silu(gate) * value
            b + "ff.linear1.weight": torch.cat([sd[h + "mlp.gate_proj.weight"], sd[h + "mlp.up_proj.weight"]]),
            b + "ff.linear2.weight": sd[h + "mlp.down_proj.weight"],
            b + "norm1.weight": sd[h + "input_layernorm.weight"],
            b + "norm2.weight": sd[h + "post_attention_layernorm.weight"],
        }
    ours.load_state_dict(mine, strict=True)
    return ours, hf


PAIRS = {"gpt2": gpt2_pair, "llama-gqa": llama_pair}


@pytest.fixture(params=sorted(PAIRS))
def pair(request):
    torch.manual_seed(0)
    return PAIRS[request.param]()


def test_llama_pair_really_uses_grouped_query_attention():
    ours, hf = llama_pair()
    attn = ours.blocks[0].self_attn
    assert (attn.n_heads, attn.n_kv_heads) == (4, 2)
    assert attn.k_proj.weight.shape == hf.model.layers[0].self_attn.k_proj.weight.shape == (16, 32)
    assert ours.blocks[0].self_attn.rotary.cos.shape[0] == BLOCK


def test_logits_equal(pair):
    ours, hf = pair
    idx = torch.randint(VOCAB, (3, 20))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generation_equal(pair, use_cache):
    ours, hf = pair
    idx = torch.randint(VOCAB, (2, 6))
    mine, logits = generate_with_logits(ours, idx, 12, temperature=0, use_cache=use_cache)
    theirs = hf.generate(
        idx, max_new_tokens=12, do_sample=False, use_cache=use_cache, output_scores=True, return_dict_in_generate=True
    )
    assert torch.equal(mine, theirs.sequences)
    torch.testing.assert_close(logits, torch.stack(theirs.scores, dim=1), atol=ATOL, rtol=0)


def test_left_padded_batch_equals_each_prompt_alone_and_hugging_face(pair):
    ours, hf = pair
    prompts = [torch.randint(1, VOCAB, (n,)) for n in (7, 3, 5)]
    T0 = max(len(p) for p in prompts)
    idx = torch.zeros(len(prompts), T0, dtype=torch.long)  # pad id 0, on the left
    attention_mask = torch.zeros(len(prompts), T0, dtype=torch.long)
    for row, p in enumerate(prompts):
        idx[row, T0 - len(p) :] = p
        attention_mask[row, T0 - len(p) :] = 1
    batched, batched_logits = generate_with_logits(ours, idx, 8, temperature=0, attention_mask=attention_mask)
    for row, p in enumerate(prompts):
        alone, alone_logits = generate_with_logits(ours, p[None], 8, temperature=0)
        assert torch.equal(batched[row, T0 - len(p) :], alone[0]), f"row {row} differs from its prompt alone"
        torch.testing.assert_close(batched_logits[row], alone_logits[0], atol=ATOL, rtol=0)
    theirs = hf.generate(idx, attention_mask=attention_mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(batched, theirs)
    uncached = ours.generate(idx, 8, temperature=0, attention_mask=attention_mask, use_cache=False)
    assert torch.equal(batched, uncached)


def test_forward_with_padding_mask_equals_hugging_face(pair):
    ours, hf = pair
    idx = torch.randint(1, VOCAB, (2, 9))
    attention_mask = torch.ones_like(idx)
    attention_mask[0, :4] = 0  # left padding in the first row
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        mine = ours(idx, attention_mask=attention_mask)[0]
        theirs = hf(idx, attention_mask=attention_mask, position_ids=position_ids).logits
    real = attention_mask.bool()  # padding positions' outputs are meaningless in both
    torch.testing.assert_close(mine[real], theirs[real], atol=ATOL, rtol=0)


def test_generation_past_the_context_slides_the_window_like_uncached():
    torch.manual_seed(0)
    ours, _ = llama_pair()
    idx = torch.randint(VOCAB, (2, 5))
    cached = ours.generate(idx, BLOCK + 10, temperature=0, use_cache=True)
    uncached = ours.generate(idx, BLOCK + 10, temperature=0, use_cache=False)
    assert torch.equal(cached, uncached)


# --------------------------------------------------------------------------- BERT


def test_bert_equals_hugging_face():
    torch.manual_seed(0)
    n_layers, d_model, n_heads = 2, 32, 4
    hf = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=64,
            max_position_embeddings=BLOCK,
            type_vocab_size=2,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            layer_norm_eps=1e-12,
        ),
        add_pooling_layer=False,
    ).eval()
    config = EncoderOnlyConfig(VOCAB, BLOCK, d_model, n_heads, n_layers, d_ff=64, activation="gelu", norm_eps=1e-12)
    ours = EncoderOnlyTransformer(config).eval()
    # The mapping load_minilm uses for the real checkpoint (transformer_lib.pretrained._bert_to_ours).
    ours.load_state_dict(_bert_to_ours(hf.state_dict(), n_layers), strict=True)
    input_ids = torch.randint(VOCAB, (2, 11))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0  # right padding, as BERT tokenizers pad
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 5:] = 1
    with torch.no_grad():
        expected = hf(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        got = ours(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    real = attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=ATOL, rtol=0)
