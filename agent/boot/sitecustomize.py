"""memplan boot shim: loads the agent into an unmodified Python process.

Put on PYTHONPATH by libmemplan.so (LD_PRELOAD) or by tools/memplan-run. It does three things and
holds no logic of its own (all of it is in C++, in the _memplan extension next to this file):
  1. chains to any sitecustomize it shadows, so the user's site set-up still runs;
  2. waits for the script to import torch (a post-import hook: Python processes that never
     import torch - pip, tools, DataLoader helpers - never load the agent);
  3. then loads _memplan, which installs its hooks, and gives it the few Python-only entry points
     (default saved-tensor hooks, step boundaries at backward).
"""
import os
import sys


def _chain_shadowed_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _disabled():
    # Only the values the option table accepts as "on"; a malformed one is reported by the agent
    # (one warning, then the default: enabled).
    return os.environ.get("MEMPLAN_DISABLE", "").strip().lower() in ("1", "true", "yes", "on")


def _load_agent():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("MEMPLAN_AGENT")
    if not path:
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        path = os.path.join(here, "_memplan" + suffix)
    loader = importlib.machinery.ExtensionFileLoader("_memplan", path)
    spec = importlib.util.spec_from_file_location("_memplan", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["_memplan"] = module
    return module


def _on_torch_imported(torch):
    try:
        agent = _load_agent()
    except Exception as e:  # never break the user's script for our sake
        sys.stderr.write(f"[memplan] agent not loaded ({e}); running plain PyTorch\n")
        return
    try:
        import memplan_shim

        memplan_shim.install(torch, agent)
    except Exception as e:
        sys.stderr.write(f"[memplan] agent failed to start ({e}); running plain PyTorch\n")


class _TorchImportWatcher:
    """A meta-path finder that runs _on_torch_imported right after `import torch` completes."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        import importlib.machinery

        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            _on_torch_imported(module)

        spec.loader.exec_module = exec_module
        return spec


try:
    _chain_shadowed_sitecustomize()
except Exception as e:
    sys.stderr.write(f"[memplan] a shadowed sitecustomize failed: {e}\n")

if not _disabled():
    if "torch" in sys.modules:
        _on_torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchImportWatcher())
