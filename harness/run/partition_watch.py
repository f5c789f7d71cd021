"""What the compiler put in the backward graph: the RNG ops a compiled checkpointed run redraws
there (issue 40).

Whether the min-cut partitioner recomputes a program's RNG ops in backward, with fresh
randomness, below an activation memory budget of 1.0 is its own choice per program.  Instead of
guessing it, the runner watches it: inductor runs every graph it compiles through its
``post_grad_custom_post_pass`` hook (a `CustomGraphPass`, found by capability), forward and
backward alike; a backward graph is the one whose inputs include the tangents.  The RNG ops named
in a backward graph are the draws the recompute makes afresh (the checkpoint's own replays, under
``run_with_rng_state``, are not plain RNG ops there).  The runner keeps them as a machine fact of
the case, ``compiled.backward_rng``, which the ``fresh-recompute`` model reads.  The ``aot_eager``
backends compile nothing: the same look is taken at the graphs they hand to their no-op compiler
(`_watching_nop`).  A backend that calls neither leaves nothing known, and the fact is not recorded.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..verdict.models import BACKWARD_RNG as FACT

RNG_WORDS = ("rand", "bernoulli", "dropout", "normal", "uniform", "poisson", "exponential", "multinomial",
             "inductor_random", "inductor_seeds", "philox")


def _rng_targets(graph: Any) -> tuple[bool, set[str]]:
    backward = any(node.op == "placeholder" and node.name.startswith("tangents") for node in graph.nodes)
    found = {str(node.target) for node in graph.nodes
             if node.op == "call_function" and any(word in str(node.target) for word in RNG_WORDS)}
    return backward, found


@contextlib.contextmanager
def watching(facts: dict[str, Any]) -> Iterator[None]:
    """Within it, every graph inductor compiles, or an ``aot_eager`` backend hands to its no-op
    compiler, is looked at; on leaving, `facts[FACT]` is the sorted RNG ops of its backward graphs
    (empty: none there), where a backward graph was seen.  Does nothing where this torch has no
    inductor hook."""
    try:
        import torch._inductor.config as inductor_config
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:
        yield
        return
    if not hasattr(inductor_config, "post_grad_custom_post_pass"):
        yield
        return
    seen: dict[str, Any] = {"backward": False, "ops": set()}

    class Watch(CustomGraphPass):  # type: ignore[misc]
        def __call__(self, graph: Any) -> None:
            backward, found = _rng_targets(graph)
            if backward:
                seen["backward"] = True
                seen["ops"] |= found

        def uuid(self) -> None:  # not cacheable: every compile is looked at
            return None

    patches = {"post_grad_custom_post_pass": Watch()}
    if hasattr(inductor_config, "fx_graph_cache"):
        patches["fx_graph_cache"] = False  # a cached graph would skip the hook
    with inductor_config.patch(patches), _watching_nop(Watch()):
        yield
    if seen["backward"]:
        facts[FACT] = sorted(seen["ops"])


@contextlib.contextmanager
def _watching_nop(look: Any) -> Iterator[None]:
    """The same look at the graphs of the ``aot_eager`` backends, which compile nothing: they hand
    each partitioned graph to ``torch._dynamo.backends.debugging.boxed_nop`` (fetched by name when a
    graph is compiled, `get_nop_func`), here wrapped for the time of the block.  Nothing where this
    torch has no such function."""
    try:
        from torch._dynamo.backends import debugging
    except ImportError:
        yield
        return
    original = getattr(debugging, "boxed_nop", None)
    if original is None or not hasattr(debugging, "get_nop_func"):
        yield
        return

    def boxed_nop(fx_g: Any, example_inputs: Any) -> Any:
        look(fx_g.graph)
        return original(fx_g, example_inputs)

    debugging.boxed_nop = boxed_nop
    try:
        yield
    finally:
        debugging.boxed_nop = original
