"""A training script whose forward writes in place through `.data` (its own version counter, so
autograd never sees the write, and backward reads the new contents) after an op read the tensor.
argv[1]:
  weights  each layer's weight scaled right after the layer ran (a norm constraint written the
           legacy way)
  batch    the batch centred in place (`x.data.sub_(x.data.mean())`) after the first layer read
           it, then added to each later layer's output; drawn before the loop, an input from
           outside the step
  made     the same, the batch made in the step (`torch.randn(...).sin()`: ops of the step)
argv[2]: where to save the losses and gradients. For test_replay.py: a re-run of an op that read
the tensor before the write must read it as it was, so the replay copies it first, once, and the
plan must count that copy; one made in the step is made again instead, and the later layers'
re-runs read the written tensor, not a new one."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump

torch.manual_seed(0)
what, dump = sys.argv[1], sys.argv[2]
layers = nn.ModuleList([nn.Linear(512, 512) for _ in range(4)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
steps = StepDump()
batches = [torch.randn(768, 512) for _ in range(10)]
for step in range(10):
    opt.zero_grad()
    x = torch.randn(768, 512).sin() if what == "made" else batches[step]
    if what == "weights":
        h = x
        for layer in layers:
            out = layer(h)
            layer.weight.data.mul_(0.999)
            h = F.gelu(out)
    else:
        h = F.gelu(layers[0](x))
        x.data.sub_(x.data.mean())
        for layer in layers[1:]:
            h = F.gelu(layer(h) + x)
    loss = h.square().mean()
    loss.backward()
    steps.record(step, loss, layers)
    opt.step()
steps.save(dump)
