import pytest
import torch

from transformer_lib.pretrained import load_minilm, mean_pool

SENTENCES = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell sharply today."]


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def test_minilm_equals_transformers_bert(minilm):
    from transformers import BertModel
    from transformers.utils import logging

    from transformer_lib.pretrained import minilm_dir

    logging.set_verbosity_error()
    model, tokenizer = minilm
    reference = BertModel.from_pretrained(
        str(minilm_dir()), local_files_only=True, add_pooling_layer=False, attn_implementation="eager"
    ).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0  # the batch really has padding
    with torch.no_grad():
        ours = model(batch["input_ids"], attention_mask=batch["attention_mask"])
        ref = reference(**batch, output_attentions=True)
    assert ours.shape == (3, batch["input_ids"].shape[1], 384)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], ref.last_hidden_state[real], atol=1e-4, rtol=1e-4)
    maps = model.attention_maps(batch["input_ids"], batch["attention_mask"])
    assert len(maps) == 6 and maps[0].shape[1] == 12
    torch.testing.assert_close(maps[3], ref.attentions[3], atol=1e-4, rtol=1e-4)


def test_minilm_sentence_embeddings_rank_paraphrase_first(minilm):
    model, tokenizer = minilm
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        emb = mean_pool(model(batch["input_ids"], attention_mask=batch["attention_mask"]), batch["attention_mask"])
    paraphrase, unrelated = (emb[0] @ emb[1]).item(), (emb[0] @ emb[2]).item()
    assert paraphrase > unrelated + 0.3, (paraphrase, unrelated)
