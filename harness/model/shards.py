"""Deterministic shards of the matrix: ``--shard i/n`` keeps the cases whose key hashes to i.

The key is ``<impl>-<case id>`` and the hash is SHA-256, so a case's shard does not depend on the
order of generation, on the machine or on the Python hash seed; the n shards partition the matrix.
"""

from __future__ import annotations

import hashlib
import re

from ..errors import UsageError


class ShardError(UsageError):
    """A malformed --shard value; the message is one line for the user."""


def parse_shard(spec: str) -> tuple[int, int]:
    """'2/4' -> (2, 4); shards count from 1."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec or "")
    if not match:
        raise ShardError(f"bad shard {spec!r}: expected i/n with 1 <= i <= n, e.g. 1/4")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"bad shard {spec!r}: expected i/n with 1 <= i <= n, e.g. 1/4")
    return index, count


def shard_of(key: str, count: int) -> int:
    """The shard (1..count) that `key` belongs to."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count + 1


def in_shard(impl: str, case_id: str, shard: tuple[int, int] | None) -> bool:
    """True when (impl, case) belongs to `shard` (always, when no shard is given)."""
    if shard is None:
        return True
    index, count = shard
    return shard_of(f"{impl}-{case_id}", count) == index
