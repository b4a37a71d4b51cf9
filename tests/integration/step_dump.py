"""What each training script of this directory records per step, for test_replay.py to compare
with torch.equal: the loss, every parameter's gradient and (where asked) every buffer, saved with
torch.save at the end; each step's loss is printed too, as `step N <loss>`, for the stdout check."""
import torch


class StepDump:
    def __init__(self):
        self.out = {"loss": [], "grads": [], "buffers": []}

    def record(self, step, loss, model, buffers=False):
        """After the step's backward, before its optimizer step."""
        self.out["loss"].append(loss.detach().clone())
        self.out["grads"].append({n: p.grad.clone() for n, p in model.named_parameters()})
        self.out["buffers"].append({n: b.clone() for n, b in model.named_buffers()} if buffers else {})
        print("step", step, repr(loss.item()))

    def save(self, path):
        torch.save(self.out, path)
