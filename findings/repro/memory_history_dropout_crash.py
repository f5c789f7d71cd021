"""transformers GPT-2, gradient checkpointing (non-reentrant), CUDA memory history recording on.

Reported on the H200 (torch 2.11, transformers 5.17): the recompute raises ``SystemError:
<built-in method dropout ...> returned NULL without setting an exception`` (compare
pytorch/tutorials#3774); reentrant mode passes.  Run it to see whether this machine shows it.

Needs torch, transformers and a CUDA device (no download: the model is built from a config).
Exit 1 when the recompute raises, 0 when every mode runs.
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def run(reentrant):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=64)
    model = GPT2LMHeadModel(config).cuda().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    ids = torch.randint(0, 1000, (2, 32), device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        model(ids, labels=ids).loss.backward()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def main():
    bad = 0
    for reentrant in (False, True):
        label = "reentrant" if reentrant else "non-reentrant"
        try:
            run(reentrant)
            print(f"{label:14s}: backward ran")
        except Exception as exc:
            print(f"{label:14s}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            bad += 1
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
