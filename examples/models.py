"""Small models for the demo, the tests and the benchmarks (random data; no downloads).

Every model maps a batch from make_batch() to a scalar loss with loss_fn(); all are deterministic
under torch.manual_seed with torch.use_deterministic_algorithms(True)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# A user's operator that draws from the default generator; its schema does not say so. Registered
# as CompositeImplicitAutograd (autograd through its body), so it is one dispatcher op that a
# rebuild re-runs.
_examples_lib = torch.library.Library("memplan_examples", "DEF")
_examples_lib.define("noisy(Tensor x) -> Tensor")
_examples_lib.impl("noisy", lambda x: x + 0.01 * torch.rand_like(x), "CompositeImplicitAutograd")


def noisy(x):
    return torch.ops.memplan_examples.noisy(x)


class TanhGelu(torch.autograd.Function):
    """GELU (tanh approximation) as a user's own autograd.Function, as fused kernels are often
    wrapped: one opaque op to memplan (no dispatcher operator it could call again). It saves its
    input and an intermediate made inside it."""

    @staticmethod
    def forward(ctx, x):
        t = torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
        ctx.save_for_backward(x, t)
        return 0.5 * x * (1 + t)

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.saved_tensors
        dt = (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x)
        return g * (0.5 * (1 + t) + 0.5 * x * dt)


class CustomGelu(nn.Module):
    def forward(self, x):
        return TanhGelu.apply(x)


class MLP(nn.Module):
    def __init__(self, d_in=256, hidden=1024, d_out=10, depth=4, detached_side=False):
        super().__init__()
        layers, d = [], d_in
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        layers.append(nn.Linear(d, d_out))
        self.net = nn.Sequential(*layers)
        if detached_side:
            self.side_bias = nn.Parameter(torch.zeros(hidden))
            self.side_proj = nn.Linear(hidden, d_in, bias=False)

    def forward(self, x):
        if getattr(self, "shared_layer", False):
            # The second layer applied twice: its weight gets two gradients, which the engine
            # sums between two backward nodes.
            h = self.net[:4](x)
            return self.net[4:](self.net[3](self.net[2](h)))
        keep = getattr(self, "row_keep", None)
        if keep is not None:
            # The rows a mask drawn from the data keeps, after the first layer: every later op
            # sees another number of rows each step.
            return self.net[2:](self.net[1](self.net[0](x))[keep])
        if not hasattr(self, "side_proj"):
            return self.net(x)
        # A side branch that reads the first layer's weight without grad (a stop-gradient use;
        # autograd saves none of it) and feeds the first layer's input. Its backward runs after
        # the first layer's, so after that weight's gradient is complete.
        side = torch.tanh(F.linear(x, self.net[0].weight.detach()) + self.side_bias)
        return self.net(x + self.side_proj(side))


class Attention(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        if getattr(self, "sdpa", False):
            # The fused op, its dropout inside: random with no Generator argument to say so.
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.drop.p if self.training else 0.0,
                                               is_causal=True)
            return self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, d)))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads, dropout)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x):
        if getattr(self, "index_copy", False):
            # An identity through index_copy, an op PyTorch lists as nondeterministic (writes in no
            # set order) unless deterministic algorithms are on; layer_norm saves its result.
            x = torch.zeros_like(x).index_copy(1, torch.arange(x.size(1), device=x.device), x)
        if getattr(self, "gumbel", False):
            # A straight-through Gumbel-softmax choice per position: noise drawn into
            # torch.empty_like with exponential_, a one-hot built in torch.zeros_like with scatter_
            # (factories below autograd, filled in place).
            x = x + F.gumbel_softmax(x, tau=0.5, hard=True) * x
        x = x + self.attn(self.ln1(x))
        side = getattr(self, "side_stream", None)
        if side is not None and x.is_cuda:
            # The MLP on a side stream (train.py --side-stream), ordered against the default stream
            # by waits both ways; its result, made there, is read on the default stream.
            main = torch.cuda.current_stream(x.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                m = self.mlp(self.ln2(x))
            main.wait_stream(side)
            m.record_stream(main)
            return x + m
        return x + self.mlp(self.ln2(x))


class GPT2(nn.Module):
    """GPT-2 style: token + position embeddings, pre-LN blocks with causal attention, tied head."""

    def __init__(self, vocab=512, d=128, heads=4, layers=4, seq=64, dropout=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.size(1)
        if getattr(self, "pos_first", False):
            # The position table sliced first (ViT's `pos_embed[:, :n]`): the step's first op
            # reads a parameter of a fixed shape, whatever the sequence length.
            x = self.drop(self.pos.weight[:t] + self.tok(idx))
        else:
            pos = torch.arange(t, device=idx.device)
            x = self.drop(self.tok(idx) + self.pos(pos))
        if getattr(self, "noisy_op", False) and self.training:
            x = noisy(x)
        copies = getattr(self, "side_copies", 0)
        if copies:
            # A scaled detached copy of the embeddings added back, made `copies` times (the
            # earlier ones unused): in some steps the same ops run more often, as a DataLoader's
            # batch hand-over can. A step with fewer of them runs the other's ops with a stretch
            # left out, and the greedy match takes its copy for the profile's unused one.
            for _ in range(copies - 1):
                x.detach() * 0.5
            x = x + x.detach() * 0.5
        if getattr(self, "stochastic_depth", False) and self.training:
            # torchvision's StochasticDepth(mode="row"): a noise tensor made by `empty`, then
            # written in place by bernoulli_ and div_ (ops a rebuild re-runs).
            noise = torch.empty(x.size(0), 1, 1, device=x.device).bernoulli_(0.9).div_(0.9)
            x = x * noise
        shift = getattr(self, "shift_mode", None)
        if shift:
            # A hand-kept running statistic: added, then updated in place within the forward.
            # Autograd saves nothing of it (add's backward needs neither input), so this is fine
            # in plain PyTorch; a recomputation of the add must still see the value it had here.
            x = x + self.shift
            with torch.no_grad():
                mean = x.mean(dim=(0, 1))
            if shift == "early":
                with torch.no_grad():
                    self.shift.mul_(0.5).add_(mean)
        blocks = self.blocks[:-1] if getattr(self, "skip_last_block", False) else self.blocks
        if getattr(self, "depth", None):
            blocks = self.blocks[: self.depth]
        if getattr(self, "repeat_last_block", False):
            blocks = list(blocks) + [self.blocks[-1]]
        if getattr(self, "dropped_blocks", None):
            blocks = [b for i, b in enumerate(blocks) if i not in self.dropped_blocks]
        for blk in blocks:
            x = blk(x)
        if shift == "late":  # at the end of the forward, after the blocks' values were evicted
            with torch.no_grad():
                self.shift.mul_(0.5).add_(mean)
        elif shift == "data":  # the same through .data, grad mode on: the version does not move
            self.shift.data.mul_(0.5).add_(mean)
        logits = self.head(self.ln(x))
        if shift == "backward" and logits.requires_grad:
            # In backward, from a hook, before the first block's values are rebuilt.
            def update(grad):
                with torch.no_grad():
                    self.shift.mul_(0.5).add_(mean)

            logits.register_hook(update)
        return logits


class CNN(nn.Module):
    def __init__(self, classes=10, width=32, hardswish=False, dropout=False, head_dropout=False):
        super().__init__()
        # head_dropout: in place on the flattened features, as EfficientNet's classifier has it (a
        # write through a view: autograd puts the dropout's node inside a CopySlices of the base).
        self.head_drop = nn.Dropout(0.2, inplace=True) if head_dropout else nn.Identity()
        w = width
        act = nn.Hardswish if hardswish else nn.ReLU
        # dropout: element-wise on the feature maps (4-D; channels-last in a channels-last model).
        drop = [nn.Dropout(0.1)] if dropout else []
        self.features = nn.Sequential(
            # In-place activations on the BatchNorm outputs, as torchvision's models have them
            # (hardswish: MobileNetV3's, whose in-place autograd saves a copy of its input).
            nn.Conv2d(3, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
            nn.Conv2d(w, w, 3, padding=1), nn.BatchNorm2d(w), act(inplace=True), nn.MaxPool2d(2), *drop,
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), act(inplace=True),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.BatchNorm2d(2 * w), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * w * 8 * 8, classes)

    def forward(self, x):
        return self.head(self.head_drop(torch.flatten(self.features(x), 1)))


class ViewsInplace(nn.Module):
    """Views and in-place ops everywhere: relu_, transpose, view, add_."""

    def __init__(self, d=128):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)
        self.c = nn.Linear(d, d)

    def forward(self, x):
        h = self.a(x)
        h.relu_()
        h = h.view(x.size(0), 4, -1).transpose(1, 2).reshape(x.size(0), -1)
        g = self.b(h)
        g.add_(h)
        g = torch.tanh(g).t().contiguous().t()
        return self.c(g)


class TiedTwoHeads(nn.Module):
    """Shared (tied) weights used twice and two outputs summed into one loss."""

    def __init__(self, vocab=256, d=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mid = nn.Linear(d, d)
        self.aux = nn.Linear(d, 1)

    def forward(self, idx):
        h = torch.tanh(self.mid(self.emb(idx)))
        h2 = torch.tanh(self.mid(h))  # self.mid used twice
        logits = h2 @ self.emb.weight.t()  # tied with the embedding
        return logits, self.aux(h).squeeze(-1)


class LSTMModel(nn.Module):
    def __init__(self, vocab=256, d=64, hidden=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, idx):
        out, _ = self.lstm(self.emb(idx))
        return self.head(out)


# torchvision's own models, unmodified (imported only when asked for: a CPU-only torch may come
# without torchvision), at 64x64 images: real architectures the zoo's models only imitate
# (squeeze-excitation, stochastic depth, channel shuffle, windowed attention, and DenseNet's
# memory-efficient mode, which checkpoints its own layers with torch.utils.checkpoint).
TORCHVISION = {
    "tv-resnet18": lambda M: M.resnet18(num_classes=10),
    "tv-mobilenet": lambda M: M.mobilenet_v3_small(num_classes=10),
    "tv-efficientnet": lambda M: M.efficientnet_b0(num_classes=10),
    "tv-shufflenet": lambda M: M.shufflenet_v2_x0_5(num_classes=10),
    "tv-regnet": lambda M: M.regnet_y_400mf(num_classes=10),
    "tv-vit": lambda M: M.VisionTransformer(image_size=64, patch_size=8, num_layers=3, num_heads=4, hidden_dim=64,
                                            mlp_dim=128, num_classes=10, dropout=0.1, attention_dropout=0.1),
    "tv-swin": lambda M: M.SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                                           window_size=[4, 4], stochastic_depth_prob=0.2, num_classes=10),
    "tv-densenet": lambda M: M.DenseNet(growth_rate=8, block_config=(2, 2, 2), num_init_features=16,
                                        memory_efficient=True, num_classes=10),
}
# Hugging Face transformers' own models, unmodified, built from small configs (no download):
# GPT-2, Llama (rotary positions, RMSNorm, SiLU gates, grouped-query attention), BERT as a masked
# LM, and Mixtral (mixture of experts: each expert's share of the tokens follows from the data).
# Dropout on wherever the config has it. Attention as HF's "eager" code, or with --sdpa its
# scaled_dot_product_attention. Imported only when asked for: transformers is optional.
HF_VOCAB = 1000


def _hf_config(name, d, layers):
    import transformers as T

    if name == "hf-gpt2":
        return T.GPT2LMHeadModel, T.GPT2Config(n_layer=layers, n_embd=d, n_head=4, n_positions=256,
                                               vocab_size=HF_VOCAB, use_cache=False)
    if name == "hf-llama":
        return T.LlamaForCausalLM, T.LlamaConfig(hidden_size=d, intermediate_size=d * 8 // 3, num_hidden_layers=layers,
                                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=HF_VOCAB,
                                                 max_position_embeddings=256, attention_dropout=0.1, use_cache=False)
    if name == "hf-bert":
        return T.BertForMaskedLM, T.BertConfig(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=layers,
                                               num_attention_heads=4, vocab_size=HF_VOCAB, max_position_embeddings=256)
    if name == "hf-mixtral":
        return T.MixtralForCausalLM, T.MixtralConfig(hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers,
                                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                                     num_experts_per_tok=2, vocab_size=HF_VOCAB,
                                                     max_position_embeddings=256, use_cache=False)
    raise ValueError(name)


HUGGINGFACE = ["hf-gpt2", "hf-llama", "hf-bert", "hf-mixtral"]


class HFLogits(nn.Module):
    """What a training loop does with a Hugging Face model: call it on the token ids, take the
    logits (the loss is the script's, as for every model here). The model itself is untouched."""

    def __init__(self, name, d, layers, sdpa):
        super().__init__()
        cls, cfg = _hf_config(name, d, layers)
        cfg._attn_implementation = "sdpa" if sdpa else "eager"
        self.hf = cls(cfg)

    def forward(self, ids):
        return self.hf(input_ids=ids).logits


ZOO = ["mlp", "gpt2", "cnn", "views", "tied", "lstm", *TORCHVISION, *HUGGINGFACE]


def build(name, small=False, shift_buffer=False, hardswish=False, stochastic_depth=False, sdpa=False,
          noisy_op=False, detached_side=False, custom_gelu=False, width=0, layers=0, seq=64, index_copy=False,
          dropout=False, head_dropout=False, gumbel=False):
    if name == "mlp":
        return MLP(hidden=256 if small else 1024, detached_side=detached_side)
    if name == "gpt2":
        d = width or (64 if small else 128)
        m = GPT2(layers=layers or (2 if small else 4), d=d, heads=max(4, d // 64), seq=seq)
        if shift_buffer:
            m.register_buffer("shift", torch.zeros(m.tok.embedding_dim))
            m.shift_mode = shift_buffer if isinstance(shift_buffer, str) else "early"
        m.stochastic_depth = stochastic_depth
        m.noisy_op = noisy_op
        for blk in m.blocks:
            blk.index_copy = index_copy
            blk.gumbel = gumbel
            blk.attn.sdpa = sdpa
            if custom_gelu:
                blk.mlp[1] = CustomGelu()
        return m
    if name == "cnn":
        return CNN(width=8 if small else 32, hardswish=hardswish, dropout=dropout, head_dropout=head_dropout)
    if name == "views":
        return ViewsInplace()
    if name == "tied":
        return TiedTwoHeads()
    if name == "lstm":
        return LSTMModel()
    if name in TORCHVISION:
        import torchvision.models
        return TORCHVISION[name](torchvision.models)
    if name in HUGGINGFACE:
        return HFLogits(name, width or (64 if small else 128), layers or (2 if small else 4), sdpa)
    raise ValueError(f"unknown model {name!r}; one of {ZOO}")


def make_batch(name, step, batch=8, seq=64, gen=None, seq_len=None):
    """A deterministic random batch for `step` (its own generator: the model's RNG stream
    - dropout - is not disturbed)."""
    g = torch.Generator().manual_seed(1000 + step)
    t = seq_len or seq
    if name == "mlp":
        return torch.randn(batch * 64, 256, generator=g), torch.randint(0, 10, (batch * 64,), generator=g)
    if name in HUGGINGFACE:
        return (torch.randint(0, HF_VOCAB, (batch, t), generator=g),
                torch.randint(0, HF_VOCAB, (batch, t), generator=g))
    if name in ("gpt2",):
        # Factory calls only (no slicing): the batch is made before the step's first op.
        return torch.randint(0, 512, (batch, t), generator=g), torch.randint(0, 512, (batch, t), generator=g)
    if name == "cnn":
        return torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    if name in TORCHVISION:
        return torch.randn(batch, 3, 64, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)
    if name == "views":
        return torch.randn(batch * 4, 128, generator=g), torch.randn(batch * 4, 128, generator=g)
    if name in ("tied", "lstm"):
        x = torch.randint(0, 256, (batch, 32 if seq_len is None else t), generator=g)
        return x, torch.randint(0, 256, x.shape, generator=g)
    raise ValueError(name)


def loss_fn(name, out, y):
    if name in ("mlp", "cnn") or name in TORCHVISION:
        return F.cross_entropy(out, y)
    if name in ("gpt2", "lstm") or name in HUGGINGFACE:
        return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
    if name == "views":
        return F.mse_loss(out, y)
    if name == "tied":
        logits, aux = out
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)) + aux.pow(2).mean()
    raise ValueError(name)
