"""Matplotlib figures for the chapters: a grid of attention heatmaps and the training curves.

``plot_attention_grid`` draws a layers x heads grid of attention maps (chapter 3 on);
``plot_history`` draws a :class:`~transformer_lib.training.History`; :class:`LivePlot` is a
``Trainer.fit`` callback that redraws the curves in the notebook at every evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..training import History, Trainer

if TYPE_CHECKING:
    from matplotlib.figure import Figure

AttentionLike = Sequence[torch.Tensor | np.ndarray] | torch.Tensor | np.ndarray

__all__ = ["LivePlot", "plot_attention_grid", "plot_history"]


def validate_tokens(tokens: Sequence[str] | None, n: int, what: str) -> list[str] | None:
    """Token labels for n positions, as strings; a clear error when the count differs (also viz's)."""
    if tokens is None:
        return None
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{what}: attention covers {n} positions but {len(tokens)} tokens were given")
    return tokens


def attention_layers(maps: AttentionLike, name: str, batch_index: int = 0) -> list[torch.Tensor]:
    """Attention maps as a list over layers of ``(n_heads, T_q, T_k)`` tensors on the CPU (also viz's);
    errors name the argument, ``name``.

    Shapes: maps: a list over layers of ``(B, n_heads, T_q, T_k)`` or ``(n_heads, T_q, T_k)`` tensors or
    arrays (a single one is one layer); ``batch_index`` picks the sequence. Every layer has the same
    ``(T_q, T_k)``.
    """
    if isinstance(maps, (torch.Tensor, np.ndarray)):
        maps = [maps]
    if not isinstance(maps, Sequence) or isinstance(maps, str) or len(maps) == 0:
        raise TypeError(f"{name}: expected a non-empty list over layers of tensors, got {type(maps).__name__}")
    layers = []
    for i, a in enumerate(maps):
        if not isinstance(a, (torch.Tensor, np.ndarray)):
            raise TypeError(f"{name}[{i}]: expected a tensor, got {type(a).__name__}")
        t = torch.as_tensor(a).detach().to("cpu")
        if not torch.is_floating_point(t):
            raise TypeError(f"{name}[{i}]: expected floating-point attention weights, got dtype {t.dtype}")
        if t.dim() == 4:
            if not -t.shape[0] <= batch_index < t.shape[0]:
                raise ValueError(f"{name}[{i}]: batch_index {batch_index} out of range for batch size {t.shape[0]}")
            t = t[batch_index]
        elif t.dim() != 3:
            raise ValueError(
                f"{name}[{i}]: expected shape (B, n_heads, T_q, T_k) or (n_heads, T_q, T_k), got {tuple(t.shape)}"
            )
        layers.append(t)
    shapes = {tuple(t.shape[-2:]) for t in layers}
    if len(shapes) != 1:
        raise ValueError(f"{name}: all layers must have the same (T_q, T_k), got {sorted(shapes)}")
    return layers


def _pick(requested: Sequence[int] | None, n: int, what: str) -> list[int]:
    if requested is None:
        return list(range(n))
    picked = [int(i) for i in requested]
    bad = [i for i in picked if not 0 <= i < n]
    if bad or not picked:
        raise ValueError(f"{what}: expected a non-empty list of indices in [0, {n}), got {list(requested)}")
    return picked


def plot_attention_grid(
    maps: AttentionLike,
    tokens_q: Sequence[str],
    tokens_k: Sequence[str] | None = None,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    batch_index: int = 0,
    highlight: Sequence[tuple[int, int]] = (),
    vmax: float | None = 1.0,
    cmap: str = "viridis",
    cell_inches: float = 1.9,
    fontsize: float = 6.0,
    title: str | None = None,
    numbering: int = 0,
) -> Figure:
    """Attention weights as a grid of heatmaps: one row per layer, one column per head, with token labels.

    Rows are queries (labelled ``tokens_q``), columns keys (``tokens_k``, default ``tokens_q``).
    ``layers``/``heads`` pick which to draw (default: all); ``highlight`` frames the given
    ``(layer, head)`` panels in red. ``vmax=1.0`` puts every panel on the same colour scale
    (weights are in [0, 1]), so a diffuse head looks faint; ``vmax=None`` scales each panel
    to its own maximum. ``numbering`` is the number the titles give the first layer and head (0 as
    in chapter 3; 1 as in chapters 6 and 7); ``layers``, ``heads`` and ``highlight`` always count
    from 0. Returns the matplotlib ``Figure`` (call ``plt.show()`` to draw it).

    Shapes:
        maps: a list over layers of ``(B, n_heads, T_q, T_k)`` or ``(n_heads, T_q, T_k)`` tensors
            (a single tensor is one layer); ``batch_index`` picks the sequence when ``B > 1``.
        tokens_q: ``T_q`` strings; tokens_k: ``T_k`` strings.

    Defined in chapter 3, Multi-head attention.
    """
    import matplotlib.pyplot as plt

    if numbering not in (0, 1) or isinstance(numbering, bool):
        raise ValueError(f"numbering must be 0 or 1 (the number of the first layer and head), got {numbering!r}")
    all_layers = [t.float() for t in attention_layers(maps, "maps", batch_index)]
    T_q, T_k = all_layers[0].shape[-2:]
    labels_q = validate_tokens(tokens_q, T_q, "tokens_q")
    labels_k = labels_q if tokens_k is None else validate_tokens(tokens_k, T_k, "tokens_k")
    if labels_q is None or labels_k is None:
        raise ValueError("tokens_q: required (one string per query position)")
    if len(labels_k) != T_k:
        raise ValueError(
            f"tokens_k: attention covers {T_k} key positions but {len(labels_k)} tokens were given; "
            "pass tokens_k for cross-attention"
        )
    layer_ids = _pick(layers, len(all_layers), "layers")
    n_heads = min(t.shape[0] for t in all_layers)
    head_ids = _pick(heads, n_heads, "heads")
    marked = {(int(layer), int(head)) for layer, head in highlight}

    rows, cols = len(layer_ids), len(head_ids)
    aspect = T_q / T_k
    fig, axes = plt.subplots(
        rows, cols, squeeze=False, figsize=(cols * cell_inches + 0.9, rows * cell_inches * aspect + 0.6)
    )
    image = None
    for r, layer in enumerate(layer_ids):
        for c, head in enumerate(head_ids):
            ax = axes[r, c]
            w = all_layers[layer][head].numpy()
            image = ax.imshow(w, cmap=cmap, vmin=0.0, vmax=vmax if vmax is not None else max(float(w.max()), 1e-9))
            ax.set_title(f"layer {layer + numbering}, head {head + numbering}", fontsize=fontsize + 2)
            ax.set_xticks(range(T_k))
            ax.set_yticks(range(T_q))
            ax.set_xticklabels(labels_k if r == rows - 1 else [], rotation=90, fontsize=fontsize)
            ax.set_yticklabels(labels_q if c == 0 else [], fontsize=fontsize)
            ax.tick_params(length=0)
            if r == rows - 1:
                ax.set_xlabel("key", fontsize=fontsize + 1)
            if c == 0:
                ax.set_ylabel("query", fontsize=fontsize + 1)
            if (layer, head) in marked:
                for side in ax.spines.values():
                    side.set(color="red", linewidth=2.5)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if vmax is not None and image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    return fig


def plot_history(history: History, title: str = "Loss") -> Figure:
    """Training and validation loss against the step. Returns a matplotlib Figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    if history.steps:
        ax.plot(history.steps, history.train_loss, label="train", alpha=0.8)
    if history.eval_steps:
        ax.plot(history.eval_steps, history.val_loss, "o-", label="validation")
    ax.set(xlabel="step", ylabel="loss", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


class LivePlot:
    """A ``Trainer.fit`` callback that redraws the loss curves in place at every evaluation.

    ``trainer.fit(callback=LivePlot())``; the figure is one output that updates, not a new
    figure per evaluation.
    """

    def __init__(self, title: str = "Loss") -> None:
        self.title = title
        self._handle = None

    def __call__(self, trainer: Trainer) -> None:
        import matplotlib.pyplot as plt
        from IPython.display import display

        fig = plot_history(trainer.history, self.title)
        if self._handle is None:
            self._handle = display(fig, display_id=True)
        else:
            self._handle.update(fig)
        plt.close(fig)
