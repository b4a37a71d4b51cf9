"""A training script whose optimizer calls the step's closure itself: torch.optim.LBFGS runs the
forward and backward inside optimizer.step(closure), up to max_iter times, under its own
no_grad with the closure under enable_grad. argv[1]: "lbfgs", or "adam" (the same closure,
called by the script, and Adam's step without one: its first step makes its state inside the
next step's window, which StepDump's copies open); argv[2]: where to save the losses and
gradients. For test_replay.py: every closure call is a training step the agent sees and replays
its plan for, none is taken for an optimizer step that raised; an optimizer step without a
closure is still one whose state is no activation."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump

torch.manual_seed(0)
layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])
lbfgs = sys.argv[1] == "lbfgs"
opt = (torch.optim.LBFGS(layers.parameters(), lr=0.1, max_iter=3, history_size=5) if lbfgs
       else torch.optim.Adam(layers.parameters(), lr=1e-3))
steps = StepDump()
for step in range(8):
    x = torch.randn(2048, 256, generator=torch.Generator().manual_seed(1000 + step))

    def closure():
        opt.zero_grad()
        h = x
        for layer in layers:
            h = F.gelu(layer(h))
        loss = h.square().mean()
        loss.backward()
        return loss

    if lbfgs:
        loss = opt.step(closure)
        steps.record(step, loss, layers)
    else:
        loss = closure()
        steps.record(step, loss, layers)
        opt.step()
steps.save(sys.argv[2])
