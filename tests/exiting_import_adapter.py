"""An adapter module that calls sys.exit at import (loaded as exiting_import_adapter:factory)."""

import sys

sys.exit("adapter module exits at import")


def factory():  # never reached
    return None
