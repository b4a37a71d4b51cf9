"""A training script whose forward draws straight-through Gumbel-softmax choices (discrete latent
codes, VQ-style routing) after each layer: F.gumbel_softmax(hard=True) draws its noise into
torch.empty_like(logits) with exponential_ and builds the one-hot with torch.zeros_like().scatter_,
factories that run below autograd and are then filled in place. argv[1]: where to save the losses
and gradients. For test_replay.py: what the layers save can be evicted and rebuilt (the noise
drawn again from the generator's state at the op), so a budget lowers the peak."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump

torch.manual_seed(0)
dump = sys.argv[1]
layers = nn.ModuleList([nn.Linear(512, 512) for _ in range(4)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    h = torch.randn(768, 512)
    for layer in layers:
        logits = layer(h)
        h = F.gumbel_softmax(logits, tau=0.5, hard=True) * logits + h
    loss = h.square().mean()
    loss.backward()
    steps.record(step, loss, layers)
    opt.step()
steps.save(dump)
