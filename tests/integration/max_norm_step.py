"""A training script with nn.Embedding(max_norm=...): each forward renormalises the looked-up rows
of the embedding's weight in place (embedding_renorm_ on `weight.detach()`, which shares the
weight's version counter) before the lookup reads it. argv[1]: where to save the losses and
gradients. For test_replay.py: a rebuild of the lookup must read the weight as renormalised."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5000, 256, max_norm=1.0)
        self.layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(3)])

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = F.gelu(layer(x))
        return x


torch.manual_seed(0)
m = Net()
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    loss = m(torch.randint(0, 5000, (2048,))).square().mean()
    loss.backward()
    steps.record(step, loss, m)
    opt.step()
steps.save(sys.argv[1])
