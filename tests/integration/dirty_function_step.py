"""A training script with a custom autograd.Function that scales its input in place and returns
it (ctx.mark_dirty), with a second, non-differentiable result (the row's argmax). The Function's
forward runs under no_grad, so its write is no op of the step, and its RecordFunction shows no
output: what reads the written tensor next (tanh) looked as if it read what the op before the
Function made. argv[1]: where to save the losses and gradients. For test_replay.py: the plan
must not re-run that reader from the unwritten tensor (the replay held the written one, unplanned)."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump


class ScaleInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        x.mul_(2.0)
        idx = x.argmax(-1)
        ctx.mark_non_differentiable(idx)
        return x, idx

    @staticmethod
    def backward(ctx, grad, grad_idx):
        return grad * 2.0


torch.manual_seed(0)
layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(2048, 256, generator=torch.Generator().manual_seed(1000 + step))
    for layer in layers:
        h = F.gelu(layer(x)) + 0
        h, idx = ScaleInPlace.apply(h)
        x = torch.tanh(h) + idx[:, None].float() * 1e-3
    loss = x.square().mean()
    loss.backward()
    steps.record(step, loss, layers)
    opt.step()
steps.save(sys.argv[1])
