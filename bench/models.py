"""The benchmark's workloads: PyTorch modules and their example inputs (nothing downloaded)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


class ElementwiseChain(nn.Module):
    """relu(x * sigmoid(x) * 2 + b) - 0.5: five memory-bound ops, a broadcast bias."""

    def __init__(self, cols):
        super().__init__()
        self.b = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return torch.relu(x * torch.sigmoid(x) * 2 + self.b) - 0.5


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class LogSoftmax(nn.Module):
    def forward(self, x):
        return torch.log_softmax(x, dim=-1)


class SoftmaxByHand(nn.Module):
    """Softmax spelled out (max, subtract, exp, sum, divide): fusion has to find it."""

    def forward(self, x):
        e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
        return e / e.sum(dim=-1, keepdim=True)


class RMSNorm(nn.Module):
    """RMSNorm written as models write it: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class LayerNormByHand(nn.Module):
    """LayerNorm spelled out: mean, centred variance, normalize, scale and shift."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.bias = nn.Parameter(0.1 * torch.randn(dim))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * self.weight + self.bias


class MLP(nn.Module):
    def __init__(self, dim, hidden, out):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(dim, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, out)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class MLPBlock(nn.Module):
    """A transformer's MLP: Linear, GELU, Linear, plus the residual."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


class ConvBNReLUResidual(nn.Module):
    """conv 3x3 + BatchNorm + ReLU, plus the residual."""

    def __init__(self, channels):
        super().__init__()
        self.body = ConvBNReLU(channels, channels)

    def forward(self, x):
        return x + self.body(x)


class ConvBNReLU(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class BasicBlock(nn.Module):
    """ResNet's basic block: conv-bn-relu, conv-bn, + identity, relu."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand + BN + ReLU6, 3x3 depthwise (stride 1 or 2) + BN + ReLU6,
    1x1 project + BN, + identity where the shapes allow (stride 1, as many channels out as in)."""

    def __init__(self, channels, out=None, stride=1, expand=6):
        super().__init__()
        hidden, out = channels * expand, out or channels
        self.residual = stride == 1 and out == channels
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, out, 1, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class Mish(nn.Module):
    """x * tanh(softplus(x)): three nested transcendentals (a compile-time test as much as a kernel)."""

    def forward(self, x):
        return x * torch.tanh(nn.functional.softplus(x))


class GroupNormSiLU(nn.Module):
    """GroupNorm then SiLU, as in diffusion U-Nets: statistics over channel groups and space."""

    def __init__(self, groups, channels):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x):
        return nn.functional.silu(self.norm(x))


class MatMul(nn.Module):
    """x @ W for a k x n weight (square by default): fp32 GEMM, compared with torch.mm
    (oneDNN/MKL)."""

    def __init__(self, k, n=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n or k) / k ** 0.5)

    def forward(self, x):
        return torch.mm(x, self.weight)


def _eval_stats(module: nn.Module) -> nn.Module:
    """BatchNorm with statistics other than the initial 0/1, as a trained model has them."""
    gen = torch.Generator().manual_seed(0)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(1 + 0.1 * torch.rand(m.num_features, generator=gen))
    return module


@dataclass
class Workload:
    make: Callable[[], tuple[nn.Module, torch.Tensor]]
    memory_bound: bool  # its roofline is bandwidth: report the distance to it
    flops: int = 0  # for compute-bound kernels: report GFLOP/s


#: (m, k, n) of the model-shaped GEMMs, x (m, k) @ W (k, n)
GEMM_SHAPES = {"matmul_mlp_up": (256, 1024, 4096), "matmul_mlp_down": (256, 4096, 1024),
               "matmul_qkv": (1024, 256, 768), "matmul_ffn_up": (1024, 256, 1024),
               "matmul_ffn_down": (1024, 1024, 256)}


