"""A training script whose forward runs under torch.nn.attention.sdpa_kernel(SDPBackend.MATH)
and whose backward runs outside it (causal attention without dropout, where the CPU would take
its fused flash kernel). argv[1]: where to save the losses and gradients. For test_replay.py: a
re-run in backward must take the kernel its forward op took."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from step_dump import StepDump


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(128, 384), nn.Linear(128, 128)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 32).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, t, c))


torch.manual_seed(0)
m = nn.Sequential(*[Attention() for _ in range(4)], nn.Linear(128, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(8, 128, 128)
    with sdpa_kernel(SDPBackend.MATH):
        loss = m(x).square().mean()
    loss.backward()
    steps.record(step, loss, m)
    opt.step()
steps.save(sys.argv[1])
