"""A training script whose forward puts rows through a strided nested tensor from step LATE on
(argv[1]); argv[2]: where to save the losses and gradients. For test_replay.py: the recorder
cannot describe a nested tensor (its sizes() throws)."""
import sys

import torch
import torch.nn as nn
from step_dump import StepDump

torch.manual_seed(0)
late, dump = int(sys.argv[1]), sys.argv[2]
m = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 64))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    h = m[3](m[2](m[1](m[0](torch.randn(512, 64)))))
    if step >= late:
        h = torch.cat(torch.nested.as_nested_tensor([h[:200], h[200:]]).unbind())  # rows of two lengths
    loss = (m[4](h) ** 2).mean()
    loss.backward()
    steps.record(step, loss, m)
    opt.step()
steps.save(dump)
