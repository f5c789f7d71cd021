"""Finding implementations: built-in names, import paths, user errors, third-party adapters, and
how the runner reports an adapter that passes, raises or declines a case."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch

from harness import impls
from harness.impls import BUILTIN, NEGATIVE_CONTROLS, ImplError, load, parse_impl_names
from harness.impls.base import Adapter
from harness.impls.bundled import BundledAdapter
from harness.model.cases import parse_case_id
from harness.run import runner
from harness.run.runner import Outcome

CASE = parse_case_id("nonreentrant-mixed-eager-nested-draws-cpu")


# --- loading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_name_loads_with_that_name(name):
    adapter = load(name)
    assert adapter.name == name
    assert callable(adapter.checkpoint)


def test_negative_controls_are_the_neg_builtins():
    assert set(NEGATIVE_CONTROLS) == {n for n in BUILTIN if n.startswith("neg-")}
    assert len(NEGATIVE_CONTROLS) >= 3


def test_module_factory_path_loads():
    adapter = load("harness.impls.bundled:make_bundled")
    assert isinstance(adapter, BundledAdapter)
    assert adapter.name == "bundled"


def test_each_load_builds_a_fresh_adapter():
    assert load("bundled") is not load("bundled")


def test_unknown_name_lists_known_names():
    with pytest.raises(ImplError) as excinfo:
        load("nonesuch")
    message = str(excinfo.value)
    assert "nonesuch" in message
    for name in BUILTIN:
        assert name in message
    assert "package.module:factory" in message


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("nope.module:x", "cannot import 'nope.module'"),
        ("harness.impls.bundled:missing", "no attribute 'missing'"),
        ("noseparator", "unknown implementation 'noseparator'"),
        (":factory", "bad implementation path"),
        ("harness.impls.bundled:", "bad implementation path"),
    ],
)
def test_bad_path_raises_impl_error(path, fragment):
    with pytest.raises(ImplError, match=fragment.replace(".", r"\.")):
        load(path)


def test_factory_returning_a_non_adapter_is_refused():
    with pytest.raises(ImplError, match="did not return an adapter: got object <object object at"):
        load("builtins:object")


# --- loading faults are one line ---------------------------------------------------------------


def _load_error(name: str) -> str:
    """The one-line message of the ImplError that loading `name` raises."""
    with pytest.raises(ImplError) as excinfo:
        load(name)
    error = excinfo.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    message = str(excinfo.value)
    assert "\n" not in message and "  " not in message, message
    return message


@pytest.mark.parametrize(
    "name, message",
    [
        ("broken_import_adapter:factory",
         "cannot import 'broken_import_adapter' for implementation 'broken_import_adapter:factory': "
         "RuntimeError: boom while importing the adapter"),
        ("exiting_import_adapter:factory",
         "cannot import 'exiting_import_adapter' for implementation 'exiting_import_adapter:factory': "
         "SystemExit: adapter module exits at import"),
        ("nope.module:x",
         "cannot import 'nope.module' for implementation 'nope.module:x': "
         "ModuleNotFoundError: No module named 'nope'"),
    ],
)
def test_a_module_that_raises_anything_at_import_is_one_line(name, message):
    assert _load_error(name) == message


def test_an_interrupted_import_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        load("interrupted_import_adapter:factory")


def test_a_registered_name_is_named_in_the_import_error(monkeypatch):
    monkeypatch.setitem(BUILTIN, "broken", "broken_import_adapter:factory")
    assert _load_error("broken") == ("cannot import 'broken_import_adapter' for implementation 'broken': "
                                     "RuntimeError: boom while importing the adapter")


@pytest.mark.parametrize(
    "factory, message",
    [
        ("make_raising_factory", "raised RuntimeError: factory failed on purpose"),
        ("make_exiting_factory", "raised SystemExit: 4"),
    ],
)
def test_a_factory_that_raises_or_exits_is_one_line_naming_it(factory, message):
    name = f"faulty_adapters:{factory}"
    assert _load_error(name) == f"factory {name} for implementation {name!r} {message}"


def test_an_interrupted_factory_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        load("faulty_adapters:make_interrupted_factory")


def test_a_factory_returning_a_non_adapter_says_what_it_returned():
    message = _load_error("faulty_adapters:make_not_an_adapter")
    assert message.startswith("factory faulty_adapters:make_not_an_adapter for implementation "
                              "'faulty_adapters:make_not_an_adapter' did not return an adapter: "
                              "got _Wordy <Wordy word word")
    assert message.endswith("...") and len(message) < 250


# --- the adapter interface's defaults -----------------------------------------------------------


def test_adapters_are_available_and_may_decline_cases_by_default():
    adapter = BundledAdapter()
    assert adapter.unavailable() is None
    assert Adapter.must_support_all is False


def test_impl_error_is_a_value_error():
    assert issubclass(ImplError, ValueError)


# --- third-party adapters -----------------------------------------------------------------------

ADAPTER_SOURCE = '''
"""A third-party adapter, written without subclassing harness.impls.base.Adapter."""

from harness.checkpoint import RNGStatesTracker, checkpoint


class Mine:
    name = "mine"

    def make_tracker(self, device):
        return RNGStatesTracker(device)

    def checkpoint(self, fn, *args, reentrant, tracker):
        return checkpoint(fn, *args, reentrant=reentrant, tracker=tracker)

    def supports(self, case):
        return None


class Exploding(Mine):
    name = "exploding"

    def checkpoint(self, fn, *args, reentrant, tracker):
        raise RuntimeError("adapter exploded inside checkpoint")


class Declining(Mine):
    name = "declining"

    def supports(self, case):
        return "needs torch>=99 Generator.frobnicate"


class Nameless(Mine):
    name = ""


def factory():
    return Mine()


def exploding():
    return Exploding()


def declining():
    return Declining()


def nameless():
    return Nameless()
'''


@pytest.fixture
def mypkg(tmp_path, monkeypatch):
    """A package `mypkg` with module `adapter`, importable for this test only."""
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "adapter.py").write_text(textwrap.dedent(ADAPTER_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    for module in ("mypkg", "mypkg.adapter"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    yield "mypkg.adapter"
    for module in ("mypkg", "mypkg.adapter"):
        sys.modules.pop(module, None)


def test_third_party_adapter_loads_by_path(mypkg):
    adapter = load(f"{mypkg}:factory")
    assert type(adapter).__name__ == "Mine"
    assert adapter.name == "mine"


def test_nameless_adapter_is_named_after_its_path(mypkg):
    assert load(f"{mypkg}:nameless").name == f"{mypkg}:nameless"


def test_missing_factory_in_third_party_module(mypkg):
    with pytest.raises(ImplError, match="no attribute 'nope'"):
        load(f"{mypkg}:nope")


def test_correct_third_party_adapter_passes_a_case(mypkg):
    result = runner.run(CASE, load(f"{mypkg}:factory"))
    assert result.outcome is Outcome.PASS, result.summary()
    assert result.impl == "mine"
    assert result.mismatches == []


def test_adapter_that_raises_gives_error_with_the_message(mypkg):
    result = runner.run(CASE, load(f"{mypkg}:exploding"))
    assert result.outcome is Outcome.ERROR
    assert result.error == "RuntimeError: adapter exploded inside checkpoint"
    assert "adapter exploded" in result.traceback
    assert result.summary() == result.error


def test_adapter_that_declines_gives_unsupported_with_the_reason(mypkg):
    result = runner.run(CASE, load(f"{mypkg}:declining"))
    assert result.outcome is Outcome.UNSUPPORTED
    assert result.reason == "needs torch>=99 Generator.frobnicate"
    assert result.mismatches == []


def test_runner_reports_cuda_cases_as_skipped_without_cuda(mypkg):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    case = parse_case_id("reentrant-tracked-single-flat-none-cuda")
    result = runner.run(case, load(f"{mypkg}:factory"))
    assert result.outcome is Outcome.SKIPPED
    assert "CUDA" in result.reason


# --- parse_impl_names ---------------------------------------------------------------------------


def test_parse_impl_names_defaults_to_bundled():
    assert parse_impl_names(None) == ["bundled"]
    assert parse_impl_names([]) == ["bundled"]
    assert parse_impl_names("") == ["bundled"]
    assert parse_impl_names(None, default="torch") == ["torch"]


def test_parse_impl_names_accepts_a_single_string():
    assert parse_impl_names("torch") == ["torch"]


def test_parse_impl_names_drops_repeats_keeping_first_order():
    assert parse_impl_names(["torch", "bundled", "torch"]) == ["torch", "bundled"]


def test_parse_impl_names_splits_comma_lists():
    assert parse_impl_names(["bundled, torch", "neg-no-rewind"]) == [
        "bundled", "torch", "neg-no-rewind"
    ]


def test_parse_impl_names_ignores_empty_items():
    assert parse_impl_names(" , bundled,,") == ["bundled"]


def test_parse_impl_names_all_expands_to_every_builtin():
    assert parse_impl_names("all") == list(BUILTIN)


def test_parse_impl_names_all_keeps_earlier_names_first_and_once():
    names = parse_impl_names(["torch", "all", "bundled"])
    assert names[0] == "torch"
    assert sorted(names) == sorted(BUILTIN)


def test_parse_impl_names_keeps_paths_intact():
    assert parse_impl_names("mypkg.adapter:factory,bundled") == ["mypkg.adapter:factory", "bundled"]


def test_registered_includes_every_builtin():
    assert set(BUILTIN) <= set(impls.registered())


def test_bundled_counts_an_sdpa_auto_site_in_a_region_as_the_backend_torch_picks(monkeypatch, request):
    """sdpa_auto under capture: the bundled limit of the backend torch picks applies (the fuzzer's
    H200 crash, cases/corpus.toml); a site outside every region is no checkpoint's business, and
    the probe is asked about the dtypes of the sites inside regions only."""
    import torch

    from harness.checkpoint import rng
    from harness.impls import bundled
    from harness.model import ops

    ops.auto_backend.cache_clear()  # the probe's answers below are fakes: none may outlive the test
    request.addfinalizer(ops.auto_backend.cache_clear)
    monkeypatch.setattr(rng, "philox_available", lambda: False)  # the stash's limits (a torch < 2.14)
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "zeros", lambda shape, device, dtype: asked.append((shape, dtype)) or "q")
    monkeypatch.setattr(torch, "_fused_sdp_choice",
                        lambda q, k, v, *mask_and_dropout: int(torch.nn.attention.SDPBackend.CUDNN_ATTENTION),
                        raising=False)
    inside = parse_case_id("reentrant-default-single-(native_dropout+sdpa_auto.bf16)-none-cuda")
    assert bundled.auto_backends(inside) == {"cudnn"} and asked == [((1, 1, 64, 64), torch.bfloat16)]
    reason = bundled.BundledAdapter().limit(inside)
    assert reason and "cuDNN attention" in reason and "sdpa_auto: torch picks cudnn attention for it here" in reason
    assert len(asked) == 1  # probed once per dtype and shape, however often a limit asks
    outside = parse_case_id("reentrant-default-single-(native_dropout)+sdpa_auto-none-cuda")
    assert bundled.auto_backends(outside) == set() and bundled.BundledAdapter().limit(outside) is None
    eager = parse_case_id("reentrant-default-eager-(native_dropout+sdpa_auto.bf16)-none-cuda")
    assert bundled.BundledAdapter().limit(eager) is None  # the limits are about capture
    monkeypatch.delattr(torch, "_fused_sdp_choice")  # a torch that cannot be asked: the cautious answer
    ops.auto_backend.cache_clear()
    assert bundled.auto_backends(inside) == {"efficient", "cudnn"}
