"""The repository's own pytest setup: the harness's plugin (`harness.fronts.plugin`), registered
here rather than through ``-p ckpt_harness``, with the checkout's short option spellings
(``--impl``, ``--device``, ``--report-dir``, ...) beside the ``--harness-`` ones an installed
package offers."""

from harness.fronts.plugin import add_checkout_spellings

pytest_plugins = ["harness.fronts.plugin"]


def pytest_addoption(parser):
    add_checkout_spellings(parser)
