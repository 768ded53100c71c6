"""Complete models: encoder-decoder, decoder-only (GPT) and encoder-only (BERT).

Every model can hand out all its attention maps, per layer and head, through
``attention_maps(...)`` for plotting and for bertviz.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_token_ids
from .attention import KVCache
from .layers import ACTIVATIONS, DecoderLayer, DecoderOnlyLayer, EncoderLayer
from .masks import padding_mask
from .norms import make_norm
from .positional import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from .sampling import sample_next_token

POSITIONALS = ("learned", "sinusoidal", "rope", "none")


def output_in_fp32(head: nn.Linear, h: Tensor) -> Tensor:
    """``head(h)``, in fp32 even under autocast.

    bf16 logits keep about 3 significant digits; rounding every logit adds noise that raises
    the cross-entropy on average, so the output projection (small: d_model x vocab) stays fp32.

    Shapes: h (..., d_model) -> logits (..., vocab_size).
    """
    if torch.is_autocast_enabled(h.device.type):
        with torch.autocast(h.device.type, enabled=False):
            return head(h.float())
    return head(h)


def _absolute_positions(kind: str, d_model: int, max_len: int) -> nn.Module | None:
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, max_len)
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len)
    if kind in ("rope", "none"):
        return None
    raise ValueError(f"positional must be one of {POSITIONALS}, got {kind!r}")


# --------------------------------------------------------------------------- encoder-decoder


class Seq2SeqTransformer(nn.Module):
    """The encoder-decoder Transformer of Vaswani et al. (2017).

    ``encode(src)`` runs the encoder once; ``decode(tgt, memory)`` runs the decoder
    (causal self-attention, cross-attention to ``memory``) and the output head;
    ``forward(src, tgt)`` does both and returns logits. Padding (``pad_id``) is masked
    in the source automatically.

    Shapes: src (B, S) token ids, tgt (B, T) token ids -> logits (B, T, tgt_vocab_size).

    Defined in chapter 6, Encoder-decoder.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 128, n_heads: int = 4,
                 n_encoder_layers: int = 2, n_decoder_layers: int = 2, d_ff: int = 512, dropout: float = 0.1,
                 max_len: int = 256, pad_id: int = 0, norm_first: bool = False, activation: str = "relu",
                 positional: str = "sinusoidal") -> None:
        super().__init__()
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"Seq2SeqTransformer supports positional 'learned' or 'sinusoidal', got {positional!r}")
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.d_model, self.max_len, self.pad_id = d_model, max_len, pad_id
        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.pos = _absolute_positions(positional, d_model, max_len)
        self.dropout = nn.Dropout(dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, activation, norm_first) for _ in range(n_encoder_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, activation, norm_first) for _ in range(n_decoder_layers))
        # Pre-LN stacks end un-normalized, so they get a final norm (as nn.Transformer does).
        self.encoder_norm = make_norm("layernorm", d_model) if norm_first else nn.Identity()
        self.decoder_norm = make_norm("layernorm", d_model) if norm_first else nn.Identity()
        self.head = nn.Linear(d_model, tgt_vocab_size)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def _embed(self, embedding: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        x = embedding(ids) * math.sqrt(self.d_model)  # (B, T, d_model), scaled as in the paper
        return self.dropout(self.pos(x, offset=offset))

    def src_mask(self, src: Tensor) -> Tensor:
        """Shapes: src (B, S) -> (B, 1, 1, S), True for real (non-pad) tokens."""
        return padding_mask(src, self.pad_id)

    def encode(self, src: Tensor, need_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Shapes: src (B, S) -> memory (B, S, d_model) [, per-layer weights (B, n_heads, S, S)]."""
        check_token_ids("src", src, self.src_vocab_size, self.max_len)
        mask, weights = self.src_mask(src), []
        x = self._embed(self.src_embed, src)
        for layer in self.encoder_layers:
            x = layer(x, mask=mask, need_weights=need_weights)
            if need_weights:
                x, w = x
                weights.append(w)
        x = self.encoder_norm(x)
        return (x, weights) if need_weights else x

    def decode(self, tgt: Tensor, memory: Tensor, src: Tensor, need_weights: bool = False,
               caches: list[tuple[KVCache, KVCache]] | None = None):
        """Decoder plus output head. ``src`` gives the padding mask for cross-attention.

        ``caches`` (one (self, cross) pair per layer, from :meth:`new_caches`) lets the
        caller feed only the new target tokens at each step.

        Shapes: tgt (B, T), memory (B, S, d_model), src (B, S) -> logits (B, T, tgt_vocab_size)
            [, (self weights (B, n_heads, T, T_k) per layer, cross weights (B, n_heads, T, S) per layer)]
        """
        offset = 0 if caches is None else len(caches[0][0])
        check_token_ids("tgt", tgt, self.tgt_vocab_size, self.max_len - offset)
        memory_mask = self.src_mask(src)
        x = self._embed(self.tgt_embed, tgt, offset=offset)
        self_w, cross_w = [], []
        for i, layer in enumerate(self.decoder_layers):
            self_cache, cross_cache = (None, None) if caches is None else caches[i]
            x = layer(x, memory, memory_mask=memory_mask, need_weights=need_weights, tgt_is_causal=True,
                      self_cache=self_cache, cross_cache=cross_cache)
            if need_weights:
                x, sw, cw = x
                self_w.append(sw)
                cross_w.append(cw)
        logits = output_in_fp32(self.head, self.decoder_norm(x))
        return (logits, (self_w, cross_w)) if need_weights else logits

    def new_caches(self) -> list[tuple[KVCache, KVCache]]:
        """Empty caches for incremental decoding: a growing self-attention cache and a static cross one per layer."""
        return [(KVCache(), KVCache(static=True)) for _ in self.decoder_layers]

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced logits. Shapes: src (B, S), tgt (B, T) -> (B, T, tgt_vocab_size)."""
        return self.decode(tgt, self.encode(src), src)

    @torch.no_grad()
    def attention_maps(self, src: Tensor, tgt: Tensor) -> dict[str, list[Tensor]]:
        """All attention weights: ``{"encoder": [...], "decoder": [...], "cross": [...]}``, one tensor per layer.

        Shapes: encoder (B, n_heads, S, S), decoder (B, n_heads, T, T), cross (B, n_heads, T, S).
        """
        memory, enc_w = self.encode(src, need_weights=True)
        _, (dec_w, cross_w) = self.decode(tgt, memory, src, need_weights=True)
        return {"encoder": enc_w, "decoder": dec_w, "cross": cross_w}


# --------------------------------------------------------------------------- decoder-only


@dataclass
class GPTConfig:
    """Hyper-parameters of :class:`GPT`.

    ``positional``: "learned" | "sinusoidal" | "rope" | "none"; ``norm``: "layernorm" | "rmsnorm";
    ``activation``: "gelu" | "gelu_tanh" | "relu" | "swiglu". ``d_ff`` defaults to ``4 d_model``
    (``8/3 d_model`` for SwiGLU, which keeps the parameter count about the same).
    """

    vocab_size: int
    block_size: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.0
    d_ff: int | None = None
    positional: str = "learned"
    norm: str = "layernorm"
    activation: str = "gelu"
    bias: bool = True
    norm_first: bool = True
    tie_weights: bool = True
    fused_norms: bool = True  # the norms' fused PyTorch kernels (same numbers as the written-out ones, faster)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "d_model"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.positional not in POSITIONALS:
            raise ValueError(f"positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        make_norm(self.norm, 1)  # validates the name
        if self.d_ff is None:
            self.d_ff = int(8 * self.d_model / 3) if self.activation == "swiglu" else 4 * self.d_model


class GPT(nn.Module):
    """A decoder-only Transformer language model (GPT-2 style, Pre-LN by default).

    Token embedding (+ absolute positions, unless RoPE), ``n_layer`` causal blocks,
    a final norm and an output head tied to the token embedding.
    ``forward(idx, targets)`` returns ``(logits, loss)``; ``generate`` samples with an
    optional key/value cache.

    Shapes: idx (B, T) with T <= block_size -> logits (B, T, vocab_size), loss scalar or None.

    Defined in chapter 7, Decoder-only.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = _absolute_positions(c.positional, c.d_model, c.block_size)
        # The fixed sinusoids have entries of size ~1 while the embeddings start at std 0.02: as in Vaswani et al.
        # (section 3.4), scale the token embeddings by sqrt(d_model) so that the positions do not drown them.
        self.emb_scale = math.sqrt(c.d_model) if c.positional == "sinusoidal" else 1.0
        self.dropout = nn.Dropout(c.dropout)
        d_head = c.d_model // c.n_head
        self.blocks = nn.ModuleList(
            DecoderOnlyLayer(c.d_model, c.n_head, c.d_ff, c.dropout, c.activation, c.norm_first, c.norm, bias=c.bias,
                             rotary=RotaryEmbedding(d_head, c.block_size) if c.positional == "rope" else None,
                             fused_norms=c.fused_norms)
            for _ in range(c.n_layer))
        self.norm_f = make_norm(c.norm, c.d_model, bias=c.bias, fused=c.fused_norms) if c.norm_first else nn.Identity()
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        for block in self.blocks:  # GPT-2: scale the projections that write into the residual stream
            for proj in (block.self_attn.out_proj, block.ff.linear2):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def _hidden(self, idx: Tensor, caches: list[KVCache] | None = None, need_weights: bool = False,
                checked: bool = False) -> tuple[Tensor, list[Tensor]]:
        offset = 0 if caches is None else len(caches[0])
        if checked:  # ids the model generated itself: in range by construction
            pass
        elif not (self.training and idx.is_cuda):  # the range check syncs with the host: skip it in GPU training
            check_token_ids("idx", idx, self.config.vocab_size, self.config.block_size - offset)
        elif idx.dim() != 2 or idx.shape[1] > self.config.block_size:
            raise ValueError(f"idx must be (B, T) with T <= block_size={self.config.block_size}, got {tuple(idx.shape)}")
        x = self.tok_emb(idx) * self.emb_scale  # (B, T, d_model)
        if self.pos is not None:
            x = self.pos(x, offset=offset)
        x = self.dropout(x)
        weights = []
        for i, block in enumerate(self.blocks):
            x = block(x, need_weights=need_weights, cache=None if caches is None else caches[i])
            if need_weights:
                x, w = x
                weights.append(w)
        return self.norm_f(x), weights

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                caches: list[KVCache] | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits for every position and, given ``targets`` (B, T), the mean cross-entropy.

        Targets equal to -100 are ignored. ``caches`` (from :meth:`new_caches`) hold the
        keys and values of earlier positions, so ``idx`` can be just the new tokens.
        """
        h, _ = self._hidden(idx, caches)
        logits = output_in_fp32(self.lm_head, h)  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        return logits, loss

    def new_caches(self) -> list[KVCache]:
        """One empty key/value cache per block."""
        return [KVCache() for _ in self.blocks]

    @torch.no_grad()
    def attention_maps(self, idx: Tensor) -> list[Tensor]:
        """Attention weights of every block. Shapes: idx (B, T) -> n_layer x (B, n_head, T, T)."""
        return self._hidden(idx, need_weights=True)[1]

    @torch.inference_mode()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, use_cache: bool = True, generator: torch.Generator | None = None,
                 return_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Append ``max_new_tokens`` sampled tokens to ``idx`` (``temperature=0``: greedy).

        Without a cache every step re-runs the model on the last ``block_size`` tokens;
        with it, each step feeds only the newest token. Both give the same tokens and
        logits. Once the context is full the window slides, and the cache is refilled
        from the last ``block_size`` tokens, exactly as the uncached model sees them.

        Shapes: idx (B, T0) -> (B, T0 + max_new_tokens) [, logits (B, max_new_tokens, vocab_size)].
        """
        block_size = self.config.block_size
        check_token_ids("idx", idx, self.config.vocab_size)
        caches, all_logits = None, []
        for _ in range(max_new_tokens):
            if not use_cache:
                h, _ = self._hidden(idx[:, -block_size:], checked=True)
            elif caches is None or len(caches[0]) + 1 > block_size:
                caches = self.new_caches()  # (re)fill the cache with the visible window
                h, _ = self._hidden(idx[:, -block_size:], caches, checked=True)
            else:
                h, _ = self._hidden(idx[:, -1:], caches, checked=True)
            logits = output_in_fp32(self.lm_head, h[:, -1, :])  # (B, vocab_size): only the last position is needed
            all_logits.append(logits)
            next_id = sample_next_token(logits, temperature, top_k, top_p, generator)  # (B,)
            idx = torch.cat([idx, next_id[:, None]], dim=1)
        if return_logits:
            return idx, torch.stack(all_logits, dim=1)
        return idx


# --------------------------------------------------------------------------- encoder-only


class EncoderOnlyTransformer(nn.Module):
    """A BERT-style encoder: word + position + segment embeddings, a norm, then Post-LN GELU layers.

    ``forward(input_ids, attention_mask)`` returns the last hidden states.
    :func:`transformer_lib.pretrained.load_minilm` fills it with all-MiniLM-L6-v2.

    Shapes: input_ids (B, T), attention_mask (B, T) of 1 for tokens and 0 for padding
        -> (B, T, d_model).

    Defined in chapter 7, Decoder-only (encoder-only models).
    """

    def __init__(self, vocab_size: int, max_len: int = 512, d_model: int = 384, n_heads: int = 12,
                 n_layers: int = 6, d_ff: int = 1536, type_vocab_size: int = 2, dropout: float = 0.0,
                 activation: str = "gelu", eps: float = 1e-12) -> None:
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.word_embed = nn.Embedding(vocab_size, d_model)
        self.pos = LearnedPositionalEmbedding(d_model, max_len)
        self.type_embed = nn.Embedding(type_vocab_size, d_model)
        self.embed_norm = make_norm("layernorm", d_model, eps)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, activation, norm_first=False, eps=eps)
            for _ in range(n_layers))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                need_weights: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        check_token_ids("input_ids", input_ids, self.vocab_size, self.max_len)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.pos(self.word_embed(input_ids)) + self.type_embed(token_type_ids)  # (B, T, d_model)
        x = self.dropout(self.embed_norm(x))
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                                 f"got {tuple(attention_mask.shape)}")
            mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        weights = []
        for layer in self.layers:
            x = layer(x, mask=mask, need_weights=need_weights)
            if need_weights:
                x, w = x
                weights.append(w)
        return (x, weights) if need_weights else x

    @torch.no_grad()
    def attention_maps(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
        """Shapes: input_ids (B, T) -> n_layers x (B, n_heads, T, T)."""
        return self(input_ids, attention_mask, need_weights=True)[1]
