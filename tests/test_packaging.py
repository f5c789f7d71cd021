"""What an installed harness adds to its environment, checked in this process: the pytest entry
point's opt-in, other packages' expectation files (added, and only for their own impls), the
shipped machine facts by name, and `fuzz --save` refusing to edit an installed corpus.
(tests/test_installed.py builds and installs the real wheel.)"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import data as shipped_data
from harness import entry_points, impls
from harness.fronts import cli
from harness.fronts.pytest_entry import opted_in
from harness.verdict import diff, expectations

ROOT = Path(__file__).resolve().parent.parent
PROCESS_LIMIT_S = 300  # a nested pytest run, however loaded the machine; never a speed test

ADAPTER = '''
from pathlib import Path

from harness.impls.base import Adapter

EXPECTATIONS = Path(__file__).with_name("expectations.toml")
NOT_A_PATH = 42


class Theirs(Adapter):
    name = "theirs"

    def checkpoint(self, fn, *args, reentrant, tracker, **kwargs):
        return fn(*args, **kwargs)


def factory():
    return Theirs()
'''

OWN_ENTRY = '''
[[expect]]
name = "theirs-bug"
impl = "theirs"
cases = ["*-shared-*"]
reason = "their own bug"
'''


def install_fake(site: Path, monkeypatch, expectations_value: str, entries: str) -> None:
    """Package `theirpkg` 2.0.1 in `site`: impl 'theirs' and an expectations entry point."""
    (site / "theirpkg").mkdir(parents=True)
    (site / "theirpkg" / "__init__.py").write_text("")
    (site / "theirpkg" / "adapter.py").write_text(textwrap.dedent(ADAPTER))
    (site / "theirpkg" / "expectations.toml").write_text(entries)
    info = site / "theirpkg-2.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: theirpkg\nVersion: 2.0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{entry_points.IMPLS_GROUP}]\ntheirs = theirpkg.adapter:factory\n\n"
        f"[{entry_points.EXPECTATIONS_GROUP}]\ntheirpkg = {expectations_value}\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    for module in ("theirpkg", "theirpkg.adapter"):
        monkeypatch.delitem(sys.modules, module, raising=False)


@pytest.mark.parametrize(("args", "wanted"), [
    (["-p", "ckpt_harness"], True),
    (["-q", "-pckpt_harness", "tests"], True),
    (["-p", "no:ckpt_harness"], False),
    (["-p", "ckpt_harness_other"], False),
    (["tests", "--", "-p", "ckpt_harness"], False),
    ([], False),
])
def test_the_entry_point_opts_in_only_on_p_ckpt_harness(args, wanted):
    assert opted_in(args) is wanted


def test_a_package_adds_entries_for_its_own_impls(tmp_path, monkeypatch):
    install_fake(tmp_path / "site", monkeypatch, "theirpkg.adapter:EXPECTATIONS", OWN_ENTRY)
    shipped = expectations.load()
    entries = expectations.load_all(None, (), impls.registered())
    assert entries[: len(shipped)] == shipped and [e.name for e in entries[len(shipped):]] == ["theirs-bug"]
    assert entries[-1].source.endswith("theirpkg/expectations.toml")
    adapter = impls.load("theirs")
    assert impls.package_of(adapter).origin == "theirpkg 2.0.1"
    from harness.run.execution import adapter_version

    assert adapter_version(adapter) == "2.0.1"  # the adapter names no version: its package's stands in


def test_a_package_entry_for_another_impl_is_bad_input(tmp_path, monkeypatch):
    foreign = OWN_ENTRY.replace('"theirs"', '"torch"')
    install_fake(tmp_path / "site", monkeypatch, "theirpkg.adapter:EXPECTATIONS", foreign)
    with pytest.raises(expectations.ExpectationError, match=r"of theirpkg 2\.0\.1: entry 1 names impl 'torch'.*"
                                                            r"theirpkg does not register.*\(theirs\)"):
        expectations.load_all(None, (), impls.registered())


@pytest.mark.parametrize(("value", "message"), [
    ("theirpkg.adapter:NOT_A_PATH", "is a int, not the path of a file"),
    ("theirpkg.adapter:MISSING", "cannot be loaded: AttributeError"),
    ("theirpkg.adapter", "expected package.module:ATTRIBUTE"),
])
def test_a_broken_expectations_entry_point_is_one_line(tmp_path, monkeypatch, value, message):
    install_fake(tmp_path / "site", monkeypatch, value, OWN_ENTRY)
    with pytest.raises(expectations.ExpectationError, match=message):
        expectations.load_all(None, (), impls.registered())


def test_added_files_add_and_an_unknown_impl_in_them_is_exit_2(tmp_path, capsys):
    added = tmp_path / "mine.toml"
    added.write_text(OWN_ENTRY.replace('"theirs"', '"torch"').replace("theirs-bug", "my-claim"))
    entries = expectations.load_all(None, [added], impls.registered())
    assert entries[-1].name == "my-claim" and entries[-1].source == str(added)
    added.write_text(OWN_ENTRY.replace('"theirs"', '"no-such-impl"'))
    assert cli.main(["run", "--impl", "torch", "--device", "cpu", "--add-expectations", str(added)]) == 2
    assert f"expectations file {added}: entry 1 (theirs-bug) names impl 'no-such-impl'" in capsys.readouterr().err


def test_shipped_machine_facts_are_found_by_name():
    by_name = diff.load_machine("h200-torch2.11")
    by_file = diff.load_machine(str(ROOT / "cases" / "machines" / "h200-torch2.11.json"))
    assert by_name.known and by_name.known == by_file.known


def test_fuzz_save_refuses_to_edit_an_installed_corpus(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(shipped_data, "in_checkout", lambda: False)
    assert cli.main(["fuzz", "--impl", "bundled", "--device", "cpu", "--examples", "1", "--save"]) == 2
    assert "name a file of your project with --corpus FILE" in capsys.readouterr().err
    assert shipped_data.path(shipped_data.CORPUS).read_bytes() == (ROOT / "cases" / "corpus.toml").read_bytes()


def test_the_checkout_spellings_and_the_prefixed_ones_name_what_was_typed(tmp_path):
    for spelling in ("--workers-per-gpu", "--harness-workers-per-gpu"):
        proc = subprocess.run([sys.executable, "-m", "pytest", "cases", "-q", "-p", "no:cacheprovider", spelling, "0"],
                              cwd=ROOT, capture_output=True, text=True, timeout=PROCESS_LIMIT_S)
        assert proc.returncode == 2 and proc.stderr.strip() == f"error: {spelling} must be at least 1, got 0"


def test_a_package_version_is_the_imported_copys_where_another_copy_is_installed(tmp_path, monkeypatch):
    """A checkout (or a stand-in) on PYTHONPATH shadowing an installed release: the metadata names
    the release, the code that runs is the checkout's (issue 59: megatron-core 0.19.2 installed on
    the GPU machine, the tests' stand-in 0.18.1 imported)."""
    from harness.impls import packages

    installed, checkout = tmp_path / "installed", tmp_path / "checkout"
    for root, version in ((installed, "9.9"), (checkout, "10.0.dev0")):
        (root / "shadowpkg").mkdir(parents=True)
        (root / "shadowpkg" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = installed / "shadowpkg-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadowpkg\nVersion: 9.9\n")
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.syspath_prepend(str(checkout))  # first on the path: the copy that imports
    importlib.invalidate_caches()
    monkeypatch.delitem(sys.modules, "shadowpkg", raising=False)
    module = importlib.import_module("shadowpkg")
    assert module.__version__ == "10.0.dev0" and packages.shadowed(module, ["shadowpkg"])
    # by name: the imported copy, or where nothing imported it yet, the copy an import would load
    assert packages.shadowed("shadowpkg", ["shadowpkg"])
    monkeypatch.delitem(sys.modules, "shadowpkg")
    assert packages.shadowed("shadowpkg", ["shadowpkg"]) and "shadowpkg" not in sys.modules
    monkeypatch.syspath_prepend(str(installed))  # now the installed copy imports: its metadata is its own
    importlib.invalidate_caches()
    assert not packages.shadowed("shadowpkg", ["shadowpkg"])  # found, not imported: the installed copy
    assert not packages.shadowed(importlib.import_module("shadowpkg"), ["shadowpkg"])
    assert not packages.shadowed(module, ["not-installed-anywhere"])  # no metadata to compare with