def workloads(quick: bool) -> dict[str, Workload]:
    s = 4 if quick else 1
    rows = 4096 // s
    return {
        "elementwise_chain": Workload(lambda: (ElementwiseChain(1024), torch.randn(rows, 1024)), True),
        "softmax": Workload(lambda: (Softmax(), torch.randn(rows // 2, 1024)), True),
        "softmax_by_hand": Workload(lambda: (SoftmaxByHand(), torch.randn(rows // 2, 1024)), True),
        "log_softmax": Workload(lambda: (LogSoftmax(), torch.randn(rows // 2, 1024)), True),
        "layer_norm": Workload(lambda: (nn.LayerNorm(768), torch.randn(rows, 768)), True),
        "layer_norm_by_hand": Workload(lambda: (LayerNormByHand(768), torch.randn(rows, 768)), True),
        "rms_norm": Workload(lambda: (RMSNorm(768), torch.randn(rows, 768)), True),
        "mish": Workload(lambda: (Mish(), torch.randn(3, 500 // s, 700)), True),
        "group_norm_silu": Workload(lambda: (GroupNormSiLU(8, 48), torch.randn(4, 48, 30, 30)), True),
        # the exp-bearing three again, 64 MiB in and 64 out: past the L3 of the CPUs we run on
        # (32 MiB on Zen 3 and Zen 4), where the copy that is their roofline runs at DRAM's speed
        "softmax_past_l3": Workload(lambda: (Softmax(), torch.randn(8192 // s, 2048)), True),
        "mish_past_l3": Workload(lambda: (Mish(), torch.randn(16 // s, 1024, 1024)), True),
        "group_norm_silu_past_l3": Workload(lambda: (GroupNormSiLU(8, 48), torch.randn(64 // s, 48, 72, 72)), True),
        "matmul_512": Workload(lambda: (MatMul(512), torch.randn(512, 512)), False, 2 * 512 ** 3),
        "matmul_1024": Workload(lambda: (MatMul(1024), torch.randn(1024, 1024)), False, 2 * 1024 ** 3),
        "matmul_2048": Workload(lambda: (MatMul(2048 // s), torch.randn(2048 // s, 2048 // s)), False,
                                2 * (2048 // s) ** 3),
        # the GEMMs of the MLP block (Linear 1024 -> 4096 -> 1024, 256 tokens) and of the
        # transformer layer (d_model 256, FFN 1024, 8 x 128 tokens) of issue 14, as torch.mm
        **{name: Workload(lambda m=m, k=k, n=n: (MatMul(k // s, n // s), torch.randn(m // s, k // s)), False,
                          2 * (m // s) * (k // s) * (n // s))
           for name, (m, k, n) in GEMM_SHAPES.items()},
        "mlp": Workload(lambda: (MLP(512, 1024, 256), torch.randn(256 // s, 512)), False),
        "conv_bn_relu": Workload(lambda: (ConvBNReLU(32, 32), torch.randn(1, 32, 56 // s, 56 // s)), False),
        "resnet_basic_block": Workload(lambda: (BasicBlock(32), torch.randn(1, 32, 56 // s, 56 // s)), False),
        "inverted_residual": Workload(lambda: (_eval_stats(InvertedResidual(32)), torch.randn(1, 32, 28 // s, 28 // s)),
                                      False),
        "inverted_residual_s2": Workload(lambda: (_eval_stats(InvertedResidual(32, 64, stride=2)),
                                                  torch.randn(1, 32, 56 // s, 56 // s)), False),
        # issue 14's three workloads at its own sizes
        "mlp_block": Workload(lambda: (MLPBlock(1024 // s, 4096 // s), torch.randn(256 // s, 1024 // s)), False),
        "conv_bn_relu_residual": Workload(lambda: (_eval_stats(ConvBNReLUResidual(64)),
                                                   torch.randn(8 // s, 64, 56, 56)), False),
        "transformer_encoder_layer_8x128": Workload(lambda: (
            nn.TransformerEncoderLayer(256 // s, 4, 1024 // s, dropout=0.0, batch_first=True),
            torch.randn(8 // s, 128 // s, 256 // s)), False),
        "transformer_encoder_layer": Workload(lambda: (
            nn.TransformerEncoderLayer(256 // s, 4, 1024 // s, dropout=0.0, batch_first=True),
            torch.randn(4, 128 // s, 256 // s)), False),
    }
