"""ONNX export (transformer_lib.export): the file's logits equal PyTorch's for every batch size and
length, the training extras stay out, and bad input or a missing package fails with a clear message."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import importorskip_unless_ci
from transformer_lib import GPT, GPTConfig
from transformer_lib.export import OnnxGPT, export_onnx

BLOCK = 16
CONFIGS = {
    # dropout > 0 and exported from train mode: the file must hold the eval-mode model.
    "learned": dict(positional="learned", dropout=0.1),
    # the Llama recipe: RoPE, RMSNorm, SwiGLU, no biases, grouped-query attention
    "llama": dict(positional="rope", norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=1),
}
# (B, T): one token, the exporter's example shape, odd sizes, the whole context
SHAPES = [(1, 1), (2, 8), (3, 5), (5, 13), (2, BLOCK)]


def small_gpt(**kw) -> GPT:
    return GPT(GPTConfig(vocab_size=37, block_size=BLOCK, n_layers=2, n_heads=2, d_model=16, **kw))


@pytest.fixture(scope="module", params=list(CONFIGS))
def exported(request, tmp_path_factory):
    """(model in train mode, its ONNX file run by ONNX Runtime), one export per configuration."""
    importorskip_unless_ci("onnxscript")
    importorskip_unless_ci("onnxruntime")
    torch.manual_seed(0)
    model = small_gpt(**CONFIGS[request.param]).train()
    path = export_onnx(model, tmp_path_factory.mktemp(request.param) / "gpt.onnx")
    assert model.training, "export_onnx must restore the caller's mode"
    return model, OnnxGPT(path, threads=1)


@pytest.mark.slow  # exports three models to ONNX (the fixture): seconds each
@pytest.mark.parametrize("shape", SHAPES)
def test_onnx_logits_equal_pytorch_for_any_batch_and_length(exported, shape):
    model, onnx_model = exported
    ids = torch.randint(0, 37, shape)
    with torch.no_grad():
        model.eval()
        want, _ = model(ids)
        model.train()
    got = onnx_model(ids)
    assert got.shape == (*shape, 37) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.slow  # exports three models to ONNX (the fixture): seconds each
def test_onnx_file_is_the_logits_only_with_free_batch_and_length(exported):
    model, onnx_model = exported
    assert [o.name for o in onnx_model.session.get_outputs()] == ["logits"]  # no loss
    assert onnx_model.input_shape == (None, None)  # both axes dynamic
    assert (onnx_model.vocab_size, onnx_model.block_size) == (37, BLOCK)
    ids = torch.randint(0, 37, (2, 6))
    assert not torch.equal(onnx_model(ids), onnx_model(ids.flip(-1)))  # the tokens matter


@pytest.mark.slow  # exports three models to ONNX (the fixture): seconds each
def test_onnx_model_rejects_bad_ids_clearly(exported):
    _, onnx_model = exported
    with pytest.raises(ValueError, match=f"longer than the model's context of {BLOCK} tokens"):
        onnx_model(torch.zeros(1, BLOCK + 1, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        onnx_model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        onnx_model(torch.full((1, 4), 37))
    with pytest.raises(ValueError, match="rank 2"):
        onnx_model(torch.zeros(4, dtype=torch.long))


@pytest.mark.slow  # exports three models to ONNX (the fixture): seconds each
def test_onnx_model_accepts_other_integer_dtypes(exported):
    _, onnx_model = exported
    ids = torch.randint(0, 37, (2, 5))
    torch.testing.assert_close(onnx_model(ids.int()), onnx_model(ids), atol=0, rtol=0)


def test_export_rejects_bad_arguments_before_exporting(tmp_path):
    importorskip_unless_ci("onnxscript")
    model = small_gpt()
    with pytest.raises(TypeError, match="transformer_lib.GPT"):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="longer than the model's context"):
        export_onnx(model, tmp_path / "x.onnx", example_ids=torch.zeros(2, BLOCK + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="batch >= 2 and length >= 2"):
        export_onnx(model, tmp_path / "x.onnx", example_ids=torch.zeros(1, 4, dtype=torch.long))
    assert not (tmp_path / "x.onnx").exists()


def test_fixed_shape_export_says_which_shape_it_takes(tmp_path):
    importorskip_unless_ci("onnxscript")
    importorskip_unless_ci("onnxruntime")
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layers=1, n_heads=1, d_model=8)).eval()
    ids = torch.randint(0, 11, (1, 3))
    onnx_model = OnnxGPT(export_onnx(model, tmp_path / "fixed.onnx", example_ids=ids, dynamic=False))
    assert onnx_model.input_shape == (1, 3)
    with torch.no_grad():
        torch.testing.assert_close(onnx_model(ids), model(ids)[0], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match=r"fixed shape \(1, 3\)"):
        onnx_model(torch.zeros(1, 4, dtype=torch.long))


def test_missing_packages_are_named_with_their_pip_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` now raises ImportError
    with pytest.raises(ImportError, match="pip install onnxruntime"):
        OnnxGPT(tmp_path / "gpt.onnx")
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(ImportError, match="pip install onnxscript"):
        export_onnx(small_gpt(), tmp_path / "gpt.onnx")


def test_onnx_model_refuses_a_file_it_cannot_check_ids_for(tmp_path):
    onnx = importorskip_unless_ci("onnx")
    importorskip_unless_ci("onnxruntime")
    with pytest.raises(FileNotFoundError, match="no ONNX file"):
        OnnxGPT(tmp_path / "missing.onnx")
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Identity", ["idx"], ["logits"])],
        "identity",
        [h.make_tensor_value_info("idx", onnx.TensorProto.INT64, ["B", "T"])],
        [h.make_tensor_value_info("logits", onnx.TensorProto.INT64, ["B", "T"])],
    )
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9), tmp_path / "other.onnx")
    with pytest.raises(ValueError, match="not written by transformer_lib"):
        OnnxGPT(tmp_path / "other.onnx")
