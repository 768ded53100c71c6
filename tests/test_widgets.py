"""transformer_lib.notebook: ``widgets.explore`` (live and precomputed book mode) and the loss plots.

Book mode must work in static HTML with no kernel: every combination of control values is
drawn once and the controls are ``jslink``ed to nested stacks of those pictures. ``jslink``
only links in the browser, so the tests read the links from the widget state that gets
saved into the page (``ipywidgets.embed.embed_data``) and follow them by hand.
"""

from __future__ import annotations

import ast
import itertools
import math
import os
import re
import tempfile
from collections import Counter
from types import SimpleNamespace

import pytest

from conftest import importorskip_unless_ci

importorskip_unless_ci("ipywidgets")
importorskip_unless_ci("IPython")
matplotlib = importorskip_unless_ci("matplotlib")
matplotlib.use("Agg")

import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from ipywidgets.embed import embed_data  # noqa: E402
from ipywidgets.widgets.widget import _instances  # noqa: E402  (the kernel's widget registry)

from transformer_lib.notebook import plots, widgets  # noqa: E402
from transformer_lib.notebook.environment import BOOK_ENV  # noqa: E402


@pytest.fixture(autouse=True)
def no_open_figures():
    """Each test starts with no pyplot figure open: under pytest-xdist, a worker's earlier test (another
    file's) may leave one, and these tests count the figures left open."""
    plt.close("all")


from transformer_lib.notebook.plots import LivePlot, plot_history  # noqa: E402
from transformer_lib.training import History, TrainConfig, Trainer  # noqa: E402

# Three controls: numbers (a slider) and strings (toggle buttons); 2 * 3 * 2 = 12 combinations.
CONTROLS = {"heads": [1, 2], "scale": [0.5, 1.0, 2.0], "mask": ["causal", "none"]}
COMBOS = list(itertools.product(*CONTROLS.values()))


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    """No book-build variable from the outside; close the widgets and figures a test made."""
    monkeypatch.delenv(BOOK_ENV, raising=False)
    before = set(_instances)
    yield
    for model_id in set(_instances) - before:
        _instances[model_id].close()
    plt.close("all")


class Recorder:
    """A cheap ``draw``: a small matplotlib figure labelled with its arguments; records every call and the
    process that made it, in a file, since the book build may draw in forked processes."""

    directory: str | None = None  # set for the module by the fixture below; pytest removes it

    def __init__(self) -> None:
        fd, self._log = tempfile.mkstemp(prefix="recorder-", suffix=".txt", dir=self.directory)
        os.close(fd)

    def _entries(self) -> list[tuple[tuple, int]]:
        with open(self._log) as f:
            return [ast.literal_eval(line) for line in f]

    @property
    def calls(self) -> list[tuple]:
        return [combo for combo, _ in self._entries()]

    @property
    def pids(self) -> list[int]:
        return [pid for _, pid in self._entries()]

    def __call__(self, **values):
        combo = tuple(values[name] for name in CONTROLS)
        with open(self._log, "a") as f:  # one short line: appended whole, whichever process writes it
            f.write(repr((combo, os.getpid())) + "\n")
        fig, ax = plt.subplots(figsize=(1, 1))
        ax.plot([0, 1], [0, values["scale"]])
        ax.set_title(_label(combo), fontsize=4)  # every combination a different picture
        fig.set_label(_label(combo))
        return fig


@pytest.fixture(autouse=True, scope="module")
def _recorder_directory(tmp_path_factory):
    Recorder.directory = str(tmp_path_factory.mktemp("recorder"))


def _label(combo: tuple) -> str:
    return "frame " + " ".join(map(str, combo))


@pytest.fixture(params=["processes", "here"])
def drawing(request, monkeypatch) -> str:
    """The book build's pictures drawn side by side in three processes (Linux), or all in this one."""
    if request.param == "processes":
        if not widgets.can_fork():
            pytest.skip("forked processes need Linux")
        monkeypatch.setattr(widgets.os, "cpu_count", lambda: 3)
    else:
        monkeypatch.setattr(widgets, "can_fork", lambda: False)
    return request.param


