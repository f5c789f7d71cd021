"""ckpt-rng-harness: bit-exact regression harness for RNG correctness under activation checkpointing."""

__version__ = "0.2.0"
