"""A small GPT-like training loop for tools/gpu_check.sh, run under memplan-run.

Prints, for each step, the allocator's peak over the window the agent records (first forward op
to the end of backward): `reset_peak_memory_stats` just before the forward, `max_memory_allocated`
just after backward, before the optimizer. The line `MAX_MEMORY_ALLOCATED <bytes>` is for the step
whose profile the agent writes (the last warm-up step, MEMPLAN_WARMUP - 1).

    memplan-run python tests/gpu/profile_check.py [--device cpu|cuda] [--steps N]
On the CPU (no GPU here) it only shows the loop runs; MAX_MEMORY_ALLOCATED is then -1.
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        # Explicit attention (not SDPA): more distinct ops and saved activations to time.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        mask = torch.ones(t, t, device=x.device, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    vocab = 2048
    model = GPT(vocab, args.dim, 8, args.layers, args.seq).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, vocab, (args.batch, args.seq), device=dev)
    tgt = torch.randint(0, vocab, (args.batch, args.seq), device=dev)
    warmup = int(os.environ.get("MEMPLAN_WARMUP", "2") or 2)
    profiled = warmup - 1
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = model(idx, tgt)
        loss.backward()
        peak = -1
        if cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        dt = (time.perf_counter() - t0) * 1e3
        opt.step()
        print(f"STEP {step} loss {loss.item():.4f} fwd+bwd {dt:.1f} ms peak {peak}", flush=True)
        if step == profiled:
            print(f"MAX_MEMORY_ALLOCATED {peak}", flush=True)


if __name__ == "__main__":
    main()
