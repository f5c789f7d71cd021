"""The case matrix as a pytest module, shipped so that a project that installed the package runs
it with ``pytest -p ckpt_harness --pyargs harness.pytest_cases --harness-impl NAME``: every valid
case for every implementation named (the checkout's ``cases/test_matrix.py`` is this test).

Ids read ``<impl>-<mode>-<layout>-<capture>-<program>-<interleave>-<device>``, so
``-k "torch and tracked and eager"`` selects what it says.  The fixtures come from the plugin
(`harness.fronts.plugin`), which ``-p ckpt_harness`` registers.
"""


def test_case(harness_case, harness_run):
    harness_run(harness_case)
