"""A plain training script over the model zoo (examples/models.py): what memplan must run
unchanged. Everything memplan-specific lives outside; the flags only select what the script does,
as a user's script would (gradient accumulation, eval loops, torch.profiler, checkpointing...).

stdout: one line per optimizer step, "step <i> loss <repr>", and nothing else unless asked."""
import argparse
import contextlib
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp", choices=models.ZOO)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", action="store_true")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--width", type=int, default=0,
                   help="GPT-2 (and hf-*): model width (default 128; heads: width/64, at least 4); with --layers and "
                        "--seq, a size where a GPU's kernels, not its launches, take the step's time")
    p.add_argument("--layers", type=int, default=0, help="GPT-2 and hf-*: number of blocks (default 4)")
    p.add_argument("--seq", type=int, default=64, help="GPT-2: sequence length (and position table size)")
    p.add_argument("--accum", type=int, default=1, help="forward/backward passes per optimizer step")
    p.add_argument("--eval-every", type=int, default=0, help="a torch.no_grad() eval pass every N steps")
    p.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around each GPT-2 block (hf-*: the model's own "
                        "gradient_checkpointing_enable())")
    p.add_argument("--sac", nargs="?", const="default", choices=["default", "respect"],
                   help="GPT-2: selective activation checkpointing around each block (matrix products saved, the rest "
                        "recomputed); respect: with respect_saved_tensors_hooks=True")
    p.add_argument("--torch-profiler", action="store_true", help="run step 1 under torch.profiler.profile()")
    p.add_argument("--torch-profiler-step", type=int, default=-1,
                   help="run this step under torch.profiler.profile() and print the op names it saw (stderr)")
    p.add_argument("--optimizer-raises-at", type=int, default=-1,
                   help="the optimizer step of this step raises (a pre-hook); the script goes on")
    p.add_argument("--backward-raises-at", type=int, default=-1,
                   help="the backward of this step raises before reaching the model (a hook on its "
                        "output); the script goes on to the next step")
    p.add_argument("--backward-in-user-hooks", action="store_true",
                   help="call backward inside the script's own saved_tensors_hooks (pass-through)")
    p.add_argument("--log-grads", action="store_true",
                   help="keep a clone of every gradient after each step (grad mode on)")
    p.add_argument("--log-grads-until", type=int, default=-1,
                   help="--log-grads after the optimizer steps before this step only")
    p.add_argument("--zero-grad-late", action="store_true",
                   help="zero the gradients after the first micro-step's forward, before its backward")
    p.add_argument("--grad-probe", action="store_true",
                   help="multiply the (float) input by a leaf of the script's own that requires grad "
                        "and is never zeroed")
    p.add_argument("--autocast", action="store_true", help="forward under torch.autocast (bfloat16)")
    p.add_argument("--func", action="store_true", help="call a torch.func transform each step")
    p.add_argument("--user-hooks", action="store_true",
                   help="compute the loss under the script's own saved_tensors_hooks; print how many packs they saw")
    p.add_argument("--inplace-error", action="store_true", help="modify a saved tensor in place (autograd error)")
    p.add_argument("--seq-change-at", type=int, default=-1, help="GPT-2: sequence length changes from this step")
    p.add_argument("--skip-block-at", type=int, default=-1,
                   help="GPT-2: the forward skips its last block from this step (the op sequence changes "
                        "after the step's first op)")
    p.add_argument("--repeat-block-at", type=int, default=-1,
                   help="GPT-2: the forward runs its last block a second time from this step (ops added in "
                        "the middle of the step)")
    p.add_argument("--log-params-before-step", action="store_true",
                   help="keep a copy of every parameter, made between backward and the optimizer step")
    p.add_argument("--side-stream", action="store_true",
                   help="GPT-2 on CUDA: each block's MLP runs on a side stream of its own (waits both ways)")
    p.add_argument("--sdpa", action="store_true",
                   help="GPT-2: F.scaled_dot_product_attention with its dropout (random, no Generator argument); "
                        "hf-*: the model's sdpa attention (else its eager one)")
    p.add_argument("--noisy-op", action="store_true",
                   help="GPT-2: a torch.library op that adds torch.rand_like noise (random, undeclared)")
    p.add_argument("--hardswish", action="store_true", help="CNN: in-place Hardswish activations (MobileNetV3's)")
    p.add_argument("--head-dropout", action="store_true",
                   help="CNN: in-place dropout on the flattened features before the head (EfficientNet's)")
    p.add_argument("--cnn-dropout", action="store_true",
                   help="CNN: element-wise dropout on the feature maps after the first pooling (4-D; channels-last "
                        "with --channels-last)")
    p.add_argument("--stochastic-depth", action="store_true",
                   help="GPT-2: a row-wise stochastic-depth noise (empty, bernoulli_, div_) on the embeddings")
    p.add_argument("--shift-buffer", nargs="?", const="early", choices=["early", "late", "data", "backward"],
                   help="GPT-2: a buffer added to the embeddings and updated in place in the same step, "
                        "under no_grad right after (early) or after the blocks (late), through .data "
                        "after the blocks (data), or from a hook in backward (backward)")
    p.add_argument("--seq-cycle", default="",
                   help="GPT-2: comma-separated sequence lengths, one per forward/backward in turn (with "
                        "--accum 2 and two lengths: two kinds of step that alternate)")
    p.add_argument("--seq-random", default="",
                   help="GPT-2: comma-separated sequence lengths, one drawn per forward/backward from a "
                        "fixed pseudo-random sequence (buckets in random order)")
    p.add_argument("--depth-random", action="store_true",
                   help="GPT-2: each step runs a pseudo-random number of its blocks (LayerDrop-like: "
                        "steps alike at their start, of different op sequences)")
    p.add_argument("--layerdrop", type=float, default=0.0,
                   help="GPT-2: each step skips each block with this probability, independently (fairseq's "
                        "LayerDrop; pseudo-random, the same every run)")
    p.add_argument("--pos-first", action="store_true",
                   help="GPT-2: the position table sliced before the token embedding, so that the "
                        "step's first op reads a fixed-shape parameter whatever the length")
    p.add_argument("--masked-loss", action="store_true",
                   help="GPT-2: the loss over a random 15%% of the positions each step (a boolean mask "
                        "index, whose output size depends on the data)")
    p.add_argument("--shared-layer", action="store_true", help="MLP: the second layer applied twice")
    p.add_argument("--drop-rows", action="store_true",
                   help="MLP: after the first layer, keep a random 80%% of the rows (a boolean mask "
                        "index: the later layers see another number of rows each step)")
    p.add_argument("--optimizer-in-backward", action="store_true",
                   help="one Adam per parameter, stepped from its post-accumulate-grad hook (PyTorch's "
                        "optimizer-in-backward recipe); no optimizer step after backward")
    p.add_argument("--release-params", action="store_true",
                   help="MLP: the first layer's weight storage released after its forward and "
                        "restored just before its backward, as FSDP2 reshards a block's parameters")
    p.add_argument("--detached-side", action="store_true",
                   help="MLP: a side branch reads the first layer's weight without grad")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers (forked)")
    p.add_argument("--side-copies-until", type=int, default=-1,
                   help="GPT-2: a detached copy of the embeddings added back, made twice (one unused) "
                        "before this step, once from it")
    p.add_argument("--side-thread", action="store_true",
                   help="a thread running tensor ops and its own small backward beside training")
    p.add_argument("--backward-on-two-threads", action="store_true",
                   help="the loss's backward runs a second graph's backward on another thread (as a graph "
                        "with nodes on the CPU and a GPU runs them on two engine threads)")
    p.add_argument("--train-thread", action="store_true",
                   help="build the model and train on a thread of its own, as Ray Train runs the training function")
    p.add_argument("--dump", help="torch.save losses, every gradient and every buffer of every step here")
    p.add_argument("--profile-step", type=int, default=-1,
                   help="write top-level forward op names and the memory peak of this step (torch.profiler)")
    p.add_argument("--saved-bytes-step", type=int, default=-1,
                   help="print the bytes autograd saved in this step, from grad_fn._saved_* (needs no agent)")
    p.add_argument("--times", help="write per-step wall times (seconds, JSON list) here")
    p.add_argument("--distributed", action="store_true", help="init gloo process group (torchrun)")
    p.add_argument("--fsdp", action="store_true",
                   help="with --distributed: FSDP2 (fully_shard per block and the model) instead of DDP; "
                        "parameters are all-gathered before each block's forward and backward, freed after")
    p.add_argument("--device", default="cpu")
    p.add_argument("--nondeterministic", action="store_true",
                   help="leave torch.use_deterministic_algorithms off (on by default, for bit-identical checks)")
    p.add_argument("--index-copy", action="store_true",
                   help="GPT-2: each block starts with an identity through index_copy (nondeterministic "
                        "unless deterministic algorithms are on)")
    p.add_argument("--gumbel", action="store_true",
                   help="GPT-2: each block starts with a straight-through Gumbel-softmax choice (F.gumbel_softmax, "
                        "hard): noise drawn into a factory's tensor in place")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (Inductor)")
    p.add_argument("--compile-mlp", action="store_true",
                   help="GPT-2: torch.compile each block's MLP only (Inductor); the rest stays eager")
    p.add_argument("--custom-gelu", action="store_true",
                   help="GPT-2: GELU as the script's own torch.autograd.Function (an op memplan cannot re-run)")
    p.add_argument("--channels-last", action="store_true",
                   help="CNNs: model and images in channels-last memory format")
    p.add_argument("--clip-grad", action="store_true",
                   help="torch.nn.utils.clip_grad_norm_ between the backward and the optimizer step")
    p.add_argument("--backward-twice", action="store_true",
                   help="loss.backward(retain_graph=True), then a second backward of the same graph")
    p.add_argument("--autograd-grad", action="store_true",
                   help="gradients by torch.autograd.grad, set into .grad by the script")
    p.add_argument("--grad-penalty", action="store_true",
                   help="loss plus the squared norm of its gradient wrt the model's output (create_graph)")
    p.add_argument("--weight-norm", action="store_true",
                   help="weight normalization (torch.nn.utils.parametrizations) on every Linear and Conv2d: "
                        "each forward makes the weights from two parameters")
    p.add_argument("--spectral-norm", action="store_true",
                   help="spectral normalization on every Linear: each training forward writes its power "
                        "iteration's buffers in place")
    p.add_argument("--adversarial", nargs="?", const="same", choices=["same", "shorter"],
                   help="float inputs: an FGSM step first (a forward, the gradient wrt the input by "
                        "torch.autograd.grad), then the step on the perturbed input; 'same': the attack's "
                        "forward runs the step's ops, 'shorter': its loss is not divided by --accum (one op fewer)")
    p.add_argument("--grad-scaler", action="store_true",
                   help="torch.amp.GradScaler: the loss scaled before backward, the optimizer stepped by the scaler")
    p.add_argument("--gan", action="store_true",
                   help="a GAN's steps (float-input models): a generator made here draws fake inputs; the "
                        "model, as the discriminator, learns from real and detached fake ones (a backward "
                        "and an optimizer step of its own), then the generator through the model on the same "
                        "fakes: the generator's forward runs before the first backward and is read by the "
                        "second. With --accum, each micro-step is such a pair")
    return p.parse_args()


