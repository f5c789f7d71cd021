"""The expectations file agrees with what the meta-tests see, its entries say which failure they
expect, and `judge` turns a result into a verdict (wrong failures, stale entries, unsupported
cells of impls that must support everything)."""

from __future__ import annotations

import pytest
from machines import h200_torch_2_11
from test_negative_controls import CPU_CASES, EXPECTED, EXPECTED_MISMATCH, oracles, results

from harness import impls
from harness.verdict import expectations
from harness.verdict.expectations import Expectation, judge


@pytest.mark.parametrize("impl", sorted(EXPECTED_MISMATCH))
def test_file_marks_exactly_the_cpu_cells_the_meta_tests_expect_to_fail(impl):
    entries = expectations.load()
    for case in CPU_CASES:
        marked = expectations.find(entries, impl, case.id) is not None
        assert marked == EXPECTED_MISMATCH[impl](case), f"{impl} {case.id}"


@pytest.mark.parametrize("impl", sorted(EXPECTED))
def test_every_cpu_result_is_judged_pass_or_xfail_under_the_file(impl):
    entries = expectations.load()
    wrong = []
    for case in CPU_CASES:
        result = results(impl)[case.id]
        entry = expectations.find(entries, impl, case.id)
        verdict = judge(result.outcome.value, oracles(result), result.error, entry, impl=impl)
        declared = (EXPECTED[impl](case) or ("",))[0] == "unsupported"  # a limit the control declares: skip
        if verdict.verdict not in ("pass", "xfail") and not (declared and verdict.verdict == "skip"):
            wrong.append(f"{case.id}: {verdict.verdict} {verdict.note}")
    assert wrong == []


def test_every_entry_matches_some_case_and_names_a_known_impl():
    assert expectations.entry_problems(expectations.load(), impls.registered()) == []


def test_entry_problems_name_unknown_impls_and_dead_patterns(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "torhc"\ncases = ["*"]\nreason = "r"\n'
                    '[[expect]]\nimpl = "torch"\ncases = ["*-nosuchlayout-*"]\nreason = "r"\n'
                    '[[expect]]\nimpl = "mypkg.adapter:factory"\ncases = ["*"]\nreason = "r"\n')
    assert expectations.entry_problems(expectations.load(path), impls.registered()) == [
        "impl matches no known implementation: torhc: *",
        "cases match no case: torch: *-nosuchlayout-*",
    ]