@pytest.fixture
def labelled_frames(monkeypatch):
    """Frames as the figure's label instead of a PNG, so a test can tell which picture is shown."""

    def fake_png_html(fig) -> str:
        plt.close(fig)
        return fig.get_label()

    monkeypatch.setattr(widgets, "_png_html", fake_png_html)


def _controls(box: ipywidgets.VBox) -> dict[str, ipywidgets.widgets.widget_selection._Selection]:
    return {
        c.description: c for c in box.children if isinstance(c, (ipywidgets.SelectionSlider, ipywidgets.ToggleButtons))
    }


def _root_stack(box: ipywidgets.VBox) -> ipywidgets.Stack:
    stacks = [c for c in box.children if isinstance(c, ipywidgets.Stack)]
    assert len(stacks) == 1, f"expected one stack of pictures in the box, got {box.children}"
    return stacks[0]


def _stacks(node) -> list[tuple[int, ipywidgets.Stack]]:
    """Every stack in the tree with its depth (depth i chooses the value of control i)."""
    if not isinstance(node, ipywidgets.Stack):
        return []
    found = [(0, node)]
    for child in node.children:
        found += [(depth + 1, s) for depth, s in _stacks(child)]
    return found


def _saved_links(box: ipywidgets.VBox) -> list[tuple[str, tuple, tuple]]:
    """The links as the static HTML will hold them: (model name, (source, trait), (target, trait)).

    Read from the widget state that ``embed_data`` (what nbconvert/Jupyter Book save) puts in
    the page, restricted to links between widgets of ``box``.
    """
    ours = {c.model_id: c for c in box.children}
    for _, stack in _stacks(_root_stack(box)):
        ours[stack.model_id] = stack
    links = []
    for entry in embed_data(views=[box])["manager_state"]["state"].values():
        if entry["model_name"] not in ("LinkModel", "DirectionalLinkModel"):
            continue
        (src, src_trait), (dst, dst_trait) = entry["state"]["source"], entry["state"]["target"]
        src, dst = src.removeprefix("IPY_MODEL_"), dst.removeprefix("IPY_MODEL_")
        if src in ours or dst in ours:
            links.append((entry["model_name"], (ours.get(src, src), src_trait), (ours.get(dst, dst), dst_trait)))
    return links


def _shown(box: ipywidgets.VBox, follow_links: bool) -> str:
    """The picture a reader sees: walk down the stacks, each at its selected index.

    ``follow_links=True`` takes each stack's index from the control linked to it, as the
    browser does (``jslink`` copies the source trait to the target); ``False`` uses the
    stacks' own ``selected_index`` as saved.
    """
    by_target = {dst[0].model_id: src for _, src, dst in _saved_links(box)} if follow_links else {}
    node = _root_stack(box)
    while isinstance(node, ipywidgets.Stack):
        if follow_links:
            source, trait = by_target[node.model_id]
            index = getattr(source, trait)
        else:
            index = node.selected_index
        node = node.children[index]
    assert isinstance(node, ipywidgets.HTML), f"a leaf of the stacks is not a picture: {node!r}"
    return node.value


# ---------------------------------------------------------------- book mode (precomputed)


def test_book_mode_draws_every_combination_exactly_once(labelled_frames, drawing) -> None:
    draw = Recorder()
    widgets.explore(draw, CONTROLS, live=False)
    assert len(draw.calls) == math.prod(len(v) for v in CONTROLS.values()) == 12
    assert Counter(draw.calls) == Counter(COMBOS), "some combination drawn twice or never"
    assert plt.get_fignums() == [], "figures of the frames left open"


