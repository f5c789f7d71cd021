"""`python -m harness fuzz`: it finds and shrinks every negative control's bug on the CPU, finds
nothing for `bundled`, excludes known failures with --new-only, keeps findings in the corpus that
the default matrix replays, and refuses bad input in one line."""

from __future__ import annotations

import pytest

from harness.fronts import fuzz
from harness.fronts.cli import main
from harness.model import corpus
from harness.model.cases import CaseError, Device, parse_case_id
from harness.model.matrix import generate
from harness.results import Outcome
from harness.run.execution import load_targets
from harness.verdict import expectations

ENTRIES = expectations.load()
SEED = 20261203


def shrunk(impl: str, examples: int = 300, **options):
    [target] = load_targets([impl])
    return fuzz.fuzz(target, Device.CPU, ENTRIES, examples=examples, seed_value=SEED, database=None, **options)


# Control -> the most regions and sites its smallest failing program needs: one region with one
# site shows most bugs; no-restore needs a draw between forward and recompute (the interleave or a
# second region: Hypothesis may end in either), copied-alias a draw through each of the shared
# pair, two-slots three recomputes pending at once (three regions).
CPU_CONTROLS = {
    "neg-live-handles": (1, 1), "neg-no-restore": (2, 2), "neg-ignore-tracker": (1, 1),
    "neg-no-rewind": (1, 1), "neg-no-recompute": (1, 1), "neg-stale-rng": (1, 1),
    "neg-extra-draw": (1, 1), "neg-wrong-output": (1, 1), "neg-replace-streams": (1, 1),
    "neg-inert-fork": (1, 1), "neg-copied-alias": (1, 2), "neg-two-slots": (3, 2),
}


@pytest.mark.parametrize("impl", sorted(CPU_CONTROLS))
def test_the_fuzzer_finds_and_shrinks_each_controls_bug(impl):
    found = shrunk(impl)
    assert found.failure is not None, f"{impl}: no failure in {found.tried} programs"
    program = found.failure.result.case.program
    regions, sites = CPU_CONTROLS[impl]
    assert len(program.all_regions()) <= regions and len(program.sites()) <= sites, program.spec
    assert found.failure.record.outcome.value in ("mismatch", "error")
    [finding] = found.findings
    assert found.tried == finding.found_after + finding.shrink_steps


def test_host_values_needs_cuda_graphs_so_the_cpu_fuzzer_finds_nothing():
    """neg-host-values breaks only separate CUDA graphs with draws between them: on the CPU no
    program shows it (the GPU run proves the fuzzer finds it there)."""
    assert shrunk("neg-host-values", examples=25).failure is None


def test_the_smallest_program_of_two_slots_needs_three_regions():
    program = shrunk("neg-two-slots").failure.result.case.program
    assert len(program.all_regions()) == 3