def test_an_entry_beyond_the_matrices_is_no_dead_entry(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "torch"\ncases = ["*-nosuchlayout-*"]\nbeyond_matrix = true\nreason = "r"\n')
    assert expectations.entry_problems(expectations.load(path), impls.registered()) == []
    path.write_text('[[expect]]\nimpl = "torch"\ncases = ["*"]\nbeyond_matrix = "yes"\nreason = "r"\n')
    with pytest.raises(expectations.ExpectationError, match="beyond_matrix must be true or false"):
        expectations.load(path)


ENTRY = Expectation("torch", ("*",), "why", oracles=("recompute-mask",))


@pytest.mark.parametrize("outcome, fired, error, verdict, note", [
    ("mismatch", ["recompute-mask", "gradient"], "", "xfail", ""),
    ("mismatch", ["live-stream"], "", "fail",
     "wrong failure: expected mismatch (recompute-mask), got mismatch (live-stream)"),
    ("error", [], "TypeError: boom\nmore", "fail",
     "wrong failure: expected mismatch (recompute-mask), got error: TypeError: boom"),
    ("crash", [], "worker process died", "fail",
     "wrong failure: expected mismatch (recompute-mask), got crash: worker process died"),
    ("pass", [], "", "stale", "stale: expected mismatch (recompute-mask), but the case passed"),
    ("unsupported", [], "", "skip", ""),
])
def test_judge_against_an_entry(outcome, fired, error, verdict, note):
    assert judge(outcome, fired, error, ENTRY, impl="torch") == expectations.Judgement(verdict, note)


def test_an_error_entry_matches_its_message():
    entry = Expectation("x", ("*",), "why", outcomes=("error",), message="^RuntimeError: set_current_seed")
    assert judge("error", [], "RuntimeError: set_current_seed can ...", entry, impl="x").verdict == "xfail"
    assert judge("error", [], "TypeError: no", entry, impl="x").note == (
        "wrong failure: expected error matching '^RuntimeError: set_current_seed', got error: TypeError: no")
    assert judge("mismatch", ["gradient"], "", entry, impl="x").verdict == "fail"


def test_without_an_entry():
    assert judge("pass", [], "", None, impl="x").verdict == "pass"
    assert judge("mismatch", ["gradient"], "", None, impl="x").verdict == "fail"
    assert judge("timeout", [], "", None, impl="x").verdict == "fail"
    assert judge("skipped", [], "", None, impl="x").verdict == "skip"
    assert judge("unsupported", [], "", None, impl="x").verdict == "skip"


def test_an_unsupported_cell_fails_an_impl_that_must_support_every_case():
    found = judge("unsupported", [], "", None, impl="torch", must_support_all=True, reason="nope")
    assert found == expectations.Judgement(
        "fail", "torch must support every valid case of its device, but declared this one unsupported: nope")


@pytest.mark.parametrize("body, message", [
    ('[[expect]]\nimpl = "torch"\n', "lacks reason"),
    ('[[expect]]\nimpl = "torch"\nreason = "r"\n', "names no cases: give facts"),
    ('[[expect]]\nimpl = "torch"\nreason = "r"\nlayout = "sideways"\n', "layout 'sideways' is none of default"),
    ('[[expect]]\nimpl = "torch"\nreason = "r"\nnested = "yes"\n', "nested must be true or false"),
    ('[[expect]]\nimpl = "torch"\nreason = "r"\nregions_pending = 0\n', "regions_pending must be a positive integer"),
    ('[[expect]]\nimpl = "torch"\nreason = "r"\nmode = "reentrant"\noutcome = ["pass", "error"]\n',
     "outcome 'pass' cannot stand beside failures"),
    ("[[expect]\n", "cannot read"),
    ('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\noutcome = "fail"\n', "outcome 'fail' is not one of"),
    ('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\noracles = ["gradients"]\n', "unknown oracle 'gradients'"),
    ('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\noutcome = "error"\noracles = ["gradient"]\n',
     "names oracles, which only a mismatch has"),
    ('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\nmessage = "x"\n', "has a message, which a mismatch has not"),
    ('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\noutcome = "error"\nmessage = "("\n',
     "is not a regular expression"),
    ('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\nwhy = "typo"\n', "unknown key 'why'"),
    ('[[expect]]\nimpl = "t"\ncases = []\nreason = "r"\n', "cases must be a string or a list of strings"),
])
def test_malformed_entries_are_one_line_errors(tmp_path, body, message):
    path = tmp_path / "e.toml"
    path.write_text(body)
    with pytest.raises(expectations.ExpectationError, match=message.replace("(", r"\(")):
        expectations.load(path)


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(expectations.ExpectationError, match="does not exist"):
        expectations.load(tmp_path / "missing.toml")


def test_an_entry_may_name_several_impls(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = ["torch", "bundled"]\ncases = ["*-tracked-*"]\nreason = "r"\n')
    entries = expectations.load(path)
    assert [e.impl for e in entries] == ["torch", "bundled"]
    assert expectations.find(entries, "bundled", "reentrant-tracked-eager-flat-none-cpu") is entries[1]
    assert expectations.entry_problems(entries, impls.registered()) == []


def test_a_pass_entry_shadows_broader_entries_and_expects_a_pass(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "torch"\ncases = ["*-(dropout_p0)-*"]\noutcome = "pass"\n'
                    'reason = "draws nothing"\n'
                    '[[expect]]\nimpl = "torch"\ncases = ["*-tracked-*"]\nreason = "tracker"\n')
    entries = expectations.load(path)
    entry = expectations.find(entries, "torch", "nonreentrant-tracked-eager-(dropout_p0)-none-cpu")
    assert entry is entries[0] and entry.expects_pass
    assert judge("pass", [], "", entry, impl="torch") == expectations.Judgement("pass")
    failed = judge("mismatch", ["live-stream"], "", entry, impl="torch")
    assert failed.verdict == "fail" and failed.note == "expected to pass (draws nothing), got mismatch"
    # The broader entry still claims the cells the pass entry does not name.
    assert expectations.find(entries, "torch", "nonreentrant-tracked-eager-flat-none-cpu") is entries[1]


def test_a_pass_entry_takes_neither_oracles_nor_a_message(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\noutcome = "pass"\nmessage = "x"\n')
    with pytest.raises(expectations.ExpectationError, match="has a message"):
        expectations.load(path)
    path.write_text('[[expect]]\nimpl = "t"\ncases = ["*"]\nreason = "r"\noutcome = "pass"\noracles = ["gradient"]\n')
    with pytest.raises(expectations.ExpectationError, match="names oracles"):
        expectations.load(path)


def test_a_record_under_a_pass_entry_expects_no_failure():
    from harness import impls
    from harness.model.cases import parse_case_id
    from harness.run import runner
    from harness.run.execution import Target, judged_record

    case = parse_case_id("nonreentrant-tracked-eager-(dropout_p0)-none-cpu")
    record = judged_record(runner.run(case, impls.load("torch")), Target("torch", impls.load("torch")),
                           expectations.load()).to_json()
    assert (record["outcome"], record["verdict"]) == ("pass", "pass")
    assert record["expected_failure"] == "" and record["expected_outcome"] == ""


def test_the_sdpa_kernel_error_comes_first_for_a_keyword_region_beside_it():
    # A fuzzer finding (H200, torch 2.11, `fuzz --impl torch --capture single --new-only --seed 1`):
    # a keyword region beside an sdpa_kernel(sdpa_math) region; torch's recompute check raises for
    # the sdpa_kernel one before the keyword region's masks could be compared, so the error entry
    # claims the case, not the keyword-closure mismatch (the file claimed it twice before).
    case = ("nonreentrant-default-single-(((native_dropout+native_dropout+native_dropout)+keyword(native_dropout"
            "+native_dropout+native_dropout)+sdpa_kernel(sdpa_math)))-none-cuda")
    entries = expectations.load()
    seen = ("CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors have different "
            "metadata than during the forward pass. tensor at position 0: saved metadata: ...")
    h200 = h200_torch_2_11()
    for impl in ("torch", "torch-partial", "torch-sac-recompute", "torch-checkpoint-wrapper"):
        entry = expectations.find(entries, impl, case, machine=h200)
        assert entry is not None and entry.name == "torch-sdpa-kernel-not-replayed", impl
        assert entry.also == ()  # the error comes first: the keyword region's mismatch never shows
    entry = expectations.find(entries, "torch", case, machine=h200)
    assert judge("error", [], seen, entry, impl="torch").verdict == "xfail"
    from harness.model.cases import parse_case_id

    claimed_twice = {line.split(":")[0] for line in expectations.conflicts(entries, [parse_case_id(case)])}
    assert not claimed_twice & {"torch", "torch-partial", "torch-sac-recompute", "torch-checkpoint-wrapper",
                                "torch-sac-titan"}
