"""A training script with an LSTM over packed padded sequences, `out, _ = lstm(packed)`, and an
MLP over its outputs. The sequences are sorted by length (enforce_sorted=False), so the unsorted
indices are saved by three index_select nodes: those of the hidden and cell states, which die
when `_` is dropped, and that of the padded output. argv[1]: where to save the losses and
gradients. For test_replay.py: the record counts only the live pack handles of the indices, and
the step is planned (before, the dead handles were subtracted too, the indices looked freed
before backward, and no plan was made)."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_dump import StepDump
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(32, 128, batch_first=True)
        self.mlp = nn.ModuleList([nn.Linear(128 if i == 0 else 512, 512) for i in range(4)])
        self.head = nn.Linear(512, 8)

    def forward(self, x, lengths):
        out, _ = self.lstm(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        for layer in self.mlp:
            h = F.gelu(layer(h))
        return self.head(h)


torch.manual_seed(0)
model = Tagger()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
lengths = torch.randint(8, 33, (32,), generator=torch.Generator().manual_seed(7))
steps = StepDump()
for step in range(10):
    opt.zero_grad()
    x = torch.randn(32, 32, 32, generator=torch.Generator().manual_seed(1000 + step))
    loss = model(x, lengths).square().mean()
    loss.backward()
    steps.record(step, loss, model)
    opt.step()
steps.save(sys.argv[1])
