"""An adapter module that raises RuntimeError at import (loaded as broken_import_adapter:factory)."""

raise RuntimeError("boom\n    while importing the adapter")


def factory():  # never reached
    return None