def test_book_mode_frames_are_inline_pngs(drawing) -> None:
    draw = Recorder()
    box = widgets.explore(draw, {"heads": [1, 2], "scale": [1.0], "mask": ["none"]}, live=False)
    leaves = [c for _, s in _stacks(_root_stack(box)) for c in s.children if isinstance(c, ipywidgets.HTML)]
    assert len(leaves) == 2
    assert all(
        re.fullmatch(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]+" style="max-width:100%">', leaf.value)
        for leaf in leaves
    )
    assert leaves[0].value != leaves[1].value, "the two frames are the same picture"
    assert plt.get_fignums() == []
    assert box.children[-1].value == widgets.PRECOMPUTED_NOTE  # the reader is told the views are precomputed


def test_pictures_drawn_side_by_side_are_those_drawn_here_the_last_one_here(monkeypatch) -> None:
    """In the book build on Linux the pictures are drawn in forked processes, one per core; they are the
    same pictures, to the byte, and the last is drawn here (what drawing leaves behind is the loop's)."""
    if not widgets.can_fork():
        pytest.skip("forked processes need Linux")
    monkeypatch.setattr(widgets.os, "cpu_count", lambda: 2)
    names = list(CONTROLS)
    draw = Recorder()
    side_by_side = widgets._pictures(draw, names, COMBOS)
    assert Counter(draw.calls) == Counter(COMBOS)
    drawn_by = dict(zip(draw.calls, draw.pids, strict=True))  # the log interleaves the processes' lines
    assert len(set(draw.pids)) == 2 and drawn_by[COMBOS[-1]] == os.getpid()
    monkeypatch.setattr(widgets, "can_fork", lambda: False)
    here = Recorder()
    assert widgets._pictures(here, names, COMBOS) == side_by_side
    assert set(here.pids) == {os.getpid()}
    assert plt.get_fignums() == []


