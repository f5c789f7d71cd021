"""The errors the harness raises on purpose: one base, and the usage error the fronts print.

`HarnessError` is the base of every exception class the harness defines for its own conditions;
`UsageError` (a `ValueError` too, as the classes it replaced were) is bad input from the user: a
front (the command line, the pytest plugin) prints it as one line and exits with status 2.  Each
module keeps its own subclass, so a message can say what kind of input was bad, and a caller can
still catch one kind.  This module imports nothing: the report package (no torch) uses it too.

Left outside on purpose: the bundled checkpoint's errors (`harness.checkpoint`: a library of its
own that does not import the harness), the control flow of the fuzzer (`fuzz.Found`), SIGTERM
(`stops.Terminated`, a KeyboardInterrupt so that ``except Exception`` in code under test cannot
swallow it) and a record that could not be written (`stops.WriteFailed`, a KeyboardInterrupt for
the same reason: the run stops and reports what it judged, as after SIGTERM).  A write that fails
after the up-front checks is `report.ReportWriteError`, a UsageError: exit status 2 as well.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of the harness's own exceptions."""


class UsageError(HarnessError, ValueError):
    """Bad input (an unknown impl, axis value, device or file): one line, exit status 2."""