def saved_bytes(loss):
    """Bytes of distinct storages autograd saved, walking grad_fn._saved_* (independent of memplan)."""
    seen, total, stack, nodes = set(), 0, [loss.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in nodes:
            continue
        nodes.add(fn)
        for name in dir(fn):
            if not name.startswith("_saved_"):
                continue
            vals = getattr(fn, name)
            for v in vals if isinstance(vals, (tuple, list)) else [vals]:
                # Python scalars become 0-dim "wrapped number" tensors (int64/float64) that
                # autograd keeps without calling the saved-tensor hooks: not activation memory.
                if isinstance(v, torch.Tensor) and not (v.dim() == 0 and v.dtype in (torch.int64, torch.float64)):
                    st = v.untyped_storage()
                    if st.data_ptr() not in seen:
                        seen.add(st.data_ptr())
                        total += st.nbytes()
        stack.extend(f for f, _ in fn.next_functions)
    return total


BACKWARD_RANGE = "train.py: backward"  # around the profiled step's backward call


def top_level_forward_ops(prof):
    """Names of the ops the user dispatched, in order, before the backward call (BACKWARD_RANGE:
    its gradient seed, ones_like(loss), is no op of the forward): those with autograd
    (sequence_nr >= 0) and the factories below it (torch.ones, arange: aten ops with no number),
    each with no such ancestor."""
    names = []
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    end = min((e.time_range.start for e in events if e.name == BACKWARD_RANGE), default=float("inf"))
    for e in events:
        if e.time_range.start >= end:
            break
        if e.name.startswith("autograd::engine") or e.name.startswith("[memory]"):
            continue
        numbered = getattr(e, "sequence_nr", -1) >= 0
        if not (numbered or e.name.startswith("aten::")) or e.is_async:
            continue
        p, nested = e.cpu_parent, False
        while p is not None:
            if (getattr(p, "sequence_nr", -1) >= 0 or p.name.startswith("autograd::engine")
                    or p.name.startswith("aten::")):
                nested = True
                break
            p = p.cpu_parent
        if not nested and not e.name.startswith("aten::item") and e.name != "aten::_local_scalar_dense":
            names.append(e.name)
    return names


def memory_peak(prof):
    """Peak of (allocated - allocated at start) over the profiled region, from [memory] records."""
    evs = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    evs.sort(key=lambda e: e.start_ns())
    cur = peak = 0
    for e in evs:
        if e.device_type() == torch.autograd.DeviceType.CPU:
            cur += e.nbytes()
            peak = max(peak, cur)
    return peak


class BackwardOnAnotherThread(torch.autograd.Function):
    """Identity on the loss, whose backward runs the backward of a second graph (built here, by
    the training thread) on a new thread and waits for it: nodes of the training thread's graphs
    run on two threads, as the autograd engine runs a graph with nodes on the CPU and on a GPU."""

    @staticmethod
    def forward(ctx, loss, w):
        with torch.enable_grad():
            ctx.aux = (w * 2.0).tanh().sum()
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):
        import threading

        t = threading.Thread(target=ctx.aux.backward)
        t.start()
        t.join()
        return grad, None


