"""torch.export's graph translated as it comes (``frontends.DIRECT_OPS``), without PyTorch's
core-ATen decomposition: every accepted op against PyTorch, the arguments that send a graph
through the decomposition instead, and that the decomposition is really skipped."""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import tvm_ext
from tvm_ext import frontends


class Fn(nn.Module):
    def __init__(self, fn, *modules):
        super().__init__()
        self.fn, self.parts = fn, nn.ModuleList(modules)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _bn(affine=True):
    bn = nn.BatchNorm2d(6, affine=affine)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        if affine:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)
    return bn


def _attention_mask():
    mask = torch.rand(2, 3, 5, 7) > 0.4
    mask[0, 1, 2] = False  # a row with every key masked out: zeros, as PyTorch's _safe_softmax
    return mask


# op -> (module, input shapes); each graph holds the op it is named after
CASES = {
    "elementwise": (Fn(lambda m, x: (torch.sigmoid(x) + torch.tanh(x) - torch.exp(-x.abs())) * F.silu(-x)
                       / (torch.sqrt(x.abs() + 1) * torch.rsqrt(x * x + 1) + F.relu(x)).clone()), [(4, 33)]),
    "alpha": (Fn(lambda m, x: torch.add(x, x * x, alpha=2) - torch.sub(x, 1.5, alpha=0.5) + torch.sub(x, x, alpha=3)),
              [(4, 6)]),
    "gelu": (Fn(lambda m, x: F.gelu(x) + F.gelu(x, approximate="tanh")), [(4, 33)]),
    "pow_hardtanh": (Fn(lambda m, x: F.hardtanh(x, 0.0, 6.0) + x.pow(2.0) + F.hardtanh(x)), [(4, 33)]),
    "softplus": (Fn(lambda m, x: x * torch.tanh(F.softplus(x)) + F.softplus(x, beta=2.0, threshold=5.0)), [(4, 33)]),
    "softmax": (Fn(lambda m, x: torch.softmax(x, -1) + torch.log_softmax(x, 0)), [(5, 17)]),
    "reductions": (Fn(lambda m, x: x.sum(-1, keepdim=True) + x.mean(0) + x.max(-1, keepdim=True)[0]), [(5, 17)]),
    "norms": (Fn(lambda m, x: m.parts[1](m.parts[0](x)) + m.parts[3](m.parts[2](x)) + m.parts[4](x),
                 nn.GroupNorm(2, 6), nn.LayerNorm([5, 5]), nn.GroupNorm(3, 6, affine=False),
                 nn.LayerNorm(5, elementwise_affine=False), nn.LayerNorm(5, bias=False)),
              [(2, 6, 5, 5)]),
    "batch_norm": (Fn(lambda m, x: F.dropout(m.parts[0](x), 0.3, training=False) + m.parts[1](x), _bn(),
                      _bn(affine=False)), [(2, 6, 5, 5)]),
    "conv2d": (Fn(lambda m, x: m.parts[1](m.parts[0](x)), nn.Conv2d(3, 6, 3, stride=2, padding=1),
                  nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=6, bias=False)), [(1, 3, 11, 11)]),
    "matmuls": (Fn(lambda m, x, y: m.parts[0](x) @ y.t() + torch.mm(x, x.t()).sum(), nn.Linear(17, 9)),
                [(5, 17), (9, 9)]),
    "pad": (Fn(lambda m, x: F.pad(x, (1, 2, 2, 1), mode="reflect") + F.pad(x, (1, 2, 2, 1), mode="replicate")
               + F.pad(x, (1, 2, 2, 1), mode="circular") + F.pad(x, (1, 2, 2, 1), value=0.5)), [(2, 3, 5, 6)]),
    "bmm": (Fn(lambda m, x: torch.bmm(x, x.transpose(1, 2)) + torch.matmul(x, x.permute(0, 2, 1))), [(3, 4, 5)]),
    "views": (Fn(lambda m, x: x.view(2, 3, 20).reshape(6, 20).unsqueeze(0).squeeze(0).flatten(0, 1)
                 .unflatten(0, (10, 12))[3].mean() + x.permute(3, 0, 1, 2).contiguous().select(0, 1).flatten()),
              [(2, 3, 4, 5)]),
    "attention": (Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v)
                     + F.scaled_dot_product_attention(q, k, v, is_causal=True)
                     + F.scaled_dot_product_attention(q, k, v, attn_mask=m.mask, scale=0.3)
                     + F.scaled_dot_product_attention(q, k, v, attn_mask=m.bias)),
                  [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8)]),
}
_attention = CASES["attention"][0]
_attention.mask = _attention_mask()
_attention.bias = torch.randn(5, 7)


