"""A training script that takes its input's gradient (saliency logged each step): the input is a
leaf that requires grad, so after backward the step's graph still holds it and its gradient
(AccumulateGrad keeps its leaf) for as long as the script holds the loss, until the next step
rebinds it. The loss is logged as StepDump does after backward: loss.detach().clone(), then
loss.item(). argv[1]: where to save the losses and gradients. For test_replay.py: an op that
reads the last step's loss and that the step's record leaves out (aten::item: no tensor out, no
autograd node) must not hold that loss, and its graph, in the replayed step."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump

torch.manual_seed(0)
layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(2048, 256, generator=torch.Generator().manual_seed(1000 + step)).requires_grad_()
    h = x
    for layer in layers:
        h = F.gelu(layer(h))
    loss = h.square().mean()
    loss.backward()
    print("saliency", repr(x.grad.abs().mean().item()))
    steps.record(step, loss, layers)
    opt.step()
steps.save(sys.argv[1])