def backward(args, model, out, loss):
    """The step's backward, as the flags ask."""
    if args.grad_penalty:
        # A gradient penalty (WGAN-GP style): the gradient wrt the output, made with a graph of its
        # own, enters the loss; its backward runs the forward's saved tensors twice (double backward).
        first = out[0] if isinstance(out, tuple) else out
        (g,) = torch.autograd.grad(loss, first, create_graph=True)
        loss = loss + 1e-3 * g.pow(2).sum()
    if args.backward_twice:
        # Two passes through one graph: every saved tensor is read twice, the gradients add up.
        loss.backward(retain_graph=True)
        (loss * 0.5).backward()
    elif args.autograd_grad:
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for p, g in zip(params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
    else:
        loss.backward()


def parametrize(model, weight_norm, spectral_norm):
    """Weight or spectral normalization on the model's layers; a weight another module shares
    (tied) is left as it is."""
    from torch.nn.utils import parametrizations

    kinds = (torch.nn.Linear, torch.nn.Conv2d) if weight_norm else (torch.nn.Linear,)
    owners = {}
    for m in model.modules():
        if isinstance(getattr(m, "weight", None), torch.nn.Parameter):
            owners.setdefault(id(m.weight), []).append(m)
    for m in list(model.modules()):
        if isinstance(m, kinds) and len(owners.get(id(m.weight), [])) == 1:
            if weight_norm:
                parametrizations.weight_norm(m)
            else:
                parametrizations.spectral_norm(m)


def fgsm(args, model, x, y):
    """The fast gradient sign method: x moved by the sign of the loss's gradient wrt x (a
    backward that reaches no parameter's AccumulateGrad)."""
    xa = x.detach().requires_grad_(True)
    loss = models.loss_fn(args.model, model(xa), y)
    (gx,) = torch.autograd.grad(loss / args.accum if args.adversarial == "same" else loss, xa)
    return (x + 1e-2 * gx.sign()).detach()


def make_generator(x):
    """The GAN's generator: noise of 64 features to one fake input shaped as x's rows."""
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, x[0].numel()), torch.nn.Tanh()).to(x.device)