def _export(module, shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    inputs = tuple(torch.randn(*s, generator=gen) for s in shapes)
    module.eval()
    with torch.no_grad():
        return torch.export.export(module, inputs), inputs, module(*inputs)


def _ops(exported) -> set[str]:
    return {frontends._op_name(n.target) for n in exported.graph.nodes if n.op == "call_function"}


def _no_decomposition(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise AssertionError("run_decompositions was called")
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", refuse)


@pytest.mark.parametrize("name", list(CASES))
def test_each_direct_op_is_translated_as_exported_and_matches_pytorch(name, monkeypatch):
    module, shapes = CASES[name]
    exported, inputs, expected = _export(module, shapes)
    assert frontends.translates_directly(exported), _ops(exported) - set(frontends.DIRECT_OPS)
    _no_decomposition(monkeypatch)
    compiled = tvm_ext.compile(exported)
    got = compiled(*(x.numpy() for x in inputs))
    np.testing.assert_allclose(got, expected.numpy(), rtol=2e-5, atol=2e-5)


def test_the_cases_hold_every_direct_op():
    seen = set().union(*(_ops(_export(m, s)[0]) for m, s in CASES.values()))
    assert set(frontends.DIRECT_OPS) - seen == set()


# arguments a direct converter would drop or misread: these graphs take the decomposition
REFUSED = {
    "softmax to float64": Fn(lambda m, x: torch.softmax(x, -1, dtype=torch.float64)),
    "sum to float64": Fn(lambda m, x: x.sum(-1, dtype=torch.float64)),
    "cumsum": Fn(lambda m, x: torch.cumsum(x, -1)),
    "pad that crops": Fn(lambda m, x: F.pad(x, (-1, 2))),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_graph_with_an_argument_or_op_direct_translation_refuses_is_decomposed_first(name, monkeypatch):
    exported, inputs, expected = _export(REFUSED[name], [(4, 6)])
    assert not frontends.translates_directly(exported)
    calls = []
    decompose = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: calls.append(1) or decompose(self, *a, **k))
    got = tvm_ext.compile(exported)(inputs[0].numpy())
    assert calls == [1]
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_batch_norm_and_dropout_in_training_are_decomposed():
    bn, drop = Fn(lambda m, x: m.parts[0](x), _bn()).train(), Fn(lambda m, x: F.dropout(x, 0.5, training=True))
    for module in (bn, drop):
        exported = torch.export.export(module, (torch.randn(2, 6, 5, 5),))
        assert not frontends.translates_directly(exported)


def test_batch_norm_without_running_statistics_is_decomposed_and_normalizes_by_the_batch():
    exported, inputs, expected = _export(Fn(lambda m, x: m.parts[0](x), nn.BatchNorm2d(6, track_running_stats=False)),
                                         [(2, 6, 5, 5)])
    assert not frontends.translates_directly(exported)
    got = tvm_ext.compile(exported)(inputs[0].numpy())
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-4)


def test_the_attention_converter_emits_no_relax_attention_and_fuses_its_softmax():
    module, shapes = CASES["attention"]
    exported, _, _ = _export(module, shapes)
    report = tvm_ext.compile(exported).report()
    ops = [op for k in report.kernels for op in k.ops]
    assert "nn.attention" not in ops and "nn.softmax" in ops
    assert not any(k.ops == ["full_like"] for k in report.kernels)


# ------------------------------------------------------------------ random chains of direct ops
# each step maps a (rows, cols) tensor to one of the same shape; `other` is an earlier value
STEPS = [
    lambda x, o: torch.relu(x), lambda x, o: torch.sigmoid(x), lambda x, o: torch.tanh(x),
    lambda x, o: F.silu(x), lambda x, o: F.gelu(x, approximate="tanh"), lambda x, o: torch.exp(-x.abs()),
    lambda x, o: torch.sqrt(x.abs() + 1), lambda x, o: torch.rsqrt(x * x + 1), lambda x, o: -x,
    lambda x, o: torch.add(x, o, alpha=0.5), lambda x, o: x - o, lambda x, o: x * o, lambda x, o: x / (o.abs() + 1),
    lambda x, o: x.pow(2.0), lambda x, o: F.hardtanh(x, -0.5, 2.0), lambda x, o: F.softplus(x, beta=1.5),
    lambda x, o: torch.softmax(x, -1), lambda x, o: torch.log_softmax(x, 0), lambda x, o: F.layer_norm(x, x.shape[-1:]),
    lambda x, o: x - x.mean(-1, keepdim=True), lambda x, o: x + x.sum(0, keepdim=True),
    lambda x, o: x - x.max(-1, keepdim=True)[0], lambda x, o: x.t().contiguous().t() + o,
    lambda x, o: x.reshape(-1).view(x.shape) * 2, lambda x, o: x.unsqueeze(0).flatten(0, 1) + 1,
    lambda x, o: F.dropout(x, 0.2, training=False), lambda x, o: (x @ o.t()) @ o / x.shape[-1],
]


class Chain(nn.Module):
    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def forward(self, x):
        values = [x]
        for op, other in self.steps:
            values.append(STEPS[op](values[-1], values[other % len(values)]))
        return values[-1]


@settings(max_examples=int(os.environ.get("TVM_EXT_FUZZ_EXAMPLES", "12")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(STEPS) - 1), st.integers(0, 8)), min_size=1, max_size=5),
       st.integers(1, 9), st.integers(1, 37))
