import random

import pytest
import torch

from transformer_lib import Seq2SeqConfig, Seq2SeqTransformer
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.tasks import (
    ALPHABETS,
    BOS,
    EOS,
    PAD,
    Seq2SeqData,
    Seq2SeqTokenizer,
    make_pairs,
    random_date_pair,
    seq2seq_loss,
)
from transformer_lib.training import TrainConfig, Trainer


def test_tasks_are_what_they_say():
    for src, tgt in make_pairs("reverse", 20):
        assert tgt == src[::-1]
    for src, tgt in make_pairs("sort", 20):
        assert tgt == "".join(sorted(src))
    rng = random.Random(1)
    months = "january february march april may june july august september october november december".split()
    for _ in range(200):
        words, iso = random_date_pair(rng)
        year, month, day = map(int, iso.split("-"))
        assert str(year) in words and (months[month - 1] in words or months[month - 1][:3] in words)
        assert 1 <= day <= 31


def test_held_out_pairs_do_not_overlap_training():
    train = make_pairs("dates", 500, seed=0)
    test = make_pairs("dates", 200, seed=1, exclude={s for s, _ in train})
    assert not {s for s, _ in train} & {s for s, _ in test}
    with pytest.raises(ValueError, match="task must be one of"):
        make_pairs("translate", 3)


def test_tokenizer_and_batches():
    tok = Seq2SeqTokenizer(ALPHABETS["dates"])
    assert tok.itos[:3] == ["<pad>", "<bos>", "<eos>"]
    ids = tok.encode("may 5, 2001", bos=True, eos=True)
    assert ids[0] == BOS and ids[-1] == EOS and tok.decode(ids) == "may 5, 2001"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.encode("May")
    data = Seq2SeqData([("abc", "cba"), ("de", "ed")], Seq2SeqTokenizer("abcde"))
    src, tgt = data.batch(data.pairs)
    assert src.shape == (2, 3) and src[1, 2] == PAD
    assert tgt.shape == (2, 5) and tgt[0, 0] == BOS and tgt[0, 4] == EOS and tgt[1, 4] == PAD


def small_model(vocab):
    torch.manual_seed(0)
    config = Seq2SeqConfig(vocab, vocab, 32, 4, 1, 1, d_ff=64, dropout=0.0, max_len=32)
    return Seq2SeqTransformer(config).eval()


def test_greedy_with_cache_equals_without():
    model = small_model(13)
    src = torch.randint(3, 13, (4, 7))
    torch.testing.assert_close(
        greedy_decode(model, src, 12, bos_id=BOS, eos_id=EOS),
        greedy_decode(model, src, 12, bos_id=BOS, eos_id=EOS, use_cache=False),
    )


@torch.no_grad()
def beam_by_hand(model, src, max_len: int, eos: int, k: int, alpha: float) -> list[int]:
    """Chapter 6's beam search for one source (1, S), without a cache: the reference the library must equal."""
    memory, beams, best = model.encode(src), [([BOS], 0.0)], None  # live beams: (ids, total log-probability)
    for t in range(1, max_len + 1):
        ys = torch.tensor([seq for seq, _ in beams])  # (n_beams, t)
        logp = model.decode(ys, memory.expand(len(beams), -1, -1), src.expand(len(beams), -1))[:, -1].log_softmax(-1)
        total = torch.tensor([score for _, score in beams])[:, None] + logp  # (n_beams, V)
        top, flat = total.flatten().topk(2 * k)
        V, live = logp.shape[-1], []
        for score, f in zip(top.tolist(), flat.tolist(), strict=True):
            seq = [*beams[f // V][0], f % V]
            if f % V == eos:
                if best is None or score / t**alpha > best[0]:
                    best = (score / t**alpha, seq)
                continue
            live.append((seq, score))
            if len(live) == k:
                break
        beams = live
        if best is not None and max(score for _, score in beams) / max_len**alpha <= best[0]:
            break
    return best[1] if best is not None else max(beams, key=lambda b: b[1])[0]


def test_beam_search_of_a_batch_equals_each_source_by_hand():
    """The beams are chosen per example and per candidate as chapter 6 does it by hand, one source at a time:
    outputs that finish early and outputs that run to max_len (random weights large enough that the output
    follows the source, and an <eos> id these weights write at times)."""
    model = small_model(9)
    with torch.no_grad():
        for weight in (p for p in model.parameters() if p.dim() > 1):
            weight.normal_(0, 0.6, generator=torch.Generator().manual_seed(weight.numel()))
    src = torch.randint(3, 9, (12, 5), generator=torch.Generator().manual_seed(0))
    eos = 6
    for k, alpha in ((4, 1.0), (4, 0.0), (2, 0.0)):
        batch = beam_search(model, src, 9, bos_id=BOS, eos_id=eos, beam_size=k, length_penalty=alpha)
        assert 0 < batch.eq(eos).any(1).sum() < len(src) and len({tuple(row.tolist()) for row in batch}) > 3, batch
        for row, one in zip(batch, src.split(1), strict=True):
            by_hand = beam_by_hand(model, one, 9, eos, k, alpha)
            assert row[: len(by_hand)].tolist() == by_hand and row[len(by_hand) :].eq(PAD).all()


@pytest.fixture(scope="module")
def trained_reverser():
    tok = Seq2SeqTokenizer(ALPHABETS["reverse"])
    data = Seq2SeqData(make_pairs("reverse", 2000, min_len=3, max_len=6), tok)
    model = small_model(tok.vocab_size).train()
    cfg = TrainConfig(max_steps=500, lr=5e-3, warmup_steps=20, eval_interval=500)
    Trainer(model, cfg, data.sampler(64), loss_fn=seq2seq_loss, device="cpu").fit(progress=False)
    return model.eval(), tok


@pytest.mark.slow
def test_trained_model_decodes_held_out_reversals(trained_reverser):
    model, tok = trained_reverser
    test = make_pairs("reverse", 100, seed=7, min_len=3, max_len=6)
    src, _ = Seq2SeqData(test, tok).batch(test)
    for decode in (
        lambda s: greedy_decode(model, s, 8, bos_id=BOS, eos_id=EOS),
        lambda s: beam_search(model, s, 8, bos_id=BOS, eos_id=EOS, beam_size=3),
    ):
        out = decode(src)
        assert out[:, 0].eq(BOS).all()
        acc = sum(tok.decode(o[1:]) == t for o, (_, t) in zip(out, test, strict=True)) / len(test)
        assert acc > 0.9, acc


@pytest.mark.slow
def test_beam_of_one_without_length_penalty_is_greedy(trained_reverser):
    model, tok = trained_reverser
    test = make_pairs("reverse", 30, seed=3, min_len=3, max_len=6)
    src, _ = Seq2SeqData(test, tok).batch(test)
    greedy = greedy_decode(model, src, 8, bos_id=BOS, eos_id=EOS)
    beam = beam_search(model, src, 8, bos_id=BOS, eos_id=EOS, beam_size=1, length_penalty=0.0)
    for g, b in zip(greedy, beam, strict=True):
        assert tok.decode(g[1:]) == tok.decode(b[1:])