def test_pictures_are_drawn_here_while_cuda_is_in_use(monkeypatch) -> None:
    """A forked process must not touch CUDA: once this process has, every picture is drawn here."""
    monkeypatch.setattr(widgets.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    draw = Recorder()
    widgets.explore(draw, CONTROLS, live=False)
    assert draw.calls == COMBOS and set(draw.pids) == {os.getpid()}


def test_an_error_in_draw_comes_out_of_explore_with_its_type(drawing) -> None:
    def draw(heads: int, scale: float, mask: str):
        if (heads, scale, mask) == (1, 1.0, "none"):  # in the first of the three shares
            raise ValueError(f"cannot draw heads={heads}, scale={scale}, mask={mask!r}")
        return Recorder()(heads=heads, scale=scale, mask=mask)

    with pytest.raises(ValueError, match="cannot draw heads=1, scale=1.0, mask='none'"):
        widgets.explore(draw, CONTROLS, live=False)
    assert plt.get_fignums() == [] or drawing == "here"  # drawing here stops at the failing picture


def test_book_mode_layout_one_control_per_entry_and_nested_stacks(labelled_frames) -> None:
    box = widgets.explore(Recorder(), CONTROLS, live=False)
    controls = _controls(box)
    assert list(controls) == list(CONTROLS)
    assert isinstance(controls["heads"], ipywidgets.SelectionSlider)  # numbers: a slider
    assert isinstance(controls["mask"], ipywidgets.ToggleButtons)  # strings: buttons
    for name, control in controls.items():
        assert [v for _, v in control.options] == CONTROLS[name]
    stacks = _stacks(_root_stack(box))
    sizes = [len(v) for v in CONTROLS.values()]
    for depth, stack in stacks:
        assert len(stack.children) == sizes[depth], f"stack at depth {depth}: {len(stack.children)} children"
    # 1 + 2 + 2*3 stacks; leaves (pictures) sit below the last level only.
    assert len(stacks) == 1 + 2 + 6


def test_initial_view_shows_the_initial_values(labelled_frames, drawing) -> None:
    initial = {"scale": 2.0, "mask": "none"}  # heads: default, the first value
    box = widgets.explore(Recorder(), CONTROLS, initial=initial, live=False)
    assert {name: c.value for name, c in _controls(box).items()} == {"heads": 1, "scale": 2.0, "mask": "none"}
    expected = _label((1, 2.0, "none"))
    assert _shown(box, follow_links=False) == expected  # the stacks as saved
    assert _shown(box, follow_links=True) == expected  # and as the browser links them


def test_default_initial_view_is_the_first_value_of_each_control(labelled_frames) -> None:
    box = widgets.explore(Recorder(), CONTROLS, live=False)
    assert _shown(box, follow_links=False) == _label(tuple(v[0] for v in CONTROLS.values()))


def test_every_stack_is_jslinked_to_its_control(labelled_frames) -> None:
    box = widgets.explore(Recorder(), CONTROLS, live=False)
    controls = list(_controls(box).values())
    stacks = _stacks(_root_stack(box))
    links = _saved_links(box)
    assert len(links) == len(stacks), f"{len(stacks)} stacks but {len(links)} links"
    targets = Counter(dst[0].model_id for _, _, dst in links)
    assert all(targets[s.model_id] == 1 for _, s in stacks), "a stack with no link or with two"
    for model_name, (source, src_trait), (target, dst_trait) in links:
        # jslink (two-way, in the browser), from the control's index to the stack's selected index.
        assert model_name == "LinkModel"
        assert src_trait == "index" and dst_trait == "selected_index"
        depth = next(d for d, s in stacks if s is target)
        assert source is controls[depth], f"stack at depth {depth} linked to {source.description!r}"


def test_changing_a_control_selects_the_matching_frame(labelled_frames, drawing) -> None:
    """For every combination: set the controls' values in Python, follow the links, see that picture."""
    box = widgets.explore(Recorder(), CONTROLS, live=False)
    controls = _controls(box)
    for combo in reversed(COMBOS):
        for (name, values), value in zip(CONTROLS.items(), combo, strict=True):
            controls[name].value = value
            assert controls[name].index == values.index(value)  # the trait the link carries
        assert _shown(box, follow_links=True) == _label(combo)  # jslink acts in the browser: follow it by hand


def test_book_build_variable_forces_book_mode(labelled_frames, monkeypatch) -> None:
    monkeypatch.setenv(BOOK_ENV, "1")
    draw = Recorder()
    box = widgets.explore(draw, CONTROLS)
    assert len(draw.calls) == len(COMBOS)
    _root_stack(box)
    draw = Recorder()
    box = widgets.explore(draw, CONTROLS, live=True)  # an explicit live=True wins
    assert len(draw.calls) == 1 and not any(isinstance(c, ipywidgets.Stack) for c in box.children)


def test_too_many_combinations_name_the_count_and_the_limit(labelled_frames) -> None:
    draw = Recorder()
    n = widgets.MAX_FRAMES + 1
    with pytest.raises(ValueError) as info:
        widgets.explore(draw, {"heads": list(range(n)), "scale": [1.0], "mask": ["none"]}, live=False)
    assert str(n) in str(info.value) and str(widgets.MAX_FRAMES) in str(info.value), str(info.value)
    assert draw.calls == [], "frames were drawn before the size check"


def test_exactly_max_frames_is_allowed(labelled_frames) -> None:
    draw = Recorder()
    widgets.explore(draw, {"heads": list(range(widgets.MAX_FRAMES)), "scale": [1.0], "mask": ["none"]}, live=False)
    assert len(draw.calls) == widgets.MAX_FRAMES


# ---------------------------------------------------------------- live mode


def test_live_mode_draws_the_current_view_and_redraws_on_change() -> None:
    draw = Recorder()
    box = widgets.explore(draw, CONTROLS, initial={"scale": 1.0})
    assert isinstance(box.children[-1], ipywidgets.Output)
    assert not any(isinstance(c, ipywidgets.Stack) for c in box.children)
    assert draw.calls == [(1, 1.0, "causal")]  # only the initial view, not every combination
    controls = _controls(box)
    controls["mask"].value = "none"
    assert draw.calls[-1] == (1, 1.0, "none") and len(draw.calls) == 2
    controls["heads"].value = 2
    assert draw.calls[-1] == (2, 1.0, "none") and len(draw.calls) == 3
    assert plt.get_fignums() == [], "live redraws leave figures open"


def test_live_mode_has_no_frame_limit() -> None:
    draw = Recorder()
    widgets.explore(draw, {"heads": list(range(widgets.MAX_FRAMES + 1)), "scale": [1.0], "mask": ["none"]}, live=True)
    assert len(draw.calls) == 1


# ---------------------------------------------------------------- bad input


def _draw(**values):  # never called: validation comes first
    raise AssertionError("draw called despite invalid arguments")


@pytest.mark.parametrize("live", [True, False])
@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(draw=42), TypeError, ["draw", "got int"]),
        (dict(controls={"heads": [1, 2], "mask": []}), ValueError, ["'mask'", "non-empty", "empty"]),
        (dict(controls={}), ValueError, ["controls", "at least one control"]),
        (dict(controls=[("heads", [1, 2])]), TypeError, ["controls", "dict", "got list"]),
        (dict(controls={"mask": "causal"}), TypeError, ["'mask'", "list of values", "got str"]),
        (dict(controls={"heads": 3}), TypeError, ["'heads'", "list of values", "got int"]),
        (dict(initial={"heads": 3}), ValueError, ["'heads'", "expected one of [1, 2]", "got 3"]),
        (dict(initial={"mask": "Causal"}), ValueError, ["'mask'", "['causal', 'none']", "got 'Causal'"]),
        (dict(initial={"head": 1}), ValueError, ["unknown control", "['head']", "['heads', 'scale', 'mask']"]),
    ],
)
def test_bad_arguments_name_what_was_expected_and_given(kwargs, error, words, live) -> None:
    args = dict(draw=_draw, controls=CONTROLS) | kwargs
    with pytest.raises(error) as info:
        widgets.explore(args.pop("draw"), args.pop("controls"), live=live, **args)
    message = str(info.value)
    assert all(w in message for w in words), f"{message!r} lacks one of {words}"


