"""Example factories for `python -m harness module` (examples.transformer_layer:factory, ...)."""
