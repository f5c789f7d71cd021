"""The case matrix: every valid case for every implementation named by --impl.

Ids read ``<impl>-<mode>-<layout>-<capture>-<program>-<interleave>-<device>``, so
``pytest cases -k "torch and tracked and eager"`` selects what it says.
"""


def test_case(harness_case, harness_run):
    harness_run(harness_case)