# ---------------------------------------------------------------- plots: LivePlot and plot_history


class FakeHandle:
    def __init__(self) -> None:
        self.updates: list = []

    def update(self, obj, **kwargs) -> None:
        self.updates.append(obj)


@pytest.fixture
def displayed(monkeypatch):
    """Replace IPython.display.display: record each call, return a handle when display_id is asked."""
    import IPython.display

    calls: list[tuple[tuple, dict, FakeHandle | None]] = []

    def fake_display(*objs, **kwargs):
        handle = FakeHandle() if kwargs.get("display_id") else None
        calls.append((objs, kwargs, handle))
        return handle

    monkeypatch.setattr(IPython.display, "display", fake_display)
    return calls


def _curves(fig) -> dict[str, list]:
    ax = fig.axes[0]
    return {line.get_label(): list(line.get_xdata()) for line in ax.get_lines()}


def test_liveplot_displays_once_then_updates_the_same_display(displayed) -> None:
    history = History(steps=[5], train_loss=[3.0], eval_steps=[0], val_loss=[3.3])
    trainer = SimpleNamespace(history=history)
    live = LivePlot(title="run")
    live(trainer)
    history.steps.append(10)
    history.train_loss.append(2.5)
    history.eval_steps.append(10)
    history.val_loss.append(2.8)
    live(trainer)
    live(trainer)
    assert len(displayed) == 1, f"displayed {len(displayed)} times, expected once then updates"
    (fig,), kwargs, handle = displayed[0]
    assert kwargs.get("display_id") is True
    assert _curves(fig) == {"train": [5], "validation": [0]}
    assert len(handle.updates) == 2
    assert _curves(handle.updates[-1]) == {"train": [5, 10], "validation": [0, 10]}
    assert handle.updates[-1].axes[0].get_title() == "run"
    assert plt.get_fignums() == [], "LivePlot leaves its figures open"


