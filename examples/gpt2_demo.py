"""The demo: a small GPT-2-style model (token/position embeddings, 4 pre-LN transformer blocks with
causal attention, MLP, LayerNorm, dropout) trained on random tokens. A plain PyTorch script:
memplan is not imported or mentioned; run it under tools/memplan-run to profile and plan it."""
import sys

import train

if __name__ == "__main__":
    sys.argv[1:1] = ["--model", "gpt2"]
    train.main()
