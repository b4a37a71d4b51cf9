"""A training script with a torch.jit.script activation in every layer (as older model zoos
write their swish and mish). After its profiling runs, TorchScript runs the function as a
DifferentiableGraph: its ops are seen one by one, but its backward node saves what they made only
once the last of them is done. argv[1]: where to save the losses and gradients. For
test_replay.py: the plan evicts those saved tensors after that save, and the replay does."""
import sys
import warnings

import torch
import torch.nn as nn
from step_dump import StepDump

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit is deprecated


@torch.jit.script
def swishish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x) + 0.01 * torch.tanh(x)


torch.manual_seed(0)
layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])
opt = torch.optim.SGD(layers.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(2048, 256, generator=torch.Generator().manual_seed(1000 + step))
    for layer in layers:
        x = swishish(layer(x))
    loss = x.square().mean()
    loss.backward()
    steps.record(step, loss, layers)
    opt.step()
steps.save(sys.argv[1])