def test_two_liveplots_are_two_displays(displayed) -> None:
    trainer = SimpleNamespace(history=History(steps=[1], train_loss=[1.0]))
    first, second = LivePlot(), LivePlot()
    first(trainer)
    second(trainer)
    first(trainer)
    assert len(displayed) == 2
    assert len(displayed[0][2].updates) == 1 and displayed[1][2].updates == []


def test_liveplot_as_a_real_trainer_callback(displayed) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    config = TrainConfig(max_steps=4, eval_interval=2, eval_steps=1, log_interval=1, warmup_steps=0, amp=False)

    def batches(generator):
        x = torch.randn(4, 2, generator=generator)
        return x, x.sum(-1, keepdim=True)

    trainer = Trainer(
        model, config, batches, loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), device="cpu"
    )
    trainer.fit(callback=LivePlot(), progress=False)
    assert trainer.history.eval_steps == [0, 2, 4]
    assert len(displayed) == 1 and len(displayed[0][2].updates) == 2  # one display, then one update per eval
    assert _curves(displayed[0][2].updates[-1])["validation"] == [0, 2, 4]


def test_plot_history_labels_the_axes_and_draws_both_curves() -> None:
    history = History(steps=[5, 10], train_loss=[3.0, 2.0], eval_steps=[0, 10], val_loss=[3.5, 2.2])
    fig = plot_history(history, title="tiny run")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("step", "loss", "tiny run")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["train"].get_ydata()) == [3.0, 2.0]
    assert list(lines["validation"].get_xdata()) == [0, 10] and list(lines["validation"].get_ydata()) == [3.5, 2.2]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train", "validation"]
    assert plots.plot_history is plot_history


@pytest.mark.parametrize(("slowdown", "expected"), [(1.0, "default"), (1.2, "default"), (2.0, 1)])
def test_one_thread_only_when_the_default_is_clearly_slower(monkeypatch, slowdown, expected):
    """threads_for_a_busy_cpu's decision, on a clock where each timed step with the default threads takes
    ``slowdown`` times as long as with one (as beside a busy process: about 1.8 measured on 2 cores)."""
    import torch

    from transformer_lib.notebook import environment

    if torch.get_num_threads() == 1:
        pytest.skip("PyTorch runs one thread here: nothing to choose")
    n_threads, now = torch.get_num_threads(), [0.0]

    def clock() -> float:  # each reading advances by one step's time at the current thread count
        now[0] += slowdown if torch.get_num_threads() > 1 else 1.0
        return now[0]

    monkeypatch.setattr(environment.time, "perf_counter", clock)
    assert environment.threads_for_a_busy_cpu() == (n_threads if expected == "default" else expected)
    assert torch.get_num_threads() == n_threads  # measuring leaves the setting as it was


def test_the_busy_cpu_message_fits_the_output_box(monkeypatch, capsys):
    """The first cell's lines on a busy CPU fit the rendered book's 79-column output box (a CI machine
    running beside other jobs printed a 150-column line, and test_printed_lines_fit_the_output_box failed)."""
    import torch

    from transformer_lib.notebook import environment

    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)  # a machine with many cores: the longest number
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(environment, "threads_for_a_busy_cpu", lambda: 1)
    monkeypatch.setattr(environment, "get_device", lambda: torch.device("cpu"))
    environment.setup_chapter(seed=None)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].endswith("| device: cpu"), lines  # versions and device on one line
    assert "one PyTorch thread instead of 16" in lines[1]
    assert all(len(line) <= 79 for line in lines), [line for line in lines if len(line) > 79]


def test_a_gpu_name_goes_to_its_own_line(monkeypatch, capsys):
    import torch

    from transformer_lib.notebook import environment

    monkeypatch.setattr(environment, "get_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA GeForce RTX 4090 Laptop GPU")
    environment.setup_chapter(seed=None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "device: cuda:0 (NVIDIA GeForce RTX 4090 Laptop GPU)", lines
    assert lines[0].startswith("Python ") and all(len(line) <= 79 for line in lines), lines
