"""Complete models: encoder-decoder, decoder-only (GPT) and encoder-only (BERT).

Each model takes a frozen config dataclass (:class:`Seq2SeqConfig`, :class:`GPTConfig`,
:class:`EncoderOnlyConfig`), checked when made, and builds its layers from it by keyword. Every
model can hand out all its attention maps, per layer and head, through ``attention_maps(...)``
for plotting and for bertviz.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validate import (
    _validate_attention_mask,
    _validate_int,
    _validate_left_padded,
    _validate_real,
    _validate_tensor,
    _validate_token_ids,
)
from .attention import KVCache
from .layers import ACTIVATIONS, DecoderLayer, DecoderOnlyLayer, EncoderLayer, run_layers
from .masks import padding_mask
from .norms import NORMS, make_norm
from .positional import ALiBi, LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from .precision import output_in_fp32
from .sampling import _validate_sampling, sample_next_token
from .utils import eval_mode

POSITIONALS = ("learned", "sinusoidal", "rope", "alibi", "none")


def _validate_config(c: Any, ints: tuple[str, ...], bools: tuple[str, ...]) -> None:
    """The checks every model config shares: positive ints, booleans, ``d_model`` divisible by
    ``n_heads``, a known activation, a dropout probability."""
    name = type(c).__name__
    for field in ints:
        _validate_int(f"{name}.{field}", getattr(c, field))
    for field in bools:
        if not isinstance(getattr(c, field), bool):
            raise ValueError(f"{name}.{field} must be True or False, got {getattr(c, field)!r}")
    if c.d_model % c.n_heads:
        raise ValueError(f"{name}.d_model ({c.d_model}) must be divisible by n_heads ({c.n_heads})")
    if c.activation not in ACTIVATIONS:
        raise ValueError(f"{name}.activation must be one of {ACTIVATIONS}, got {c.activation!r}")
    _validate_real(f"{name}.dropout", c.dropout, "a probability in [0, 1)", lambda p: 0.0 <= p < 1.0)


def _layer_kwargs(c: Any, **more: Any) -> dict[str, Any]:
    """The keyword arguments of a config's layers: the fields every layer takes, and ``more``."""
    return dict(d_model=c.d_model, n_heads=c.n_heads, d_ff=c.d_ff, dropout=c.dropout, activation=c.activation, **more)


def _absolute_positions(kind: str, d_model: int, max_len: int) -> nn.Module | None:
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, max_len)
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_len)
    return None  # rope, alibi, none: nothing added to the embeddings


# --------------------------------------------------------------------------- encoder-decoder


