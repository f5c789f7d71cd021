"""An adapter module whose import is interrupted (loaded as interrupted_import_adapter:factory)."""

raise KeyboardInterrupt


def factory():  # never reached
    return None
