"""The environment header of a report, read from records: which RNG APIs a build had, and
`env_key`, the environment a case ran in (GPU and host): the same case from two GPU types is two
results, not a duplicate.  (The probe that fills `env` when a run starts is `harness.run.environment`;
this module never imports torch.)
"""

from __future__ import annotations

from typing import Any, Mapping


def rng_apis(env: Mapping[str, Any]) -> dict[str, str]:
    """The ``rng_apis`` string of an environment as name -> yes/no/unknown (...)."""
    out: dict[str, str] = {}
    for part in _split_apis(str(env.get("rng_apis", ""))):
        name, _, value = part.partition("=")
        out[name.strip()] = value.strip()
    return out


def _split_apis(text: str) -> list[str]:
    # values may hold ", " inside parentheses: split only at top level
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [p for p in (p.strip() for p in parts) if p]


def env_key(env: Mapping[str, Any] | None) -> str:
    """The identity of the environment a case ran in: GPU and host (``"NVIDIA H200 (sm_90) x1 @ vm"``)."""
    env = env or {}
    return f"{env.get('gpu', 'unknown')} @ {env.get('host', 'unknown')}"


def env_labels(envs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """A short, unique label per environment key: the GPU name, with the host where GPUs repeat."""
    def short(env: Mapping[str, Any]) -> str:
        gpu = str(env.get("gpu_name") or env.get("gpu") or "unknown")
        return "cpu" if gpu == "none" else gpu

    shorts = {key: short(env) for key, env in envs.items()}
    labels = {}
    for key, label in shorts.items():
        clash = sum(1 for other in shorts.values() if other == label) > 1
        labels[key] = f"{label} @ {envs[key].get('host', 'unknown')}" if clash else label
    return labels
