"""Interactive figures: one library call gives a live widget in Jupyter/Colab and a working,
precomputed one in the HTML book.

``explore(draw, controls)`` shows the figure ``draw(**values)`` with one control per
entry of ``controls``. In a live notebook every change redraws the figure. When the
book is built (environment variable ``TRANSFORMER_BOOK_BUILD=1``, set by ``make book``),
every combination of control values is drawn once (side by side on the cores, ``_pictures``),
and the controls are linked in the browser (``jslink``) to stacks of those pictures, so the
widget keeps working in the HTML page with no kernel behind it: it never looks interactive
while dead.
"""

from __future__ import annotations

import base64
import io
import itertools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .environment import in_book_build
from .runs import can_fork, map_in_processes

if TYPE_CHECKING:
    import ipywidgets
    from matplotlib.figure import Figure

MAX_FRAMES = 80
PRECOMPUTED_NOTE = (
    "<small><i>Precomputed views: the controls switch between pictures drawn when the book was "
    "built. Run this chapter in Jupyter or Colab to compute them live.</i></small>"
)


def _values(name: str, values: Any) -> list[Any]:
    """The values of one control as a list; a clear error for a non-list or an empty one."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"controls[{name!r}]: expected a list of values, got {type(values).__name__} {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"controls[{name!r}]: expected a non-empty list of values, got an empty one")
    return values


def _control(name: str, values: Sequence[Any], value: Any) -> ipywidgets.ValueWidget:
    import ipywidgets as widgets

    options = [(str(v), v) for v in values]
    style = {"description_width": "initial"}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return widgets.SelectionSlider(
            options=options,
            value=value,
            description=name,
            style=style,
            continuous_update=False,
            layout=widgets.Layout(width="420px"),
        )
    return widgets.ToggleButtons(options=options, value=value, description=name, style=style)


def _png_html(fig: Figure) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}" style="max-width:100%">'


def _pictures(draw: Callable[..., Any], names: list[str], combos: list[tuple]) -> list[str]:
    """The picture of each combination of control values, as inline HTML, in the combinations' order.

    Drawing is matplotlib's layout and PNG encoding, a fraction of a second a picture, on one core. On
    Linux, unless CUDA is in use (a forked process must not touch it), the pictures are drawn side by
    side, one process per core (``map_in_processes``): the last ones here, the others in forked copies
    of this process, which send them back. ``benchmarks/explore_pictures.py`` times both ways: on a 2-core
    CPU, 13 frames shaped like chapter 6's drew 1.8-2x as fast side by side, the same pictures to the byte.
    """
    import torch

    def picture(combo: tuple) -> str:
        return _png_html(draw(**dict(zip(names, combo, strict=True))))

    workers = min(len(combos), os.cpu_count() or 1)
    if workers > 1 and can_fork() and not torch.cuda.is_initialized():
        return map_in_processes(picture, combos, workers)
    return [picture(combo) for combo in combos]


def explore(
    draw: Callable[..., Any],
    controls: dict[str, Sequence[Any]],
    initial: dict[str, Any] | None = None,
    live: bool | None = None,
) -> ipywidgets.VBox:
    """A figure with one control per entry of ``controls`` (name -> the values it can take).

    ``draw(**values)`` must return a matplotlib ``Figure``. ``initial`` picks the starting
    values (default: the first of each). ``live=None`` chooses live widgets in a notebook
    and precomputed ones in the book build. Returns the ipywidgets container.
    """
    import ipywidgets as widgets

    if not callable(draw):
        raise TypeError(f"draw must be a function returning a matplotlib Figure, got {type(draw).__name__}")
    if not isinstance(controls, Mapping):
        raise TypeError(f"controls: expected a dict of control name -> list of values, got {type(controls).__name__}")
    if not controls:
        raise ValueError("controls: expected at least one control (name -> list of values), got an empty dict")
    controls = {name: _values(name, values) for name, values in controls.items()}
    unknown = [name for name in (initial or {}) if name not in controls]
    if unknown:
        raise ValueError(f"initial: unknown control(s) {unknown}; the controls are {list(controls)}")
    initial = {name: values[0] for name, values in controls.items()} | (initial or {})
    for name, value in initial.items():
        if value not in controls[name]:
            raise ValueError(f"initial[{name!r}]: expected one of {controls[name]}, got {value!r}")
    sliders = {name: _control(name, list(values), initial[name]) for name, values in controls.items()}
    live = not in_book_build() if live is None else live

    if live:
        out = widgets.Output()

        def redraw(**values: Any) -> None:
            import matplotlib.pyplot as plt
            from IPython.display import display

            with out:
                out.clear_output(wait=True)
                fig = draw(**values)
                display(fig)
                plt.close(fig)

        widgets.interactive_output(redraw, sliders)
        return widgets.VBox([*sliders.values(), out])

    n_frames = 1
    for values in controls.values():
        n_frames *= len(values)
    if n_frames > MAX_FRAMES:
        raise ValueError(f"{n_frames} combinations of control values to precompute; keep it at most {MAX_FRAMES}")
    names = list(controls)
    combos = list(itertools.product(*controls.values()))
    frames = {
        combo: widgets.HTML(picture) for combo, picture in zip(combos, _pictures(draw, names, combos), strict=True)
    }

    def stack(level: int, prefix: tuple) -> Any:
        """Nested stacks: level i chooses the value of control i; the leaves are the pictures."""
        if level == len(names):
            return frames[prefix]
        values = list(controls[names[level]])
        s = widgets.Stack(
            [stack(level + 1, prefix + (v,)) for v in values], selected_index=values.index(initial[names[level]])
        )
        widgets.jslink((sliders[names[level]], "index"), (s, "selected_index"))
        return s

    return widgets.VBox([*sliders.values(), stack(0, ()), widgets.HTML(PRECOMPUTED_NOTE)])