def test_a_short_fuzz_of_bundled_finds_nothing(capsys):
    """What CI runs: a fixed seed, a few hundred programs."""
    status = main(["fuzz", "--impl", "bundled", "--device", "cpu", "--examples", "300", "--seed", str(SEED),
                   "--no-database", "--no-save"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "no failure in 300 programs, 300 judged (100 %; " in out  # bundled declares no limit on the CPU
    assert "drawn:" not in out


def test_new_only_skips_what_the_expectations_describe():
    """torch's reentrant keyword error is a known failure: found without --new-only, and with it
    whatever the fuzzer reports is a failure the expectations do not describe."""
    known = shrunk("torch", examples=100)
    assert known.failure is not None and known.failure.record.verdict == "xfail"
    new = shrunk("torch", examples=100, new_only=True)
    assert new.verdicts.get("xfail", 0) > 0
    assert new.failure is None or new.failure.record.verdict == "fail"


def test_new_only_torch_on_the_cpu_finds_no_new_kind_and_counts_the_known_by_their_entry(capsys):
    # Every known torch bug is one entry that matches what a case does (case_facts), so the
    # forms the fuzzer writes (containers nested in regions, tracked sites outside them) are
    # known, counted under the bug's name, never reported as new.
    status = main(["fuzz", "--impl", "torch", "--device", "cpu", "--examples", "60", "--seed", "1", "--new-only",
                   "--keep-going", "--no-database", "--no-save"])
    out = capsys.readouterr().out
    assert status == 0, out
    line = out.strip().splitlines()[-1]
    assert line.startswith("no new failure in 60 programs") and "known failures by entry: " in line
    assert "torch-reentrant-keyword x" in line and "torch-ignores-tracker x" in line
    assert "stale:" not in out


def test_keep_going_shrinks_each_kind_of_failure_once():
    """torch on the CPU fails in several ways (the keyword error, the tracker streams, ...): a run
    that keeps going reports each kind once and counts the rest as repeats."""
    found = shrunk("torch", examples=150, keep_going=True)
    kinds = [fuzz.signature(f.run.record) for f in found.findings]
    assert len(kinds) >= 2 and len(set(kinds)) == len(kinds)
    assert found.repeats > 0 and found.generated >= 150


def test_the_example_database_replays_a_failure_first(tmp_path):
    [target] = load_targets(["neg-no-rewind"])
    first = fuzz.fuzz(target, Device.CPU, ENTRIES, examples=50, seed_value=1, database=tmp_path)
    again = fuzz.fuzz(target, Device.CPU, ENTRIES, examples=50, seed_value=99, database=tmp_path)
    assert first.failure is not None and again.found_after == 1
    assert again.failure.result.case == first.failure.result.case


def test_the_command_prints_the_shrunk_program_and_adds_it_to_the_corpus(tmp_path, capsys):
    path = tmp_path / "corpus.toml"
    empty = tmp_path / "none.toml"  # no expectations: the control's failure is a new one
    empty.write_text("")
    args = ["fuzz", "--impl", "neg-no-rewind", "--device", "cpu", "--examples", "50", "--seed", "1",
            "--no-database", "--corpus", str(path), "--expectations", str(empty)]
    # a plain run writes nothing (a tracked corpus file must not change behind the user's back)
    assert main(args) == 1
    assert "corpus:  not saved (--save adds it" in capsys.readouterr().out and not path.exists()
    args.append("--save")
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "  program  (native_dropout)" in out and "recompute-mask" in out
    assert "rerun:   python -m harness repro 'reentrant-default-eager-(native_dropout)-none-cpu'" in out
    [finding] = corpus.load(path)
    assert (finding.case.id, finding.impl) == ("reentrant-default-eager-(native_dropout)-none-cpu", "neg-no-rewind")
    assert finding.outcome.startswith("mismatch: ")
    assert main(args) == 1 and "already in" in capsys.readouterr().out
    assert len(corpus.load(path)) == 1


@pytest.mark.parametrize("args, message", [
    (["--examples", "0"], "--examples must be at least 1"),
    (["--budget", "-1"], "--budget must be a positive number of seconds"),
    (["--budget", "nan"], "--budget must be a positive number of seconds"),
    (["--budget", "inf"], "--budget must be a positive number of seconds"),
    (["--impl", "nope"], "nope"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert main(["fuzz", "--device", "cpu", "--no-database", "--no-save", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_budget_and_examples_are_exclusive():
    with pytest.raises(SystemExit) as info:
        main(["fuzz", "--budget", "5", "--examples", "5"])
    assert info.value.code == 2


def test_the_default_matrix_replays_the_corpus(tmp_path, monkeypatch):
    path = tmp_path / "corpus.toml"
    case = parse_case_id("nonreentrant-mixed-eager-x3:(rand@d+randn@t)+normal_-draws-cpu")
    assert corpus.append(case, "torch", "mismatch: gradient", path)
    monkeypatch.setattr(corpus, "DEFAULT_PATH", path)
    assert case in list(generate(device="cpu"))
    assert case not in list(generate(device="cuda"))


def test_a_malformed_corpus_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "corpus.toml"
    path.write_text('[[finding]]\ncase = "reentrant-default-eager-(rand@t)-none-cpu"\nimpl = "torch"\n'
                    'outcome = "x"\nfound = "2026-12-03"\n')
    monkeypatch.setattr(corpus, "DEFAULT_PATH", path)
    with pytest.raises(CaseError, match="finding 1: invalid case .* draws from t"):
        list(generate(device="cpu"))


def test_the_shipped_corpus_loads_and_its_cases_are_valid():
    for finding in corpus.load():
        assert parse_case_id(finding.case.id) == finding.case


class _Run:
    """A stand-in CaseRun: a case, an outcome and mismatch lines."""

    def __init__(self, case_id: str, outcome: str, lines: list[str]) -> None:
        from types import SimpleNamespace

        mismatches = [SimpleNamespace(message=lambda line=line: line) for line in lines]
        self.result = SimpleNamespace(case=parse_case_id(case_id), mismatches=mismatches)
        self.record = SimpleNamespace(outcome=outcome)


def test_a_failure_of_a_nondeterministic_backward_must_repeat_bit_for_bit():
    flash = "reentrant-default-eager-(sdpa_flash.f16)-none-cuda"
    first = _Run(flash, "mismatch", ["gradient input iteration 0: got 1, expected 2"])
    assert fuzz._repeats(first, lambda: _Run(flash, "mismatch", ["gradient input iteration 0: got 1, expected 2"]))
    assert not fuzz._repeats(first, lambda: _Run(flash, "mismatch", ["gradient input iteration 0: got 3, expected 2"]))
    assert not fuzz._repeats(first, lambda: _Run(flash, "pass", []))


def test_a_device_out_of_memory_is_counted_apart_and_never_a_finding(capsys):
    status = main(["fuzz", "--impl", "faulty_adapters:make_out_of_memory", "--device", "cpu", "--examples", "5",
                   "--seed", str(SEED), "--no-database", "--no-save", "--no-isolate"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "no failure in 5 programs" in out and "5 failures the device's running out of memory, not counted" in out


def test_a_deterministic_case_is_not_run_again():
    for case_id in ("reentrant-default-eager-(native_dropout)-none-cuda", "reentrant-default-eager-(rand)-none-cpu"):
        run = _Run(case_id, "mismatch", ["x"])
        assert fuzz._repeats(run, lambda: pytest.fail("ran again"))


def test_a_known_bug_is_never_saved_to_the_corpus(tmp_path, capsys):
    # the control's bug is an entry of the expectations file: found, reported as known, and not
    # written anywhere even with --save
    path = tmp_path / "corpus.toml"
    assert main(["fuzz", "--impl", "neg-no-rewind", "--device", "cpu", "--examples", "50", "--seed", "1",
                 "--no-database", "--save", "--corpus", str(path)]) == 1
    out = capsys.readouterr().out
    assert "known failures by entry" in out and "corpus:" not in out
    assert not path.exists()


# --- searches side by side (--jobs N) -------------------------------------------------------------


def test_searches_side_by_side_find_the_bug_once_and_stop_each_other():
    from harness.run.isolation import CaseWorker

    [target] = load_targets(["neg-no-rewind"])
    workers = [CaseWorker(120), CaseWorker(120)]
    try:
        found = fuzz.fuzz_parallel(target, Device.CPU, ENTRIES, workers, examples=40, seed_value=SEED,
                                   database=None)
    finally:
        for worker in workers:
            worker.close()
    assert len(found.findings) == 1  # one kind, however many searches met it
    assert found.findings[0].run.record.outcome.value == "mismatch"
    assert found.tried == sum(found.verdicts.values()) and found.generated < 40  # the first failure halted both


def test_searches_side_by_side_need_a_process_each():
    [target] = load_targets(["bundled"])
    with pytest.raises(ValueError, match="isolated worker each"):
        fuzz.fuzz_parallel(target, Device.CPU, ENTRIES, [None, None], examples=4, database=None)


def test_merged_results_add_up_and_keep_one_finding_per_kind():
    done = shrunk("neg-no-rewind", examples=30)
    [finding] = done.findings
    late = fuzz.Finding(finding.run, 9, finding.found_seconds + 1.0, 2, 0.5)
    first = fuzz.FuzzResult(tried=5, generated=4, verdicts={"pass": 3, "fail": 2}, findings=[finding],
                            known={"entry 1": 2}, stale=["a (e)"], judged=5, declined={"no": 2})
    second = fuzz.FuzzResult(tried=7, generated=7, verdicts={"fail": 1, "xfail": 6}, findings=[late],
                             known={"entry 1": 1, "entry 2": 5}, repeats=1, noisy=1, judged=6,
                             declined={"no": 1, "never": 4})
    total = fuzz.merged([second, first], 3.0)
    assert (total.tried, total.generated, total.seconds) == (12, 11, 3.0)
    assert total.judged == 11 and total.judged_percent == 91 and total.declined == {"no": 3, "never": 4}
    assert total.verdicts == {"pass": 3, "fail": 3, "xfail": 6}
    assert total.known == {"entry 1": 3, "entry 2": 5} and total.stale == ["a (e)"]
    assert total.findings == [finding] and total.repeats == 2 and total.noisy == 1  # the later one is a repeat


@pytest.mark.parametrize("extra, message", [
    (["--jobs", "0"], "--jobs must be at least 1"),
    (["--jobs", "2", "--no-isolate"], "--jobs runs isolated workers"),
    (["--jobs", "3", "--examples", "2"], "cannot be shared among --jobs 3"),
])
def test_fuzz_jobs_refuses_bad_input_in_one_line(extra, message, capsys):
    assert main(["fuzz", "--impl", "bundled", "--device", "cpu", "--no-database", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# --- what differs in a failure, and repeats grouped by it (issue 40, item 3) --------------------


def _record(case_id: str, mismatches: list[tuple[str, str]]):
    from harness.results import CaseRecord

    found = [{"oracle": oracle, "subject": subject, "iteration": 0, "count": 1, "total": 4}
             for oracle, subject in mismatches]
    return CaseRecord.from_json({"impl": "torch", "case_id": case_id, "outcome": "mismatch", "mismatches": found})


def test_what_differs_names_the_drawing_sites_by_op_and_stream_and_the_streams_that_end_elsewhere():
    case = parse_case_id("nonreentrant-mixed-eager-(rand+native_dropout)-none-cpu")  # s0 on d, s1 on t
    record = _record(case.id, [("recompute-mask", "s1 (recompute 2 of 2)"), ("recompute-mask", "s1"),
                               ("gradient", "input"), ("live-stream", "tracker:model-parallel-rng")])
    assert fuzz.differs(record, case) == ("gradient; live-stream: tracker:model-parallel-rng; "
                                          "recompute-mask: native_dropout@t")
    error = _record(case.id, [])
    error.outcome, error.error = Outcome.ERROR, "ValueError: not enough values to unpack"
    assert fuzz.differs(error, case) == "error: ValueError"


def test_repeats_of_one_kind_are_grouped_by_what_differs():
    from types import SimpleNamespace

    def run(case_id: str, site: str):
        case = parse_case_id(case_id)
        return SimpleNamespace(record=_record(case_id, [("recompute-mask", site), ("gradient", "input")]),
                               result=SimpleNamespace(case=case))

    found = fuzz.FuzzResult()
    tracked = "nonreentrant-tracked-eager-(rand)-none-cpu"
    default = "nonreentrant-default-eager-(bernoulli_)-none-cpu"
    for repeat in (run(tracked, "s0"), run(tracked, "s0"), run(default, "s0")):
        fuzz._count_repeat(found, repeat)
    assert found.repeats == 3
    assert fuzz.repeat_lines(found, run(tracked, "s0").record) == [
        "2 x gradient; recompute-mask: rand@t", "1 x gradient; recompute-mask: bernoulli_@d"]
    other_kind = _record(tracked, [("live-stream", "cpu")])
    assert fuzz.repeat_lines(found, other_kind) == []


def test_a_new_failure_that_an_entry_expects_says_which_entry_it_looks_like(capsys, tmp_path):
    # torch's tracker bug in a layout its entry's scope leaves out (here the entry is scoped to the
    # mixed layout, the case is tracked): no entry claims the cell, so it is a failure, and the
    # entry whose model alone predicts just this failure is named beside it.
    from harness.fronts import cli
    from harness.run.execution import run_case

    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nname = "tracker-bug"\nimpl = "torch"\nlayout = "mixed"\n'
                    'model = { behaviour = "unsaved-streams", streams = "tracker" }\nreason = "r"\n')
    entries = expectations.load(path)
    [target] = load_targets(["torch"])
    case = parse_case_id("nonreentrant-tracked-eager-(native_dropout)-none-cpu")
    run = run_case(target, case, entries)
    assert run.record.verdict.value == "fail" and not run.record.expected_entry
    like = cli._print_finding(fuzz.Finding(run, 1, 0.1, 0, 0.0), fuzz.FuzzResult(), entries, 1, 1, "torch")
    assert like == "tracker-bug"  # counted in the run's last line
    out = capsys.readouterr().out
    assert "  like     tracker-bug: that entry expects this failure, but its cases do not " in out
    # a failure no entry expects gets no such line
    [control] = load_targets(["neg-wrong-output"])
    other = run_case(control, parse_case_id("nonreentrant-default-eager-flat-none-cpu"), [])
    assert cli._print_finding(fuzz.Finding(other, 1, 0.1, 0, 0.0), fuzz.FuzzResult(), [], 1, 1,
                              "neg-wrong-output") is None
    assert "  like " not in capsys.readouterr().out
