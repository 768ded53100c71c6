"""Attention views (bertviz) that also render in the offline HTML book.

bertviz draws attention heads with d3 and jquery, which it loads through require.js from
hard-coded CDN URLs. That works in Jupyter and Colab with internet access, but the HTML
book must render with no network at all. The wrappers here call bertviz with
``html_action='return'`` and rewrite its script so that

* every ``require.config`` path becomes a fallback list: first the copy that
  ``scripts/vendor_js.py`` puts in the book's ``_static/npm/`` folder, then the CDN
  (require.js moves on to the next entry when a load fails). A reader of the book, online or
  not, so loads nothing from the internet; where no local copy exists (JupyterLab, Colab),
  the CDN is the only entry;
* the local folder is found at run time from the ``<script>`` tag that loaded the book's own
  require.js (``_static/npm/requirejs/require.js``), falling back to Sphinx's
  ``data-content_root`` attribute, so it resolves from every page (``chapters/...``,
  ``book/...``) whatever its depth;
* require.js itself is only fetched from the CDN when the page has none (JupyterLab, Colab),
  and the view is drawn once it has loaded; the book's pages already load it.

Used from chapter 1 (Attention) on; chapters feed it the attention weights that the
library's modules return with ``need_weights=True``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import torch
from IPython.display import HTML
from IPython.display import display as ipy_display

from .plots import AttentionLike, attention_layers, validate_tokens

__all__ = ["head_view", "model_view", "offline_html"]

#: Where the book serves its own copies of the browser scripts, relative to ``_static``.
VENDOR_DIR = "npm/"
#: The one list of those scripts: npm package -> (version, the file a page loads, under VENDOR_DIR).
#: scripts/vendor_js.py fetches them from npm; _config.yml loads require.js, the widget manager and
#: MathJax (tests/test_viz.py checks its paths against this list); the views below load d3 and jquery.
VENDORED = {
    "requirejs": ("2.3.6", "requirejs/require.js"),
    "@jupyter-widgets/html-manager": ("1.0.6", "html-manager/embed-amd.js"),
    "d3": ("5.7.0", "d3/d3.min.js"),
    "jquery": ("2.1.0", "jquery/jquery.min.js"),
    "mathjax": ("3.2.2", "mathjax/tex-mml-chtml.js"),
}
#: Local file (without ``.js``, as require.js wants it) for each module bertviz loads.
LOCAL_MODULES = {name: VENDORED[name][1].removesuffix(".js") for name in ("d3", "jquery")}
REQUIRE_CDN = "https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js"

_REQUIRE_TAG = re.compile(r"<script\s+src=\"[^\"]*require(?:\.min)?\.js\"\s*>\s*</script>")
_SCRIPT = re.compile(r"<script type=\"text/javascript\">\n(?P<js>.*)\n</script>\s*$", re.S)
_CONFIG = re.compile(r"require\.config\(\{\s*paths:\s*\{(?P<body>[^{}]*)\}\s*\}\);")
_PATH_ENTRY = re.compile(r"(?P<name>[\w$]+)\s*:\s*['\"](?P<url>[^'\"]+)['\"]")

# Runs inside the page: find the book's vendor folder, then draw the view.
_LOADER = """(function () {
  function localBase() {
    var tag = document.querySelector('script[src*="%(vendor)srequirejs/require.js"]');
    if (tag && tag.src) { return tag.src.replace(/requirejs\\/require\\.js.*$/, ""); }
    var root = document.documentElement.getAttribute("data-content_root");
    if (root !== null) { return new URL(root + "_static/%(vendor)s", document.baseURI).href; }
    return null;
  }
  var base = localBase();
  var cdnPaths = %(cdn)s;
  var localPaths = %(local)s;
  var paths = {};
  Object.keys(cdnPaths).forEach(function (name) {
    paths[name] = (base && localPaths[name]) ? [base + localPaths[name], cdnPaths[name]] : cdnPaths[name];
  });
  function draw() {
    require.config({paths: paths});
%(body)s
  }
  if (typeof window.requirejs === "function") {
    draw();
  } else {
    var s = document.createElement("script");
    s.src = "%(require_cdn)s";
    s.onload = draw;
    document.head.appendChild(s);
  }
})();"""


def offline_html(html: str) -> str:
    """Rewrite bertviz's returned HTML so it renders offline in the built book.

    Drops bertviz's unconditional ``<script src=...require.min.js>`` tag (the book loads its
    own require.js; elsewhere the loader fetches one only if missing) and replaces the CDN-only
    ``require.config`` paths by local-then-CDN fallback lists.

    Raises ``RuntimeError`` if bertviz's output no longer has the expected layout, rather than
    silently producing a view that stays blank offline.
    """
    html, n_tags = _REQUIRE_TAG.subn("", html, count=1)
    match = _SCRIPT.search(html)
    config = _CONFIG.search(match.group("js")) if match else None
    if n_tags != 1 or match is None or config is None:
        raise RuntimeError(
            "bertviz's HTML layout changed (expected a require.js <script> tag and a "
            "require.config({paths: ...}) block); update transformer_lib.notebook.viz.offline_html"
        )
    cdn = {m.group("name"): m.group("url") for m in _PATH_ENTRY.finditer(config.group("body"))}
    missing = set(cdn) - set(LOCAL_MODULES)
    if missing:
        raise RuntimeError(f"bertviz requires modules with no vendored copy: {sorted(missing)}")
    js = match.group("js")
    body = _drop_params_echo(js[: config.start()] + js[config.end() :])
    loader = _LOADER % {
        "vendor": VENDOR_DIR,
        "cdn": json.dumps(cdn),
        "local": json.dumps({k: LOCAL_MODULES[k] for k in cdn}),
        "require_cdn": REQUIRE_CDN,
        "body": body,
    }
    return html[: match.start()] + '<script type="text/javascript">\n' + loader + "\n</script>\n"


def _drop_params_echo(js: str) -> str:
    """bertviz substitutes its params JSON twice: in code and in a trailing comment. Drop the comment."""
    lines = js.split("\n")
    for i, line in enumerate(lines):
        head, sep, rest = line.partition("const params = ")
        if not sep:
            continue
        mid, tail = "; // HACK: ", " is a template marker that is replaced by actual params."
        n = (len(rest) - len(mid) - len(tail)) // 2
        if n > 0 and rest == rest[:n] + mid + rest[:n] + tail:
            lines[i] = head + sep + rest[:n] + ";"
    return "\n".join(lines)


def _layers(attention: AttentionLike, name: str, batch_index: int, decimals: int) -> list[torch.Tensor]:
    """A list over layers of ``(1, n_heads, T_q, T_k)`` float64 tensors for bertviz, rounded for a compact page."""
    layers = [
        t[None].to(torch.float64).round(decimals=decimals) for t in attention_layers(attention, name, batch_index)
    ]
    heads = {t.shape[1] for t in layers}
    if len(heads) != 1:
        raise ValueError(f"{name}: all layers must have the same number of heads, got {sorted(heads)}")
    return layers


def _prepare(
    attention: AttentionLike | None,
    tokens: Sequence[str] | None,
    kw: dict[str, Any],
    batch_index: int,
    decimals: int,
) -> dict[str, Any]:
    args = dict(kw)
    if attention is not None:
        if tokens is None:
            raise ValueError("tokens: required with attention (one string per position)")
        layers = _layers(attention, "attention", batch_index, decimals)
        _, _, T_q, T_k = layers[0].shape
        if T_q != T_k:
            raise ValueError(
                f"attention: self-attention must be square, got T_q={T_q}, T_k={T_k}; "
                "use encoder_attention/decoder_attention/cross_attention"
            )
        args["attention"] = layers
        args["tokens"] = validate_tokens(tokens, T_q, "tokens")
        return args
    enc_tokens, dec_tokens = args.get("encoder_tokens"), args.get("decoder_tokens")
    found = False
    for key in ("encoder_attention", "decoder_attention", "cross_attention"):
        if args.get(key) is not None:
            found = True
            args[key] = _layers(args[key], key, batch_index, decimals)
    if not found:
        raise ValueError("give attention (self-attention model) or encoder_attention/decoder_attention/cross_attention")
    if args.get("encoder_attention") is not None:
        T = args["encoder_attention"][0].shape[-1]
        args["encoder_tokens"] = validate_tokens(enc_tokens, T, "encoder_tokens")
    if args.get("decoder_attention") is not None:
        T = args["decoder_attention"][0].shape[-1]
        args["decoder_tokens"] = validate_tokens(dec_tokens, T, "decoder_tokens")
    if args.get("cross_attention") is not None:
        _, _, T_q, T_k = args["cross_attention"][0].shape
        args["decoder_tokens"] = validate_tokens(dec_tokens, T_q, "decoder_tokens (cross_attention rows)")
        args["encoder_tokens"] = validate_tokens(enc_tokens, T_k, "encoder_tokens (cross_attention columns)")
    return args


def _show(view: Any, args: dict[str, Any], display: bool) -> HTML | None:
    html = HTML(offline_html(view(html_action="return", **args).data))
    if display:
        ipy_display(html)
        return None
    return html


def _bertviz():
    """The bertviz module, or an ImportError that says how to install it."""
    try:
        import bertviz
    except ImportError as e:
        raise ImportError("the attention views need bertviz: pip install bertviz (or 'transformer_lib[book]')") from e
    return bertviz


def head_view(
    attention: AttentionLike | None,
    tokens: Sequence[str] | None = None,
    *,
    batch_index: int = 0,
    decimals: int = 4,
    display: bool = True,
    **kw: Any,
) -> HTML | None:
    """Show bertviz's head view (one layer, all heads, token-to-token lines); works offline in the book.

    Shapes:
        attention: a list over layers of ``(B, n_heads, T, T)`` or ``(n_heads, T, T)`` tensors
            (a single tensor is one layer); ``batch_index`` picks the sequence when ``B > 1``.
        tokens: ``T`` strings.
        encoder_attention / decoder_attention (kw): lists of ``(B, n_heads, T_src, T_src)`` /
            ``(B, n_heads, T_tgt, T_tgt)``; cross_attention (kw): ``(B, n_heads, T_tgt, T_src)``;
            with ``encoder_tokens`` (``T_src``) and ``decoder_tokens`` (``T_tgt``). Pass
            ``attention=None`` for an encoder-decoder model.

    Other keyword arguments go to ``bertviz.head_view`` (``layer``, ``heads``,
    ``include_layers``, ``sentence_b_start``, ``prettify_tokens``). Weights are rounded to
    ``decimals`` places to keep pages small. With ``display=False`` the ``IPython.display.HTML``
    is returned instead of shown.
    """
    return _show(_bertviz().head_view, _prepare(attention, tokens, kw, batch_index, decimals), display)


def model_view(
    attention: AttentionLike | None,
    tokens: Sequence[str] | None = None,
    *,
    batch_index: int = 0,
    decimals: int = 4,
    display: bool = True,
    display_mode: str = "light",
    **kw: Any,
) -> HTML | None:
    """Show bertviz's model view (a grid of layers x heads, one thumbnail per head); works offline.

    Shapes:
        attention: a list over layers of ``(B, n_heads, T, T)`` or ``(n_heads, T, T)`` tensors;
            ``batch_index`` picks the sequence when ``B > 1``.
        tokens: ``T`` strings.
        encoder_attention / decoder_attention / cross_attention (kw): as in :func:`head_view`.

    Other keyword arguments go to ``bertviz.model_view`` (``include_layers``,
    ``include_heads``, ``sentence_b_start``, ``prettify_tokens``). ``display_mode`` is
    ``"light"`` (default here, to match the book) or ``"dark"`` (bertviz's default).
    """
    _model_view = _bertviz().model_view
    args = _prepare(attention, tokens, kw, batch_index, decimals)
    args["display_mode"] = display_mode
    return _show(_model_view, args, display)
