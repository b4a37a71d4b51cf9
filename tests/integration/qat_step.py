"""Quantization-aware training (torch.ao.quantization.prepare_qat, the fbgemm QAT config). Its
fake quantizer, fused_moving_avg_obs_fake_quant, updates its observer's statistics in place
without bumping their version counters, and its output depends on them. argv[1]: where to save
the losses, gradients and buffers. For test_replay.py."""
import sys
import warnings

import torch
import torch.nn as nn

warnings.filterwarnings("ignore", category=DeprecationWarning)
import torch.ao.quantization as tq  # noqa: E402
from step_dump import StepDump  # noqa: E402


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64),
                                  nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.dequant(self.body(self.quant(x)))


torch.manual_seed(0)
m = Net().train()
m.qconfig = tq.get_default_qat_qconfig("fbgemm")
tq.prepare_qat(m, inplace=True)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    loss = m(torch.randn(256, 64)).square().mean()
    loss.backward()
    steps.record(step, loss, m, buffers=True)
    opt.step()
steps.save(sys.argv[1])
