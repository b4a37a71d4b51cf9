"""Python-only entry points of the agent, wired to C++ functions of _memplan (no logic here).

Some PyTorch hooks exist only for Python: the default saved-tensor hooks and the backward call
that marks a step boundary. This module registers C++ functions for them and steps aside for
code that refuses saved-tensor hooks (torch.func transforms)."""
import atexit
import contextlib
import functools
import inspect
import os


def install(torch, agent):
    if not agent.boot():
        return
    pack, unpack = agent.pack, agent.unpack
    if agent.owns_thread():  # else the training thread is the first to call backward (claim_thread)
        torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
        agent.hooks_pushed()

    def _ours_on_top():
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        return top is not None and top[0] is pack

    def _boundary(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            claimed = agent.claim_thread()
            agent.backward_begin(_keeps_graph(signature, args, kwargs))
            # Our hooks step aside while backward runs: the engine copies the thread's hooks stack
            # into every node it runs, and each copy of a Python hook takes the GIL, which backward
            # released (4 round trips per node). What backward itself saves is not the agent's
            # business; tensors saved in forward keep their unpack hook, and a rebuild puts our
            # hooks back for its re-runs (agent/pack_hooks.h).
            stepped = _ours_on_top()
            if stepped:
                torch._C._autograd._pop_saved_tensors_default_hooks()
            try:
                return fn(*args, **kwargs)
            finally:
                if stepped or claimed:
                    torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)
                if claimed:
                    agent.hooks_pushed()
                if not agent.backward_end():
                    _drop_hooks()

        return wrapped

    def _keeps_graph(signature, args, kwargs):
        # retain_graph, which defaults to create_graph (both functions' rule). A call that does not
        # bind is left to raise its own TypeError in fn.
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return False
        retain = bound.get("retain_graph")
        return bool(bound.get("create_graph", False) if retain is None else retain)

    optimizer_hooks = []

    def _drop_hooks():
        # The agent has nothing left to do (profile only, or a plan with no action): take our
        # saved-tensor hooks off so later steps run exactly as plain PyTorch, at no cost.
        while optimizer_hooks:
            optimizer_hooks.pop().remove()
        if _ours_on_top():
            torch._C._autograd._pop_saved_tensors_default_hooks()

    torch.autograd.backward = _boundary(torch.autograd.backward)
    torch.autograd.grad = _boundary(torch.autograd.grad)

    # torch.func transforms use disable_saved_tensors_hooks, which raises while any default hooks
    # are on the stack: take ours off for the duration when they are on top (design.md 3b.13).
    real_disable = torch.autograd.graph.disable_saved_tensors_hooks

    @contextlib.contextmanager
    def disable_saved_tensors_hooks(error_message):
        stepped = _ours_on_top()
        if stepped:
            torch._C._autograd._pop_saved_tensors_default_hooks()
        try:
            with real_disable(error_message):
                yield
        finally:
            if stepped:
                torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)

    functools.update_wrapper(disable_saved_tensors_hooks, real_disable)
    torch.autograd.graph.disable_saved_tensors_hooks = disable_saved_tensors_hooks

    # Selective activation checkpointing (checkpoint(..., context_fn=...)) looks for the user's
    # saved-tensor hooks around its region: it warns (a FutureWarning a plain run does not print)
    # and, with respect_saved_tensors_hooks=True, sends the tensors it caches through them. Ours
    # are not the user's, and a checkpoint region is left to checkpoint: SAC does not see them.
    # Ours are pushed first on their thread, so nothing of the user's lies beneath them.
    import torch.utils.checkpoint as checkpoint_module
    real_user_hooks = getattr(checkpoint_module, "_current_user_saved_tensors_hooks", None)
    if real_user_hooks is not None:  # older torch: no such lookup, nothing to hide from

        def current_user_saved_tensors_hooks():
            hooks = real_user_hooks()
            return None if hooks is not None and hooks[0] is pack else hooks

        functools.update_wrapper(current_user_saved_tensors_hooks, real_user_hooks)
        checkpoint_module._current_user_saved_tensors_hooks = current_user_saved_tensors_hooks

    # An optimizer step records nothing (no grad mode): the agent turns RecordFunction off for it,
    # so its hundreds of ops skip our observer (measured: ~5% of a dispatch-bound GPT-2 step).
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    except ImportError:  # older torch: the optimizer's ops are observed, as before
        pass
    else:
        def _observed(opt, args, kwargs):
            # A differentiable optimizer's step runs under grad mode; a step given a closure (LBFGS)
            # runs the script's forward and backward inside it: both are seen as usual.
            # The hook's args are step's own, self first: Optimizer.step(self, closure=None).
            closure = args[1] if len(args) > 1 else kwargs.get("closure")
            return bool(opt.defaults.get("differentiable", False)) or closure is not None

        optimizer_hooks.append(register_optimizer_step_pre_hook(
            lambda opt, args, kwargs: agent.optimizer_step_begin(_observed(opt, args, kwargs))))
        optimizer_hooks.append(register_optimizer_step_post_hook(lambda opt, args, kwargs: agent.optimizer_step_end()))

    os.register_at_fork(after_in_child=agent.on_fork_child)
    atexit.register(agent.finish)
