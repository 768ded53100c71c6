"""transformer_lib.notebook.viz: bertviz views rewritten to render offline (the browser check is in test_book.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import importorskip_unless_ci

importorskip_unless_ci("bertviz")
from transformer_lib.notebook import viz  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKENS = ["the", "cat", "sat"]


def _attn(n_layers: int = 2, B: int = 1, n_heads: int = 2, T_q: int = 3, T_k: int = 3) -> list[torch.Tensor]:
    return [torch.softmax(torch.randn(B, n_heads, T_q, T_k), dim=-1) for _ in range(n_layers)]


def _script(html: str) -> str:
    match = re.search(r"<script type=\"text/javascript\">\n(.*)\n</script>", html, re.S)
    assert match, "no inline script in the view"
    return match.group(1)


@pytest.mark.parametrize("view", [viz.head_view, viz.model_view])
def test_paths_fall_back_to_the_vendored_copies(view) -> None:
    html = view(_attn(), TOKENS, display=False).data
    js = _script(html)
    # bertviz's unconditional CDN require.js tag is gone; require.js is fetched only when missing.
    assert "<script src=" not in html
    assert 'typeof window.requirejs === "function"' in js
    # Each module: the local copy under _static/npm/ first, the CDN only as a fallback, so an
    # online reader of the book loads nothing from the internet either.
    assert '"d3": "https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min"' in js
    assert '"d3": "d3/d3.min"' in js and '"jquery": "jquery/jquery.min"' in js
    assert "[base + localPaths[name], cdnPaths[name]]" in js
    assert "[cdnPaths[name], base + localPaths[name]]" not in js
    assert f'script[src*="{viz.VENDOR_DIR}{viz.VENDORED["requirejs"][1]}"]' in js
    # bertviz's own CDN-only require.config is removed; only ours remains.
    assert js.count("require.config(") == 1
    # The params JSON appears once (bertviz also echoes it into a comment).
    assert js.count('"left_text"') == 1


def test_one_list_of_vendored_scripts_for_the_fetch_the_config_and_the_views() -> None:
    """viz.VENDORED is the list: vendor_js unpacks exactly its packages into VENDOR_DIR, and _config.yml
    loads only files it names."""
    import yaml

    import vendor_js

    assert {p.name for p in vendor_js.PACKAGES} == set(viz.VENDORED)
    assert f"{vendor_js.SUBDIR}/" == viz.VENDOR_DIR
    files = {viz.VENDOR_DIR + file for _, file in viz.VENDORED.values()}
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
    loaded = [entry[0] for entry in config["html_js_files"]] + [config["mathjax_path"]]
    assert set(loaded) <= files, f"_config.yml loads {sorted(set(loaded) - files)}, which viz.VENDORED does not name"
    assert {viz.VENDOR_DIR + module + ".js" for module in viz.LOCAL_MODULES.values()} <= files


def test_rewritten_script_is_valid_javascript(tmp_path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not installed")
    for view in (viz.head_view, viz.model_view):
        path = tmp_path / f"{view.__name__}.js"
        path.write_text(_script(view(_attn(), TOKENS, display=False).data))
        proc = subprocess.run([node, "--check", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


# A stand-in for the page: the book's <script src=".../_static/npm/requirejs/require.js"> tag (or
# none, as in JupyterLab and Colab), and a require.js that records the paths it is configured with.
_NODE_HARNESS = """
const requireTag = %(tag)s;
global.window = {requirejs: function () {}};
global.document = {
  querySelector: function () { return requireTag; },
  documentElement: {getAttribute: function () { return null; }},
  baseURI: "http://localhost/chapters/x.html",
};
global.requirejs = function () {};
// In node, `require` is the module's own function: shadow it with the stub.
(function (require) {
%(script)s
})({config: function (c) { console.log(JSON.stringify(c.paths)); }});
"""


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        (
            '{src: "http://localhost/_static/npm/requirejs/require.js"}',
            {
                "d3": [
                    "http://localhost/_static/npm/d3/d3.min",
                    "https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min",
                ],
                "jquery": [
                    "http://localhost/_static/npm/jquery/jquery.min",
                    "https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min",
                ],
            },
        ),
        (
            "null",
            {
                "d3": "https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min",
                "jquery": "https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min",
            },
        ),
    ],
    ids=["book-page", "jupyterlab"],
)
def test_require_paths_in_a_page(tmp_path, tag, expected) -> None:
    """Run the view's script in node: on a book page the local copy comes first, the CDN second."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not installed")
    path = tmp_path / "page.js"
    path.write_text(_NODE_HARNESS % {"tag": tag, "script": _script(viz.head_view(_attn(), TOKENS, display=False).data)})
    proc = subprocess.run([node, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected


def test_accepts_3d_layers_numpy_and_batch_index() -> None:
    a3 = [torch.softmax(torch.randn(2, 3, 3), -1) for _ in range(2)]  # (n_heads, T, T)
    assert "bertviz-" in viz.head_view(a3, TOKENS, display=False).data
    anp = [x.numpy() for x in a3]
    assert "bertviz-" in viz.head_view(anp, TOKENS, display=False).data
    batch = _attn(B=3)
    html = viz.head_view(batch, TOKENS, batch_index=2, display=False).data
    first = round(float(batch[0][2, 0, 0, 0]), 4)
    assert f"[[[[{first}" in html.replace(" ", "")


def test_weights_are_rounded() -> None:
    html = viz.head_view(_attn(), TOKENS, decimals=2, display=False).data
    numbers = re.findall(r"\d\.\d+", html.split('"attn":', 1)[1].split('"left_text"', 1)[0])
    assert numbers and all(len(n.split(".")[1]) <= 2 for n in numbers)


def test_encoder_decoder_views() -> None:
    enc, dec = ["a", "b", "c"], ["x", "y"]
    html = viz.head_view(
        None,
        encoder_attention=_attn(T_q=3, T_k=3),
        decoder_attention=_attn(T_q=2, T_k=2),
        cross_attention=_attn(T_q=2, T_k=3),
        encoder_tokens=enc,
        decoder_tokens=dec,
        display=False,
    ).data
    assert '"name": "Cross"' in html and '"name": "Encoder"' in html
    html = viz.model_view(
        None, cross_attention=_attn(T_q=2, T_k=3), encoder_tokens=enc, decoder_tokens=dec, display=False
    ).data
    assert '"name": "Cross"' in html


def test_display_true_returns_none(monkeypatch) -> None:
    shown = []
    monkeypatch.setattr(viz, "ipy_display", shown.append)
    assert viz.head_view(_attn(), TOKENS) is None
    assert len(shown) == 1 and "bertviz-" in shown[0].data


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(attention=_attn(), tokens=["a", "b"]), ValueError, "3 positions but 2 tokens"),
        (dict(attention=_attn(), tokens=None), ValueError, "tokens: required"),
        (dict(attention=[torch.rand(3, 3)], tokens=TOKENS), ValueError, "got (3, 3)"),
        (dict(attention=_attn(T_q=2, T_k=3), tokens=TOKENS), ValueError, "must be square"),
        (dict(attention=[torch.ones(1, 2, 3, 3, dtype=torch.long)], tokens=TOKENS), TypeError, "floating-point"),
        (dict(attention=_attn(B=2), tokens=TOKENS, batch_index=5), ValueError, "batch_index 5 out of range"),
        (dict(attention=[], tokens=TOKENS), TypeError, "non-empty list"),
        (dict(attention=None), ValueError, "give attention"),
        (
            dict(
                attention=None,
                cross_attention=_attn(T_q=2, T_k=3),
                encoder_tokens=["a", "b", "c"],
                decoder_tokens=["x"],
            ),
            ValueError,
            "decoder_tokens",
        ),
    ],
)
def test_bad_input_names_what_was_expected(kwargs, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        viz.head_view(display=False, **kwargs)


def test_layout_change_in_bertviz_is_loud() -> None:
    with pytest.raises(RuntimeError, match="layout changed"):
        viz.offline_html("<div>no scripts here</div>")
