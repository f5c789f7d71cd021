"""Where BART's reference raises under CUDA-graph capture (issue 39, item 5; GPU only).

On an H100 (torch 2.11, transformers 5.17) ``harness module examples.hf_models:bart --impl as-built
--capture single`` gave "cannot judge: the model without checkpointing raised under single capture
... Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is
pinned", for ``bart`` and ``bart_layerdrop`` alike; GPT-2, T5 and the others capture.  This prints
the traceback through the harness, then narrows it without the harness: BART's train step captured
bare, with torch's deterministic mode (warn-only, as module mode sets it on CUDA) off and on, and an
embedding with and without ``padding_idx`` (BART's embeddings have one; GPT-2's and T5's have not).

    python tools/bart_capture_trace.py

What the H100 gave (2026-12-05): BART's train step raises bare too, deterministic mode off and on,
in ``transformers/masking_utils.py:604`` (``eager_mask``): ``torch.where(mask, torch.tensor(0.0,
device=mask.device, dtype=dtype), min_dtype)``, an unpinned host-to-device copy, which torch 2.11
refuses during capture.  Embeddings with and without ``padding_idx`` captured: not the cause.
transformers 5.23 builds the scalar with ``torch.zeros((), device=...)``, and BART captures.
"""

import sys
import traceback

import torch

import harness.run.module_run as module_run
from harness.fronts.cli import main


def captured(step, what: str) -> None:
    """Warm `step` up on a side stream, capture it in one graph, say whether that raised."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            step()
        print(f"{what}: captured", flush=True)
    except Exception:
        print(f"{what}: raised", flush=True)
        traceback.print_exc(limit=-6)


def through_the_harness() -> None:
    execute = module_run.execute

    def traced(*args, **kwargs):
        try:
            return execute(*args, **kwargs)
        except BaseException:
            traceback.print_exc(limit=-14)
            raise

    module_run.execute = traced
    try:
        main(["module", "examples.hf_models:bart", "--impl", "as-built", "--capture", "single", "--device", "cuda"])
    except SystemExit:
        pass
    finally:
        module_run.execute = execute


def bare() -> None:
    from examples.hf_models import bart

    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic, warn_only=True)
        made = bart(checkpointing=False)
        model = made.module.cuda().train()
        inputs = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in made.inputs.items()}
        captured(lambda: model(**inputs).last_hidden_state.float().sum().backward(),
                 f"BART train step, deterministic={deterministic}")
        for padding_idx in (None, 1):
            embedding = torch.nn.Embedding(64, 32, padding_idx=padding_idx).cuda()
            ids = torch.randint(0, 64, (2, 8), device="cuda")
            captured(lambda: embedding(ids).sum().backward(),
                     f"embedding backward, padding_idx={padding_idx}, deterministic={deterministic}")
    torch.use_deterministic_algorithms(False)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("tools/bart_capture_trace.py needs a CUDA device")
    through_the_harness()
    print("===== without the harness", flush=True)
    bare()
