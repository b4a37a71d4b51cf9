"""A training script whose forward writes a mask through a slice and then reads the mask whole:
m = torch.ones_like(h, dtype=torch.bool); m[:, :k] = False; h.masked_fill(m.logical_not(), 0).
The write is fill_ on the slice, which dies at once, and the mask's own tensor is then at a later
version than the op that made it. argv[1]: "whole", or "read-first" (the mask is also read
before the write: a rebuild may need what ones_like made both as it was and as written), or
"factory" (the mask is made by torch.ones(h.shape), from its arguments alone, not like h);
argv[2]: where to save the losses and gradients. For test_replay.py: masked_fill saves the
mask's negation, which a plan evicts and rebuilds from the slice's write."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump

torch.manual_seed(0)
mode, dump = sys.argv[1], sys.argv[2]
layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(2048, 256, generator=torch.Generator().manual_seed(1000 + step))
    for i, layer in enumerate(layers):
        h = F.gelu(layer(x))
        m = torch.ones(h.shape, dtype=torch.bool) if mode == "factory" else torch.ones_like(h, dtype=torch.bool)
        ones = m.float() if mode == "read-first" else 1.0
        m[:, : i + 1] = False
        x = (h * ones).masked_fill(m.logical_not(), 0.0) + h
    loss = x.square().mean()
    loss.backward()
    steps.record(step, loss, layers)
    opt.step()
steps.save(dump)