def gan_step(model, gen, opt, opt_g, x, draw):
    """One GAN step, non-saturating loss; returns the two losses' sum. The generator's forward is
    saved for the second backward, across the first (the discriminator's, which reads detached
    fakes) and its optimizer step."""
    g = torch.Generator().manual_seed(9_000 + draw)
    fake = gen(torch.randn(x.shape[0], 64, generator=g).to(x.device)).reshape(x.shape)
    score = lambda out: out.float().flatten(1).mean(1)  # noqa: E731
    opt.zero_grad(set_to_none=True)
    d_loss = (torch.nn.functional.softplus(-score(model(x))).mean()
              + torch.nn.functional.softplus(score(model(fake.detach()))).mean())
    d_loss.backward()
    opt.step()
    opt_g.zero_grad(set_to_none=True)
    g_loss = torch.nn.functional.softplus(-score(model(fake))).mean()
    g_loss.backward()  # the discriminator's gradients too: dumped, zeroed by its next step
    opt_g.step()
    return d_loss.item() + g_loss.item()


def start_side_thread():
    """A thread that keeps running tensor ops with grad mode on, and now and then a backward of
    its own, while the main thread trains (as a prefetch or metrics thread would). It shares
    nothing with the model. Returns the function that stops it and waits for it (a daemon thread
    left inside a backward at interpreter exit aborts the process: "terminate called without an
    active exception", seen without --dump, whose save otherwise gave it the time to finish)."""
    import threading

    stop = threading.Event()

    def work():
        t = torch.ones(64, 64)
        w = torch.ones(64, requires_grad=True)
        while not stop.is_set():
            for _ in range(20):
                t = (t * 0.5 + 0.5).tanh()
            (w * t[0]).sum().backward()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()

    def stop_and_join():
        stop.set()
        thread.join()

    return stop_and_join