@dataclass(frozen=True)
class Seq2SeqConfig:
    """Hyper-parameters of :class:`Seq2SeqTransformer`, checked when made and immutable after.

    ``positional``: "sinusoidal" | "learned"; ``activation``: "relu" | "gelu" | "gelu_tanh" | "swiglu";
    ``max_len`` bounds the source and the target; ``pad_id`` is the source's padding id (masked).

    Defined in chapter 6, Encoder-decoder.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.1
    max_len: int = 256
    pad_id: int = 0
    norm_first: bool = False
    activation: str = "relu"
    positional: str = "sinusoidal"

    def __post_init__(self) -> None:
        ints = ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers")
        _validate_config(self, (*ints, "d_ff", "max_len"), ("norm_first",))
        _validate_int("Seq2SeqConfig.pad_id", self.pad_id, minimum=0)
        if self.positional not in ("learned", "sinusoidal"):
            raise ValueError(f"Seq2SeqConfig.positional must be 'learned' or 'sinusoidal', got {self.positional!r}")


class Seq2SeqTransformer(nn.Module):
    """The encoder-decoder Transformer of Vaswani et al. (2017), built from a :class:`Seq2SeqConfig`.

    ``encode(src)`` runs the encoder; ``decode(tgt, memory, src)`` the decoder and the output head;
    ``forward(src, tgt)`` both. The source's padding (``pad_id``) is masked.

    Shapes: src (B, S) token ids, tgt (B, T) token ids -> logits (B, T, tgt_vocab_size).

    Defined in chapter 6, Encoder-decoder.
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        if not isinstance(config, Seq2SeqConfig):
            raise TypeError(f"Seq2SeqTransformer expects a Seq2SeqConfig, got {type(config).__name__}")
        self.config = c = config
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.pos = _absolute_positions(c.positional, c.d_model, c.max_len)
        self.dropout = nn.Dropout(c.dropout)
        layer = _layer_kwargs(c, norm_first=c.norm_first)
        self.encoder_layers = nn.ModuleList(EncoderLayer(**layer) for _ in range(c.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(**layer) for _ in range(c.n_decoder_layers))
        # Pre-LN stacks end un-normalized, so they get a final norm (as nn.Transformer does).
        self.encoder_norm = make_norm("layernorm", c.d_model) if c.norm_first else nn.Identity()
        self.decoder_norm = make_norm("layernorm", c.d_model) if c.norm_first else nn.Identity()
        self.head = nn.Linear(c.d_model, c.tgt_vocab_size)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def _embed(self, embedding: nn.Embedding, ids: Tensor, offset: int = 0) -> Tensor:
        x = embedding(ids) * math.sqrt(self.config.d_model)  # (B, T, d_model), scaled as in the paper
        return self.dropout(self.pos(x, offset=offset) if self.pos is not None else x)

    def src_mask(self, src: Tensor) -> Tensor:
        """Shapes: src (B, S) -> (B, 1, 1, S), True for real (non-pad) tokens."""
        return padding_mask(src, self.config.pad_id)

    def encode(self, src: Tensor) -> Tensor:
        """Shapes: src (B, S) -> memory (B, S, d_model)."""
        return self._encode(src)[0]

    def _encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        src = _validate_token_ids("src", src, self.config.src_vocab_size, self.config.max_len)
        x = self._embed(self.src_embed, src)
        x, weights = run_layers(self.encoder_layers, x, need_weights, mask=self.src_mask(src))
        return self.encoder_norm(x), weights

    def decode(
        self, tgt: Tensor, memory: Tensor, src: Tensor, caches: list[tuple[KVCache, KVCache]] | None = None
    ) -> Tensor:
        """Decoder plus output head; ``src`` gives the padding mask for cross-attention. With ``caches`` (from
        :meth:`new_caches`) ``tgt`` is only the new target tokens.

        Shapes: tgt (B, T), memory (B, S, d_model), src (B, S) -> logits (B, T, tgt_vocab_size)
        """
        return self._decode(tgt, memory, src, caches)[0]

    def _decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src: Tensor,
        caches: list[tuple[KVCache, KVCache]] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        offset = 0 if caches is None else len(caches[0][0])
        tgt = _validate_token_ids("tgt", tgt, self.config.tgt_vocab_size, self.config.max_len - offset)
        x = self._embed(self.tgt_embed, tgt, offset=offset)
        per_layer = None
        if caches is not None:  # one (self, cross) pair per layer
            per_layer = {"self_cache": [c[0] for c in caches], "cross_cache": [c[1] for c in caches]}
        memory_mask = self.src_mask(src)
        x, weights = run_layers(
            self.decoder_layers, x, need_weights, per_layer, memory=memory, memory_mask=memory_mask, tgt_is_causal=True
        )
        return output_in_fp32(self.head, self.decoder_norm(x)), weights

    def new_caches(self) -> list[tuple[KVCache, KVCache]]:
        """Empty caches for incremental decoding: a growing self-attention cache and a static cross one per layer."""
        return [(KVCache(), KVCache(static=True)) for _ in self.decoder_layers]

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced logits. Shapes: src (B, S), tgt (B, T) -> (B, T, tgt_vocab_size)."""
        return self.decode(tgt, self.encode(src), src)

    @torch.no_grad()
    def attention_maps(self, src: Tensor, tgt: Tensor) -> dict[str, list[Tensor]]:
        """All attention weights (eval mode): ``{"encoder": [...], "decoder": [...], "cross": [...]}``, one per layer.

        Shapes: encoder (B, n_heads, S, S), decoder (B, n_heads, T, T), cross (B, n_heads, T, S).
        """
        with eval_mode(self):
            memory, encoder = self._encode(src, need_weights=True)
            _, weights = self._decode(tgt, memory, src, need_weights=True)
        return {"encoder": encoder, "decoder": [w[0] for w in weights], "cross": [w[1] for w in weights]}


# --------------------------------------------------------------------------- decoder-only


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of :class:`GPT`, checked when made and immutable after (``dataclasses.replace`` keeps
    the derived ``d_ff``, ``n_kv_heads`` and ``norm_eps`` unless passed as None).

    ``positional``: "learned" | "sinusoidal" | "rope" | "alibi" | "none"; ``norm``: "layernorm" | "rmsnorm";
    ``activation``: "gelu" | "gelu_tanh" | "relu" | "swiglu". ``d_ff`` defaults to ``4 d_model`` (``8/3 d_model``
    for SwiGLU); ``n_kv_heads < n_heads`` is grouped-query attention; ``norm_eps`` defaults to 1e-5
    (LayerNorm) or 1e-6 (RMSNorm); ``rope_base`` is RoPE's theta.

    Defined in chapter 7, Decoder-only.
    """

    vocab_size: int
    block_size: int
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    n_kv_heads: int | None = None
    dropout: float = 0.0
    d_ff: int | None = None
    positional: str = "learned"
    rope_base: float = 10000.0
    norm: str = "layernorm"
    norm_eps: float | None = None
    activation: str = "gelu"
    bias: bool = True
    norm_first: bool = True
    tie_weights: bool = True
    fused_norms: bool = True  # the norms' fused PyTorch kernels (same numbers as the written-out ones, faster)

    def __post_init__(self) -> None:
        ints = ("vocab_size", "block_size", "n_layers", "n_heads", "d_model")
        _validate_config(self, ints, ("bias", "norm_first", "tie_weights", "fused_norms"))
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.d_ff is None:
            object.__setattr__(
                self, "d_ff", int(8 * self.d_model / 3) if self.activation == "swiglu" else 4 * self.d_model
            )
        if self.norm_eps is None:
            object.__setattr__(self, "norm_eps", 1e-6 if self.norm == "rmsnorm" else 1e-5)
        n_kv_heads = _validate_int("GPTConfig.n_kv_heads", self.n_kv_heads)
        _validate_int("GPTConfig.d_ff", self.d_ff)
        if self.n_heads % n_kv_heads:
            raise ValueError(f"GPTConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        if self.positional not in POSITIONALS:
            raise ValueError(f"GPTConfig.positional must be one of {POSITIONALS}, got {self.positional!r}")
        if self.positional == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: d_head = {self.d_model // self.n_heads} must be even")
        if self.norm not in NORMS:
            raise ValueError(f"GPTConfig.norm must be one of {NORMS}, got {self.norm!r}")
        for name in ("rope_base", "norm_eps"):
            _validate_real(f"GPTConfig.{name}", getattr(self, name), "a finite number > 0", lambda x: x > 0)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


def _gpt_block(c: GPTConfig) -> DecoderOnlyLayer:
    """One causal block as the config describes it, its positional scheme included: RoPE rotates
    q and k, ALiBi biases the scores (neither has parameters); the other schemes act on the embeddings."""
    return DecoderOnlyLayer(
        **_layer_kwargs(c, n_kv_heads=c.n_kv_heads, norm_first=c.norm_first, norm=c.norm, eps=c.norm_eps, bias=c.bias),
        fused_norms=c.fused_norms,
        rotary=RotaryEmbedding(c.d_head, c.block_size, c.rope_base) if c.positional == "rope" else None,
        alibi=ALiBi(c.n_heads) if c.positional == "alibi" else None,
    )


class GPT(nn.Module):
    """A decoder-only Transformer language model (GPT-2 style, Pre-LN by default).

    Token embedding (+ absolute positions), ``n_layers`` causal blocks, a final norm and an output head
    (tied to the token embedding unless ``tie_weights=False``). ``forward(idx, targets)`` checks its inputs
    and returns ``(logits, loss)``; ``logits(idx)`` is the same pass unchecked; ``generate`` samples. All
    three take an ``attention_mask`` (B, T) for left-padded batches. ``model.activation_checkpointing = True``
    recomputes each block in the backward pass instead of keeping its activations.

    Shapes: idx (B, T) with T <= block_size -> logits (B, T, vocab_size), loss scalar or None.

    Defined in chapter 7, Decoder-only.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT expects a GPTConfig, got {type(config).__name__}")
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = _absolute_positions(c.positional, c.d_model, c.block_size)
        # The fixed sinusoids have entries of size ~1 while the embeddings start at std 0.02: as in Vaswani et al.
        # (section 3.4), scale the token embeddings by sqrt(d_model) so that the positions do not drown them.
        self.emb_scale = math.sqrt(c.d_model) if c.positional == "sinusoidal" else 1.0
        self.dropout = nn.Dropout(c.dropout)
        self.activation_checkpointing = False
        blocks = [_gpt_block(c) for _ in range(c.n_layers)]
        self.blocks = nn.ModuleList(blocks)
        self.norm_f: nn.Module = nn.Identity()
        if c.norm_first:  # Pre-LN blocks end un-normalized
            self.norm_f = make_norm(c.norm, c.d_model, c.norm_eps, bias=c.bias, fused=c.fused_norms)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init_weights)
        for block in blocks:  # GPT-2: scale the projections that write into the residual stream
            for proj in (block.self_attn.out_proj, block.ff.linear2):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _validate(self, idx: Tensor, attention_mask: Tensor | None, past: int = 0) -> tuple[Tensor, Tensor | None]:
        """Check the token ids and the padding mask once, at the model's boundary; the ids as long, the mask as bool."""
        idx = _validate_token_ids("idx", idx, self.config.vocab_size, self.config.block_size - past)
        if attention_mask is None:
            return idx, None
        return idx, _validate_attention_mask(attention_mask, idx.shape[0], past + idx.shape[1])

    def _hidden(
        self,
        idx: Tensor,
        caches: list[KVCache] | None = None,
        attention_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        """Embed, run the blocks, apply the final norm; unchecked. ``attention_mask`` (B, T_past + T), False for
        left padding: padding is never attended to, and positions count only the real tokens.

        Shapes: idx (B, T) -> h (B, T, d_model), n_layers x weights (B, n_heads, T, T_past + T).
        """
        offset = 0 if caches is None else len(caches[0])
        mask = positions = None
        if attention_mask is not None:
            mask = attention_mask[:, None, None, :]  # (B, 1, 1, T_k): keys that are real tokens
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -idx.shape[1] :]  # (B, T)
        x = self.tok_emb(idx) * self.emb_scale  # (B, T, d_model)
        if self.pos is not None:
            x = self.pos(x, offset=offset, positions=positions)
        x = self.dropout(x)
        per_layer = None if caches is None else {"cache": caches}
        checkpointed = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        x, weights = run_layers(self.blocks, x, need_weights, per_layer, checkpointed, mask=mask, positions=positions)
        return self.norm_f(x), weights

    def logits(
        self,
        idx: Tensor,
        *,
        caches: list[KVCache] | None = None,
        attention_mask: Tensor | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """The logits for every position of ``idx`` (``last_only``: the last one's alone), unchecked. The caller
        promises what :meth:`forward` checks: torch.long ids in ``[0, vocab_size)``, ``len(caches[0]) + T <=
        block_size``, and a boolean ``attention_mask`` (B, T_past + T), False for left padding.

        Shapes: idx (B, T) -> logits (B, T, vocab_size), or (B, 1, vocab_size) with ``last_only``;
            fp32 under autocast.
        """
        h, _ = self._hidden(idx, caches, attention_mask)
        return output_in_fp32(self.lm_head, h[:, -1:] if last_only else h)

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        caches: list[KVCache] | None = None,
        attention_mask: Tensor | None = None,
        return_logits: bool = True,
    ) -> tuple[Tensor | None, Tensor | None]:
        """Logits for every position and, given ``targets`` (B, T; -100 ignored), the mean cross-entropy.

        With ``caches`` (from :meth:`new_caches`) ``idx`` is only the new tokens. ``attention_mask``
        (B, T_past + T): 1 for tokens, 0 for left padding. ``return_logits=False`` returns ``(None, loss)``.
        """
        if not return_logits and targets is None:
            raise ValueError("return_logits=False returns the loss alone: it needs targets, got targets=None")
        past = 0 if caches is None else len(caches[0])
        idx, attention_mask = self._validate(idx, attention_mask, past)
        logits = self.logits(idx, caches=caches, attention_mask=attention_mask)  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        _validate_tensor("targets", targets)
        if targets.shape != idx.shape or targets.is_floating_point() or targets.dtype == torch.bool:
            raise ValueError(
                f"targets must be integer token ids with the shape of idx {tuple(idx.shape)}, "
                f"got shape {tuple(targets.shape)} and dtype {targets.dtype}"
            )
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten().long(), ignore_index=-100)
        return (logits if return_logits else None), loss

    def new_caches(self) -> list[KVCache]:
        """One empty key/value cache per block."""
        return [KVCache() for _ in self.blocks]

    @torch.no_grad()
    def attention_maps(self, idx: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
        """Attention weights of every block, in eval mode. Shapes: idx (B, T) -> n_layers x (B, n_heads, T, T)."""
        idx, attention_mask = self._validate(idx, attention_mask)
        with eval_mode(self):
            return self._hidden(idx, attention_mask=attention_mask, need_weights=True)[1]

    @torch.inference_mode()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx`` (``temperature=0``: greedy), in eval mode.

        With or without the cache, the same tokens; past ``block_size`` the window slides (the cache is
        refilled from the last ``block_size`` tokens). ``attention_mask`` (B, T0) marks left padding (0) in a
        batch of prompts: each row generates what its prompt alone would; each row must be 0...0 1...1.

        Shapes: idx (B, T0) -> (B, T0 + max_new_tokens).
        """
        idx = _validate_token_ids("idx", idx, self.config.vocab_size)
        if idx.shape[1] == 0:
            raise ValueError(f"idx must hold at least one token per row to continue from, got shape {tuple(idx.shape)}")
        _validate_int("max_new_tokens", max_new_tokens, minimum=0)
        _validate_sampling(temperature, top_k, top_p)
        mask = None
        if attention_mask is not None:
            mask = _validate_left_padded(_validate_attention_mask(attention_mask, *idx.shape))
        with eval_mode(self):
            caches = None
            for _ in range(max_new_tokens):
                logits, caches = self._next_token_logits(idx, mask, caches, use_cache)
                next_id = sample_next_token(logits, temperature, top_k, top_p, generator)  # (B,)
                idx = torch.cat([idx, next_id[:, None]], dim=1)
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        return idx

    def _next_token_logits(
        self, idx: Tensor, mask: Tensor | None, caches: list[KVCache] | None, use_cache: bool
    ) -> tuple[Tensor, list[KVCache] | None]:
        """Logits of the next token after ``idx``, feeding only the newest token when the cache allows.

        Shapes: idx (B, T), mask (B, T) or None -> logits (B, vocab_size).
        """
        block_size = self.config.block_size
        if use_cache and caches is not None and len(caches[0]) < block_size:
            new = idx[:, -1:]  # the cache holds every earlier position of the window
            window_mask = None if mask is None else mask[:, -(len(caches[0]) + 1) :]
        else:
            caches = self.new_caches() if use_cache else None  # (re)fill the cache with the visible window
            new = idx[:, -block_size:]
            window_mask = None if mask is None else mask[:, -block_size:]
        return self.logits(new, caches=caches, attention_mask=window_mask, last_only=True)[:, -1], caches


# --------------------------------------------------------------------------- encoder-only


@dataclass(frozen=True)
class EncoderOnlyConfig:
    """Hyper-parameters of :class:`EncoderOnlyTransformer`, checked when made and immutable after.

    The defaults are all-MiniLM-L6-v2's (Hugging Face's names: :data:`transformer_lib.pretrained.BERT_CONFIG`).

    Defined in chapter 10, Encoder-only.
    """

    vocab_size: int
    max_len: int = 512
    d_model: int = 384
    n_heads: int = 12
    n_layers: int = 6
    d_ff: int = 1536
    type_vocab_size: int = 2
    dropout: float = 0.0
    activation: str = "gelu"
    norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        ints = ("vocab_size", "max_len", "d_model", "n_heads", "n_layers", "d_ff", "type_vocab_size")
        _validate_config(self, ints, ())
        _validate_real("EncoderOnlyConfig.norm_eps", self.norm_eps, "a finite number > 0", lambda x: x > 0)


class EncoderOnlyTransformer(nn.Module):
    """A BERT-style encoder built from an :class:`EncoderOnlyConfig`: word + position + segment embeddings, a
    norm, then Post-LN layers, initialised as BERT is (weights N(0, 0.02), biases zero, norms one).
    :func:`transformer_lib.pretrained.load_minilm` fills it with all-MiniLM-L6-v2.

    Shapes: input_ids (B, T) -> hidden states (B, T, d_model).
    """

    def __init__(self, config: EncoderOnlyConfig) -> None:
        super().__init__()
        if not isinstance(config, EncoderOnlyConfig):
            raise TypeError(f"EncoderOnlyTransformer expects an EncoderOnlyConfig, got {type(config).__name__}")
        self.config = c = config
        self.word_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = LearnedPositionalEmbedding(c.d_model, c.max_len)
        self.type_embed = nn.Embedding(c.type_vocab_size, c.d_model)
        self.embed_norm = make_norm("layernorm", c.d_model, c.norm_eps)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(EncoderLayer(**_layer_kwargs(c, eps=c.norm_eps)) for _ in range(c.n_layers))
        self.apply(GPT._init_weights)  # BERT's initialisation (initializer_range 0.02), for training from scratch

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """The last hidden states. ``attention_mask`` (B, T): 1 for tokens, 0 for padding (never attended
        to); ``token_type_ids`` (B, T): each token's segment (default: all 0).

        Shapes: input_ids (B, T) -> (B, T, d_model).
        """
        return self._encode(input_ids, attention_mask, token_type_ids)[0]

    def _encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[Tensor]]:
        input_ids = _validate_token_ids("input_ids", input_ids, self.config.vocab_size, self.config.max_len)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.pos(self.word_embed(input_ids)) + self.type_embed(token_type_ids)  # (B, T, d_model)
        x = self.dropout(self.embed_norm(x))
        mask = None
        if attention_mask is not None:
            mask = _validate_attention_mask(attention_mask, *input_ids.shape)[:, None, None, :]  # (B, 1, 1, T)
        return run_layers(self.layers, x, need_weights, mask=mask)

    @torch.no_grad()
    def attention_maps(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> list[Tensor]:
        """Attention weights of every layer, in eval mode. Shapes: input_ids (B, T) -> n_layers x (B, n_heads, T, T)."""
        with eval_mode(self):
            return self._encode(input_ids, attention_mask, need_weights=True)[1]
