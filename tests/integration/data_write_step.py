"""A training script whose forward scales each layer's weight in place through `.data` right
after the layer ran (a norm constraint written the legacy way: `.data` has its own version
counter, so autograd never sees the write, and backward reads the scaled weight). argv[1]: where
to save the losses, gradients and weights. For test_replay.py: a re-run of a layer must read its
weight as it was, so the replay copies it before the write, and the plan must count that copy."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump

torch.manual_seed(0)
layers = nn.ModuleList([nn.Linear(512, 512) for _ in range(4)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(768, 512)
    for layer in layers:
        h = layer(x)
        layer.weight.data.mul_(0.999)
        x = F.gelu(h)
    loss = x.square().mean()
    loss.backward()
    steps.record(step, loss, layers)
    opt.step()
steps.save(sys.argv[1])