def test_random_chains_of_direct_ops_match_pytorch(steps, rows, cols):
    exported, inputs, expected = _export(Chain(steps), [(rows, cols)])
    assert frontends.translates_directly(exported)
    got = tvm_ext.compile(exported, strict=True)(inputs[0].numpy())
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-4)


def test_the_cycle_collector_is_paused_for_the_export_and_the_import_and_resumed_as_it_was(monkeypatch):
    """torch.export and the importer run with the collector off (a full collection midway scans
    every object the process holds); afterwards it is on again, or still off if the user had
    turned it off."""
    import gc
    import tvm.relax.frontend.torch as tvm_torch

    seen = []
    export, importer = torch.export.export, tvm_torch.from_exported_program
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: (seen.append(("export", gc.isenabled())),
                                                                  export(*a, **k))[1])
    monkeypatch.setattr(tvm_torch, "from_exported_program",
                        lambda *a, **k: (seen.append(("import", gc.isenabled())), importer(*a, **k))[1])
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    was = gc.isenabled()
    try:
        gc.enable()
        frontends.from_torch(model, (torch.randn(2, 4),))
        assert seen == [("export", False), ("import", False)]
        assert gc.isenabled()
        gc.disable()
        frontends.from_torch(model, (torch.randn(2, 4),))
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_the_export_records_no_stack_traces_and_restores_pytorchs_switch():
    """from_torch exports without per-node stack traces (a fifth of torch.export's time) and
    leaves torch.fx's switch as it found it, also when the export fails."""
    import torch.fx.config as fx_config

    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(fx_config.do_not_emit_stack_traces)
            return torch.relu(x) + 1

    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("no")

    assert fx_config.do_not_emit_stack_traces is False
    mod = frontends.from_torch(Probe(), (torch.randn(2, 3),))
    assert seen and all(seen)
    assert fx_config.do_not_emit_stack_traces is False
    np.testing.assert_allclose(tvm_ext.compile(mod)(np.ones((2, 3), "float32")), np.full((2, 3), 2.0))
    with pytest.raises(tvm_ext.errors.FrontendError):
        frontends.from_torch(Broken(), (torch.randn(2, 3),))
    assert fx_config.do_not_emit_stack_traces is False
