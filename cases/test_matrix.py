"""The case matrix: every valid case for every implementation named by --impl, the shipped
module `harness.pytest_cases` (one definition for the checkout and an installed package).

Ids read ``<impl>-<mode>-<layout>-<capture>-<program>-<interleave>-<device>``, so
``pytest cases -k "torch and tracked and eager"`` selects what it says.
"""

from harness.pytest_cases import test_case  # noqa: F401  (collected here as cases/test_matrix.py)
