"""A training script that runs part of each step under its own TorchDispatchMode. argv[1]:
  fwd    forward under a mode that rounds every op's output through bfloat16 (views left as they
         are: a numerics emulation), backward outside it
  bwd    forward outside it, backward under it
  flops  forward and backward under torch.utils.flop_counter.FlopCounterMode; prints its count
  late   flops from step 6 on only (after the plan)
argv[2]: where to save the losses and gradients. For test_replay.py: a re-run must neither run
outside the mode an op ran under nor inside one it did not run under, nor be counted by one."""
import sys

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode
from step_dump import StepDump


class Rounding(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        return tree_map(lambda t: t.bfloat16().float() if isinstance(t, torch.Tensor) and t.dtype == torch.float32
                        else t, out)


torch.manual_seed(0)
where, dump = sys.argv[1], sys.argv[2]
layers = [nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256), nn.Tanh()) for _ in range(4)]
m = nn.Sequential(*layers, nn.Linear(256, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(256, 256)
    if where == "fwd":
        with Rounding():
            loss = m(x).square().mean()
        loss.backward()
    elif where == "bwd":
        loss = m(x).square().mean()
        with Rounding():
            loss.backward()
    elif where == "late" and step < 6:
        loss = m(x).square().mean()
        loss.backward()
    else:
        counter = FlopCounterMode(display=False)
        with counter:
            loss = m(x).square().mean()
            loss.backward()
        print("flops", counter.get_total_flops())
    steps.record(step, loss, m)
    opt.step()
steps.save(dump)
