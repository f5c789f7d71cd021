"""``python -m harness``: the command line (`harness.fronts.cli`)."""

import sys

from harness.fronts.cli import main

if __name__ == "__main__":
    sys.exit(main())
