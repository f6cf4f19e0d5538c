"""``torch.compile(model, backend="tvm_ext")``: registered by the package's entry point, equal
to eager on the benchmark's models, eager (with a warning) where it cannot compile."""
from __future__ import annotations

import importlib.metadata
import pathlib
import sys
import warnings

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "bench"))
from models import workloads  # noqa: E402


def _compiled(model, x, **options):
    torch._dynamo.reset()
    fn = torch.compile(model, backend="tvm_ext", options=options)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fn(x)
    return got, [str(w.message) for w in caught if "tvm_ext backend" in str(w.message)]


def test_the_backend_is_registered_by_the_entry_point():
    points = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert "tvm_ext" in points.names
    assert "tvm_ext" in torch._dynamo.list_backends()


@pytest.mark.parametrize("freeze", [False, True])
@pytest.mark.parametrize("name", ["elementwise_chain", "softmax", "layer_norm", "mlp", "conv_bn_relu",
                                  "resnet_basic_block"])
def test_benchmark_models_equal_eager(name, freeze):
    model, x = workloads(True)[name].make()
    model.eval()
    got, warned = _compiled(model, x, freeze=freeze)
    assert warned == []  # compiled by us, not run eagerly
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)


def test_an_op_we_cannot_import_runs_eagerly_with_a_warning():
    # eval-mode TransformerEncoderLayer is one fused op (_transformer_encoder_layer_fwd)
    model, x = workloads(True)["transformer_encoder_layer"].make()
    model.eval()
    got, warned = _compiled(model, x)
    assert len(warned) == 1 and "eagerly" in warned[0] and "importer" in warned[0]
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))


class _Branchy(torch.nn.Module):
    """A data-dependent branch: Dynamo breaks the graph there and compiles both sides."""

    def forward(self, x):
        y = torch.relu(x) + 1
        if y.sum() > 10:
            return torch.softmax(y, -1) * 2
        return y - 3


def test_a_graph_break_compiles_each_piece():
    model = _Branchy()
    for x in (torch.randn(4, 8), torch.zeros(1, 2)):
        got, warned = _compiled(model, x)
        assert warned == []
        torch.testing.assert_close(got, model(x))


def test_weights_updated_in_place_are_seen_unless_frozen():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU()).eval()
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    fn = torch.compile(model, backend="tvm_ext")
    with torch.no_grad():
        fn(x)
        model[0].weight.mul_(2.0)
        torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_graph_that_needs_gradients_runs_eagerly_and_trains():
    model = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    torch._dynamo.reset()
    fn = torch.compile(model, backend="tvm_ext")
    with pytest.warns(RuntimeWarning, match="torch.no_grad"):
        loss = fn(x).sum()
    loss.backward()
    assert model.weight.grad is not None


def test_unknown_options_are_refused():
    torch._dynamo.reset()
    fn = torch.compile(torch.nn.ReLU(), backend="tvm_ext", options={"fuse": "nnvm"})
    with pytest.raises(Exception, match="unknown tvm_ext backend options"):
        fn(torch.randn(2))
