"""transformer_lib.notebook.plots.plot_attention_grid: the layers x heads grid of heatmaps (chapter 3)."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from transformer_lib.notebook import plots  # noqa: E402

TOKENS = ["the", "cat", "sat", "down"]


def _maps(n_layers=2, B=1, n_heads=3, T_q=4, T_k=4):
    g = torch.Generator().manual_seed(0)
    return [torch.softmax(torch.randn(B, n_heads, T_q, T_k, generator=g), dim=-1) for _ in range(n_layers)]


def _heatmaps(fig):
    return [ax for ax in fig.axes if ax.images and ax.get_title()]


def test_one_panel_per_layer_and_head_with_the_weights_and_labels():
    maps = _maps()
    fig = plots.plot_attention_grid(maps, TOKENS, title="grid")
    panels = _heatmaps(fig)
    assert len(panels) == 2 * 3
    assert panels[0].get_title() == "layer 0, head 0" and panels[-1].get_title() == "layer 1, head 2"
    np.testing.assert_allclose(panels[4].images[0].get_array(), maps[1][0, 1].numpy(), rtol=1e-6)
    assert [t.get_text() for t in panels[0].get_yticklabels()] == TOKENS  # first column: query labels
    assert [t.get_text() for t in panels[-1].get_xticklabels()] == TOKENS  # last row: key labels
    assert fig._suptitle.get_text() == "grid"
    plt.close(fig)


def test_subsets_batch_index_highlight_and_numpy_input():
    maps = _maps(n_layers=3, B=2)
    fig = plots.plot_attention_grid(
        [m.numpy() for m in maps], TOKENS, layers=[2], heads=[0, 2], batch_index=1, highlight=[(2, 2)], vmax=None
    )
    panels = _heatmaps(fig)
    assert [p.get_title() for p in panels] == ["layer 2, head 0", "layer 2, head 2"]
    np.testing.assert_allclose(panels[1].images[0].get_array(), maps[2][1, 2].numpy(), rtol=1e-6)
    assert panels[1].spines["left"].get_edgecolor()[:3] == matplotlib.colors.to_rgb("red")
    assert panels[0].spines["left"].get_edgecolor()[:3] != matplotlib.colors.to_rgb("red")
    plt.close(fig)


def test_numbering_from_one_changes_only_the_titles():
    maps = _maps(n_layers=2)
    fig = plots.plot_attention_grid(maps, TOKENS, heads=[2], highlight=[(1, 2)], numbering=1)
    panels = _heatmaps(fig)
    # layers, heads and highlight still count from 0: only the titles change
    assert [p.get_title() for p in panels] == ["layer 1, head 3", "layer 2, head 3"]
    np.testing.assert_allclose(panels[1].images[0].get_array(), maps[1][0, 2].numpy(), rtol=1e-6)
    assert panels[1].spines["left"].get_edgecolor()[:3] == matplotlib.colors.to_rgb("red")
    plt.close(fig)


def test_cross_attention_and_a_single_layer_tensor():
    cross = _maps(n_layers=1, T_q=2, T_k=4)[0][0]  # (n_heads, T_q, T_k): one layer, no batch axis
    fig = plots.plot_attention_grid(cross, ["a", "b"], TOKENS)
    panels = _heatmaps(fig)
    assert len(panels) == 3 and panels[0].images[0].get_array().shape == (2, 4)
    plt.close(fig)


@pytest.mark.parametrize(
    "maps, tokens, kwargs, error, words",
    [
        (_maps(), TOKENS[:3], {}, ValueError, "4 positions but 3 tokens"),
        (_maps(T_q=2), ["a", "b"], {}, ValueError, "pass tokens_k"),
        ([torch.rand(4, 4)], TOKENS, {}, ValueError, "(n_heads, T_q, T_k)"),
        (_maps(), TOKENS, {"heads": [3]}, ValueError, "heads: expected a non-empty list of indices in [0, 3)"),
        (_maps(), TOKENS, {"numbering": 2}, ValueError, "numbering must be 0 or 1"),
        (_maps(), TOKENS, {"layers": []}, ValueError, "layers: expected a non-empty list"),
        (_maps(B=1), TOKENS, {"batch_index": 1}, ValueError, "batch_index 1 out of range"),
        ([torch.ones(1, 2, 4, 4, dtype=torch.long)], TOKENS, {}, TypeError, "floating"),
        ([], TOKENS, {}, TypeError, "non-empty"),
        (_maps() + _maps(T_q=3, T_k=3), TOKENS, {}, ValueError, "same (T_q, T_k)"),
    ],
    ids=[
        "too few tokens",
        "cross-attention without tokens_k",
        "a 2-D map",
        "a head out of range",
        "numbering 2",
        "no layers picked",
        "batch_index out of range",
        "integer weights",
        "no layers",
        "layers of different sizes",
    ],
)
def test_bad_input_names_what_was_expected(maps, tokens, kwargs, error, words):
    with pytest.raises(error, match=re.escape(words)):
        plots.plot_attention_grid(maps, tokens, **kwargs)
    plt.close("all")