class Loader(torch.utils.data.Dataset):
    def __init__(self, name, steps, args):
        self.name, self.steps, self.args = name, steps, args

    def __len__(self):
        return self.steps * self.args.accum

    def __getitem__(self, i):
        seq = 32 if (self.args.seq_change_at >= 0 and i // self.args.accum >= self.args.seq_change_at) else None
        if self.args.seq_cycle:
            lengths = [int(n) for n in self.args.seq_cycle.split(",")]
            seq = lengths[i % len(lengths)]
        if self.args.seq_random:
            lengths = [int(n) for n in self.args.seq_random.split(",")]
            seq = lengths[random.Random(1000 + i).randrange(len(lengths))]
        return models.make_batch(self.name, i, batch=self.args.batch, seq=self.args.seq, seq_len=seq)


def release_after_forward(w, module):
    """FSDP2's resharding, by hand: after `module`'s forward the storage of its parameter `w` is
    freed (resized to 0), and filled again (the same values, the version kept) when the gradient
    of the module's output arrives, just before its own backward."""
    kept = {}

    def restore(grad):
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(w):
            w.untyped_storage().resize_(kept["w"].numel() * kept["w"].element_size())
            w.copy_(kept.pop("w"))

    def release(mod, inputs, out):
        if not torch.is_grad_enabled():
            return
        kept["w"] = w.detach().clone()
        w.untyped_storage().resize_(0)
        out.register_hook(restore)

    module.register_forward_hook(release)


def sac_wrapped(forward, respect):
    """forward under selective activation checkpointing, as a user sets it up: the outputs of
    matrix products saved, everything else recomputed in backward."""
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    saved = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    extra = {"respect_saved_tensors_hooks": True} if respect else {}
    context = functools.partial(create_selective_checkpoint_contexts, policy)
    return lambda x: checkpoint(forward, x, use_reentrant=False, context_fn=context, **extra)


def main():
    args = parse()
    if args.distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    if args.device.startswith("cuda"):
        # Deterministic cuBLAS (required by use_deterministic_algorithms); read at its first handle.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(not args.nondeterministic)
    model = models.build(args.model, small=args.small, shift_buffer=args.shift_buffer,
                         hardswish=args.hardswish, stochastic_depth=args.stochastic_depth,
                         sdpa=args.sdpa, noisy_op=args.noisy_op,
                         detached_side=args.detached_side, custom_gelu=args.custom_gelu,
                         width=args.width, layers=args.layers, seq=args.seq,
                         index_copy=args.index_copy, dropout=args.cnn_dropout, head_dropout=args.head_dropout,
                         gumbel=args.gumbel).to(args.device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if args.weight_norm or args.spectral_norm:
        parametrize(model, args.weight_norm, args.spectral_norm)
    if args.distributed and args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for blk in model.blocks:
            fully_shard(blk)
        fully_shard(model)
    elif args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    if args.compile:
        model = torch.compile(model)
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile's wrapper
    if args.compile_mlp and hasattr(inner, "blocks"):
        for blk in inner.blocks:  # as a user compiles the part they care about
            blk.mlp = torch.compile(blk.mlp)
    if args.checkpoint and isinstance(inner, models.HFLogits):
        inner.hf.gradient_checkpointing_enable()  # as a user of transformers would
    elif args.checkpoint:
        from torch.utils.checkpoint import checkpoint

        for blk in inner.blocks:
            blk.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(blk.forward)
    if args.sac and hasattr(inner, "blocks"):
        for blk in inner.blocks:
            blk.forward = sac_wrapped(blk.forward, respect=args.sac == "respect")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # (An optimizer stepped in backward would step on scaled gradients: no scaler with it.)
    scaler = (torch.amp.GradScaler(torch.device(args.device).type)
              if args.grad_scaler and not args.optimizer_in_backward else None)
    inner.shared_layer = args.shared_layer  # read by the module's forward, not by a DDP wrapper
    if args.side_stream:
        if torch.device(args.device).type != "cuda" or args.model != "gpt2":
            print("train: --side-stream needs --model gpt2 on a CUDA device; ignored", file=sys.stderr)
        else:
            for blk in inner.blocks:
                blk.side_stream = torch.cuda.Stream(torch.device(args.device))
    inner.pos_first = args.pos_first
    if args.release_params:
        release_after_forward(inner.net[0].weight, inner.net[0])
    if args.optimizer_in_backward:
        # Each parameter is updated as soon as its gradient is complete, in backward: the
        # parameters change while the step still runs (its gradients stay, for the dump).
        per_param = {p: torch.optim.Adam([p], lr=1e-3) for p in model.parameters()}
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda q: per_param[q].step())
    current = {"step": 0}
    if args.optimizer_raises_at >= 0:
        def refuse(o, a, k):
            if current["step"] == args.optimizer_raises_at:
                raise RuntimeError("optimizer step refused")

        opt.register_step_pre_hook(refuse)
    data = torch.utils.data.DataLoader(Loader(args.model, args.steps, args), batch_size=None,
                                       num_workers=args.workers)
    it = iter(data)
    side = start_side_thread() if args.side_thread else None
    # --backward-on-two-threads: the leaf of its own little graph
    aux_w = torch.ones(8, requires_grad=True) if args.backward_on_two_threads else None
    record = {"loss": [], "grads": [], "buffers": []}
    logged = []
    # --grad-probe: a leaf of the script's own that requires grad, outside the optimizer: its
    # gradient accumulates from the first backward on and is never reset.
    probe = torch.ones((), requires_grad=True) if args.grad_probe else None
    times = []
    user_prof = None
    gen = opt_g = None
    for step in range(args.steps):
        t0 = time.perf_counter()
        current["step"] = step
        if args.side_copies_until >= 0:
            inner.side_copies = 2 if step < args.side_copies_until else 1
        if args.skip_block_at >= 0:
            inner.skip_last_block = step >= args.skip_block_at
        if args.repeat_block_at >= 0:
            inner.repeat_last_block = step >= args.repeat_block_at
        if args.layerdrop > 0:
            draw = random.Random(4000 + 1000 * args.seed + step)
            inner.dropped_blocks = {i for i in range(len(inner.blocks)) if draw.random() < args.layerdrop}
        if args.depth_random:
            inner.depth = random.Random(2000 + step).randrange(1, len(inner.blocks) + 1)
        if not args.zero_grad_late:
            opt.zero_grad(set_to_none=True)
        total = 0.0
        for micro in range(args.accum):
            x, y = next(it)
            prof = None
            if step == args.profile_step and micro == 0:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                              profile_memory=True, record_shapes=True)
                prof.__enter__()
            elif ((args.torch_profiler and step == 1) or step == args.torch_profiler_step) and micro == 0:
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                prof.__enter__()
            x, y = x.to(args.device), y.to(args.device)
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            if args.adversarial:
                x = fgsm(args, model, x, y)
            if args.gan:
                if gen is None:
                    gen = make_generator(x)
                    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
                total += gan_step(model, gen, opt, opt_g, x, step * args.accum + micro)
                del x, y
                continue
            if args.masked_loss:
                g = torch.Generator().manual_seed(7_000 + step * args.accum + micro)
                keep = (torch.rand(y.shape, generator=g) < 0.15).to(args.device)
            if args.drop_rows:
                g = torch.Generator().manual_seed(8_000 + step * args.accum + micro)
                keep = (torch.rand(y.shape, generator=g) < 0.8).to(args.device)
                inner.row_keep, y = keep, y[keep]
            with (torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16) if args.autocast
                  else contextlib.nullcontext()):
                out = model(x * probe if probe is not None else x)  # (x * 1.0 is x, bit for bit)
            if args.autocast:
                out = out.float()
            user_packs = [0, 0]  # packs, unpacks seen by the script's own hooks

            def user_pack(t):
                user_packs[0] += 1
                return t

            def user_unpack(t):
                user_packs[1] += 1
                return t

            # --user-hooks: only the loss, so the model's own activations stay with memplan.
            with (torch.autograd.graph.saved_tensors_hooks(user_pack, user_unpack) if args.user_hooks
                  else contextlib.nullcontext()):
                if args.masked_loss:
                    loss = torch.nn.functional.cross_entropy(out[keep], y[keep]) / args.accum
                else:
                    loss = models.loss_fn(args.model, out, y) / args.accum
            if scaler is not None:
                loss = scaler.scale(loss)
            if args.backward_on_two_threads:
                loss = BackwardOnAnotherThread.apply(loss, aux_w)
            if args.inplace_error and step == 1:
                # exp saves its result; modifying it in place must fail in backward
                h = (out[0] if isinstance(out, tuple) else out).exp()
                h.add_(1)
                loss = loss + h.mean()
            if args.zero_grad_late and micro == 0:
                opt.zero_grad(set_to_none=True)  # between the forward and the backward
            if step == args.saved_bytes_step and micro == 0:
                print(f"SAVED_BYTES {saved_bytes(loss)}")
            if step == args.backward_raises_at and micro == 0:
                def refuse_backward(g):
                    raise RuntimeError("backward refused")

                (out[0] if isinstance(out, tuple) else out).register_hook(refuse_backward)
            try:
                with (torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
                      if args.backward_in_user_hooks else contextlib.nullcontext()), \
                     (torch.autograd.profiler.record_function(BACKWARD_RANGE)
                      if prof is not None and step == args.profile_step else contextlib.nullcontext()):
                    backward(args, model, out, loss)
            except RuntimeError as e:
                if "backward refused" not in str(e):
                    raise
                print(f"step {step}: backward refused", file=sys.stderr)
            if args.user_hooks:
                print(f"step {step} user hooks: {user_packs[0]} packs, {user_packs[1]} unpacks")
            if step == args.torch_profiler_step and prof is not None:
                user_prof, prof = prof, None  # also around the optimizer step
            if prof is not None:
                prof.__exit__(None, None, None)
                if step == args.profile_step:
                    print("FORWARD_OPS " + json.dumps(top_level_forward_ops(prof)))
                    print(f"PROFILER_PEAK {memory_peak(prof)}")
                else:
                    print(f"user profiler saw {len(prof.events())} events", file=sys.stderr)
            if args.func:
                w = torch.randn(5)
                g = torch.func.grad(lambda v: (v.sin() * w).sum())(torch.randn(5))
                assert g.shape == (5,)
            total += loss.item() / (scaler.get_scale() if scaler is not None else 1.0)
            # Drop this micro-step's tensors now rather than when the next one rebinds the names,
            # so each step's memory starts from the same state (what torch.profiler measures).
            del x, y, out, loss
        if args.log_params_before_step:
            # Parameter copies between backward and the optimizer step (grad mode on):
            # `p.detach()` reads a tensor that requires grad, so the next step's window opens here
            # and holds the optimizer step, whose first call makes Adam's state. (Grad copies
            # would not: they read nothing that requires grad.)
            logged.append([p.detach().clone() for p in model.parameters()])
        if args.clip_grad:
            if scaler is not None:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        # (After a refused backward no parameter has a gradient: the scaler has nothing to check.)
        scaled = scaler is not None and any(p.grad is not None for p in model.parameters())
        try:
            if scaled:
                scaler.step(opt)
            elif scaler is None and not args.optimizer_in_backward and not args.gan:
                opt.step()
        except RuntimeError as e:
            if "optimizer step refused" not in str(e):
                raise
            print(f"step {step}: optimizer step refused", file=sys.stderr)
        finally:
            if scaled:
                scaler.update()
        if user_prof is not None:
            user_prof.__exit__(None, None, None)
            print("USER_PROFILER_OPS " + json.dumps(sorted({e.name for e in user_prof.events()})), file=sys.stderr)
            user_prof = None
        if args.log_grads or step < args.log_grads_until:
            # A user's own logging, with grad mode on, between this backward and the next forward:
            # a statistic of each parameter (it reads a tensor that requires grad, so the next
            # step's window opens here) and a copy of each gradient.
            logged.append([(p.detach().abs().max(), p.grad.clone()) for p in model.parameters()
                           if p.grad is not None])
        if args.eval_every and step % args.eval_every == 0:
            with torch.no_grad():
                x, _ = models.make_batch(args.model, 10_000 + step, batch=args.batch, seq=args.seq)
                model(x.to(args.device))
        times.append(time.perf_counter() - t0)
        print(f"step {step} loss {total!r}", flush=True)
        if args.dump:
            with torch.no_grad():
                record["loss"].append(torch.tensor(total))
                # FSDP2's gradients are DTensors: this rank's shard.
                local = lambda t: t.to_local() if hasattr(t, "to_local") else t
                record["grads"].append({n: local(p.grad).detach().clone() for n, p in model.named_parameters()
                                        if p.grad is not None})
                if gen is not None:
                    record["grads"][-1].update({"gen." + n: p.grad.detach().clone()
                                                for n, p in gen.named_parameters() if p.grad is not None})
                # Buffers too: BatchNorm's running statistics are part of the result.
                record["buffers"].append({n: b.detach().clone() for n, b in model.named_buffers()})
    if side is not None:
        side()
    if args.dump:
        # One file per rank: their gradients differ under FSDP, and two writers of one file race.
        torch.save(record, f"{args.dump}.rank{torch.distributed.get_rank()}" if args.distributed else args.dump)
    if args.times:
        with open(args.times, "w") as f:
            json.dump(times, f)
    if args.distributed:
        # PyTorch's documented shutdown: without it gloo's worker threads may still be alive at
        # interpreter exit and abort the process ("terminate called without an active exception").
        # The barrier first: a rank that tears its group down while the other still talks to it
        # aborts the same way (1 run in 16 without memplan, before the barrier).
        dist.barrier()
        dist.destroy_process_group()


def run_on_thread(fn):
    """Runs fn on a new thread and waits for it; its exception, if any, is raised here."""
    import threading

    failed = []

    def body():
        try:
            fn()
        except BaseException as e:  # re-raised on the main thread
            failed.append(e)

    t = threading.Thread(target=body, name="train")
    t.start()
    t.join()
    if failed:
        raise failed[0]


if __name__ == "__main__":
    run_on_thread(main) if "--train-thread" in sys.argv else main()
