"""Known bugs as models (issue 40): each behaviour's prediction on small cases, checked against what
the impl it describes really does on the CPU, their composition, and malformed model tables."""

from __future__ import annotations

import pytest
from machines import h200_torch_2_11

from harness import impls
from harness.model.cases import parse_case_id
from harness.run import runner
from harness.verdict import expectations
from harness.verdict.models import Machine, Model, ModelError, parse_model, predict


def model(**raw) -> Model:
    return parse_model(raw, "test")


def predicted(case_id: str, *models: Model, machine: Machine | None = None) -> tuple:
    found = predict(list(models), parse_case_id(case_id), machine or Machine(probe=False))
    return (found.outcome, found.oracles) if found.outcome != "error" else (found.outcome, found.message)


TRACKER = model(behaviour="unsaved-streams", streams="tracker")
EVERY_STREAM = model(behaviour="unsaved-streams", streams="all")
NO_RESTORE = model(behaviour="not-restored", streams="all")
EARLY = model(behaviour="early-stop")
ALL_FIVE = ("forward-mask", "recompute-mask", "gradient", "live-stream", "output")


def test_an_unsaved_stream_fails_where_a_region_draws_it_and_nowhere_else():
    assert predicted("nonreentrant-tracked-eager-flat-none-cpu", TRACKER) == ("mismatch", ALL_FIVE)
    assert predicted("nonreentrant-default-eager-flat-none-cpu", TRACKER) == ("pass", ())
    # drawn outside every region only: no recompute draws it
    assert predicted("nonreentrant-mixed-eager-(native_dropout@d)+native_dropout@t-none-cpu", TRACKER) == ("pass", ())
    assert predicted("nonreentrant-tracked-eager-(dropout_p0)-none-cpu", TRACKER) == ("pass", ())  # draws nothing
    # one iteration: no later forward to show the stream ahead
    assert predicted("nonreentrant-tracked-eager-x2:(native_dropout)-none-cpu", TRACKER)[1] == ALL_FIVE


def test_an_unsaved_stream_scoped_by_passing_leaves_other_regions_alone():
    keyword = model(behaviour="unsaved-streams", streams="device", passing=["keyword", "closure"])
    assert predicted("nonreentrant-default-eager-(native_dropout)-none-cuda", keyword) == ("pass", ())
    assert predicted("nonreentrant-default-eager-keyword(native_dropout)-none-cuda", keyword)[0] == "mismatch"
    # an inner positional region inside a keyword one: its recompute inherits the live stream
    assert predicted("nonreentrant-default-eager-keyword((native_dropout))-none-cuda", keyword)[0] == "mismatch"


def test_a_stream_left_where_the_recompute_ended_shows_only_once_something_draws_in_between():
    assert predicted("nonreentrant-default-eager-flat-none-cpu", NO_RESTORE) == ("pass", ())
    assert predicted("nonreentrant-default-eager-flat-draws-cpu", NO_RESTORE)[0] == "mismatch"
    assert predicted("nonreentrant-default-eager-siblings-none-cpu", NO_RESTORE)[0] == "mismatch"
    # a region that draws nothing, with interleaved draws: the rewind loses them
    assert predicted("nonreentrant-default-eager-(dropout_p0)-draws-cpu", NO_RESTORE) == ("mismatch", ("live-stream",))


HOST_REWIND = model(behaviour="host-rewind")
OWN_PAIRS = model(behaviour="host-rewind", per_capture=True)


def test_a_host_side_rewind_across_separate_graphs_holds_only_while_nothing_refills_the_device_offset():
    # torch <= 2.13: the graphs share one device seed/offset pair; a graph with an increment refills it
    assert predicted("nonreentrant-default-separate-(native_dropout)-none-cuda", HOST_REWIND) == ("pass", ())
    assert predicted("nonreentrant-default-separate-(native_dropout)-draws-cuda", HOST_REWIND) == (
        "mismatch", ("recompute-mask", "gradient"))
    # the trait changes nothing eagerly or in one graph
    assert predicted("nonreentrant-default-eager-(native_dropout)-draws-cuda", HOST_REWIND) == ("pass", ())
    assert predicted("nonreentrant-default-single-(native_dropout)-draws-cuda", HOST_REWIND) == ("pass", ())
    # torch >= 2.14: every graph has its own pair, filled at every replay
    assert predicted("nonreentrant-default-separate-(native_dropout)-none-cuda", OWN_PAIRS) == (
        "mismatch", ("recompute-mask", "gradient"))
    assert predicted("nonreentrant-default-separate-(dropout_p0)-none-cuda", OWN_PAIRS) == ("pass", ())


def test_a_recompute_left_moved_gives_the_backward_graph_an_increment():
    # eagerly a region drawing nothing loses the interleaved draws (above); in separate graphs the
    # backward graph's offset ends where the first region began (0): no increment, nothing moves
    assert predicted("reentrant-default-separate-(dropout_p0)-draws-cuda", NO_RESTORE, HOST_REWIND) == ("pass", ())
    assert predicted("reentrant-default-separate-(nodraw)+(native_dropout)-draws-cuda", NO_RESTORE, HOST_REWIND) == (
        "mismatch", ("recompute-mask", "gradient"))
    # a region that draws leaves it moved: the backward graph's replay refills the pair and moves
    # the host offset, so every later forward draws elsewhere
    assert predicted("nonreentrant-default-separate-x2:(native_dropout)-none-cuda", NO_RESTORE, HOST_REWIND) == (
        "mismatch", ALL_FIVE)


KEYED = model(behaviour="input-keyed-snapshots")
GROUPED = model(behaviour="grouped-input-gradient")


def test_snapshots_keyed_by_the_input_tensor_collide_only_where_two_regions_read_one_tensor():
    # (a)&(b): both read the program's input; the later snapshot (after a drew) replaces the earlier
    assert predicted("nonreentrant-default-eager-(native_dropout)&(native_dropout)-none-cpu", KEYED) == (
        "mismatch", ("recompute-mask", "gradient"))
    assert predicted("nonreentrant-default-eager-(native_dropout)+(native_dropout)-none-cpu", KEYED) == ("pass", ())
    # a closure region passes no tensor: it keeps its own snapshot
    assert predicted("nonreentrant-default-eager-(native_dropout)&closure(native_dropout)-none-cpu", KEYED) == (
        "pass", ())
    # an inner region reading an intermediate of its enclosing region shares no key with a later one
    assert predicted("nonreentrant-default-eager-(native_dropout+native_dropout&(native_dropout))+(native_dropout)"
                     "-none-cpu", KEYED) == ("pass", ())
    # under capture the control is bundled
    assert predicted("nonreentrant-default-separate-(native_dropout)&(native_dropout)-none-cuda", KEYED) == (
        "pass", ())


def test_an_input_gradient_summed_inside_the_region_differs_only_with_a_later_reader_beside_it():
    assert predicted("nonreentrant-default-eager-(native_dropout&native_dropout+native_dropout)&native_dropout"
                     "-none-cuda", GROUPED) == ("mismatch", ("gradient",))
    # no later reader (the earlier one's term comes last in the reference too), or one read inside
    assert predicted("nonreentrant-default-eager-native_dropout&(native_dropout&native_dropout)-none-cuda",
                     GROUPED) == ("pass", ())
    assert predicted("nonreentrant-default-eager-(native_dropout+native_dropout)&native_dropout-none-cuda",
                     GROUPED) == ("pass", ())


def test_a_context_the_recompute_misses_changes_nothing_in_a_region_backward_never_recomputes():
    sdpa = model(behaviour="context-not-replayed", context="sdpa_kernel")
    invisible = model(behaviour="input-invisible", passing="keyword", message="^RuntimeError")
    case = "reentrant-default-eager-((native_dropout)&keyword(sdpa_kernel(sdpa_flash.bf16+native_dropout)))-none-cuda"
    alone = predicted(case, sdpa, machine=h200_torch_2_11())
    assert alone[0] == "mismatch" and "recompute-mask" in alone[1]
    assert predicted(case, invisible, sdpa, machine=h200_torch_2_11()) == ("mismatch", ("gradient",))


def test_a_saved_first_rng_op_shifts_the_next_draw_of_its_stream_only():
    first = model(behaviour="saved-rng-ops", first=True)
    assert predicted("nonreentrant-default-eager-(native_dropout+native_dropout)-none-cpu", first, EARLY) == (
        "mismatch", ("recompute-mask", "gradient"))
    assert predicted("nonreentrant-default-eager-(native_dropout)-none-cpu", first, EARLY) == ("pass", ())
    # the next draw is on another stream: nothing shifts
    assert predicted("nonreentrant-mixed-eager-(native_dropout+native_dropout)-none-cpu", first, EARLY) == ("pass", ())


def test_a_saved_in_place_rng_op_raises_and_the_error_wins_over_any_mismatch():
    first = model(behaviour="saved-rng-ops", first=True, mutated_message="^RuntimeError: Tensor cached")
    assert predicted("nonreentrant-tracked-eager-(bernoulli_+native_dropout)-none-cpu", first, TRACKER) == (
        "error", "^RuntimeError: Tensor cached")


def test_an_input_a_reentrant_checkpoint_cannot_see():
    invisible = model(behaviour="input-invisible", passing=["list", "dict"], message="^RuntimeError")
    # nothing after it: backward raises at once
    assert predicted("reentrant-default-eager-list(native_dropout)-none-cpu", invisible)[0] == "error"
    # a site after it: the gradients are silently missing, and its site is never recomputed
    assert predicted("reentrant-default-eager-list(native_dropout)+native_dropout-none-cpu", invisible) == (
        "mismatch", ("recompute-mask", "gradient"))
    # inside a region whose recompute reruns it: drawn again there, so only the gradients
    assert predicted("reentrant-default-eager-(list(native_dropout)+native_dropout)-none-cpu", invisible) == (
        "mismatch", ("gradient",))
    assert predicted("nonreentrant-default-eager-list(native_dropout)-none-cpu", invisible) == ("pass", ())


def test_a_context_the_recompute_does_not_replay_depends_on_what_this_machine_picks():
    context = model(behaviour="context-not-replayed", context="sdpa_kernel", message="^CheckpointError")
    h200 = h200_torch_2_11()
    pinned_math = "nonreentrant-default-eager-(sdpa_kernel(sdpa_math))-none-cuda"
    assert predicted(pinned_math, context, machine=h200) == ("error", "^CheckpointError")
    # memory-efficient is the H200's own choice for float32: nothing differs
    assert predicted("nonreentrant-default-eager-(sdpa_kernel(sdpa_efficient))-none-cuda", context,
                     machine=h200) == ("pass", ())
    assert predicted("reentrant-default-eager-(sdpa_kernel(sdpa_math))-none-cuda", context, machine=h200) == (
        "mismatch", ("recompute-mask", "gradient"))
    # a machine that cannot be asked does not know: no difference is claimed
    assert predicted(pinned_math, context, machine=Machine(probe=False)) == ("pass", ())
    # the CPU picks math with dropout (no difference) and flash without (asked of this torch)
    assert predicted("nonreentrant-default-eager-(sdpa_kernel(sdpa_math))-none-cpu", context,
                     machine=Machine()) == ("pass", ())
    assert predicted("nonreentrant-default-eager-(sdpa_kernel(sdpa_math+sdpa_auto))-none-cpu", context,
                     machine=Machine())[0] == "error"


def test_what_a_recompute_on_another_backend_raises_can_depend_on_the_forward_backend():
    # TransformerEngine's frame hands back the recompute's saved tensors by position: on the H100
    # (TE loaded: flash for half precision, memory-efficient for float32) math and memory-efficient
    # attention's backward raise, cuDNN's takes flash's tensors silently
    by_backend = model(behaviour="context-not-replayed", context="sdpa_kernel",
                       raises_from={"math": "^RuntimeError: Only Tensors", "efficient": "^RuntimeError: expected"})
    h100_te = Machine({"sdpa.cuda.f32.small.dropout": "efficient", "sdpa.cuda.bf16.small.dropout": "flash",
                       "sdpa.cuda.f16.small.dropout": "flash"}, probe=False)
    assert predicted("nonreentrant-default-eager-(sdpa_kernel(sdpa_math))-none-cuda", by_backend,
                     machine=h100_te) == ("error", "^RuntimeError: Only Tensors")
    assert predicted("nonreentrant-default-eager-bf16:(sdpa_kernel(sdpa_efficient))-none-cuda", by_backend,
                     machine=h100_te) == ("error", "^RuntimeError: expected")
    assert predicted("nonreentrant-default-eager-f16:(sdpa_kernel(sdpa_cudnn))-none-cuda", by_backend,
                     machine=h100_te) == ("mismatch", ("recompute-mask", "gradient"))
    # the backend the machine picks itself changes nothing; `message` stands for the backends not named
    assert predicted("nonreentrant-default-eager-f16:(sdpa_kernel(sdpa_flash))-none-cuda", by_backend,
                     machine=h100_te) == ("pass", ())
    with_default = model(behaviour="context-not-replayed", context="sdpa_kernel", message="^Other",
                         raises_from={"math": "^RuntimeError: Only Tensors"})
    assert predicted("nonreentrant-default-eager-f16:(sdpa_kernel(sdpa_cudnn))-none-cuda", with_default,
                     machine=h100_te) == ("error", "^Other")
    assert "raises_from=math" in with_default.describe()


@pytest.mark.parametrize("impl, case_id", [
    ("neg-ignore-tracker", "nonreentrant-mixed-eager-siblings-draws-cpu"),
    ("neg-no-rewind", "reentrant-shared-eager-nested-none-cpu"),
    ("neg-no-restore", "reentrant-default-eager-(native_dropout)+(native_dropout)-none-cpu"),
    ("neg-no-restore", "nonreentrant-default-eager-((native_dropout))-draws-cpu"),
    ("neg-extra-draw", "nonreentrant-mixed-eager-deep-none-cpu"),
    ("neg-stale-rng", "nonreentrant-default-eager-x3:(native_dropout)-none-cpu"),
    ("torch", "nonreentrant-tracked-eager-deep-none-cpu"),
    ("torch", "reentrant-tracked-eager-list(native_dropout)+(native_dropout)-none-cpu"),
    ("torch", "reentrant-tracked-eager-(native_dropout)+list(native_dropout)+native_dropout-none-cpu"),
    ("torch", "reentrant-tracked-eager-list(native_dropout)&(native_dropout)-none-cpu"),
    ("torch-sac-save-first-rng", "nonreentrant-default-eager-((native_dropout+native_dropout)+rand)-none-cpu"),
    # the saved first draw shifts the inner region's rerun in the outer recompute: the outer
    # region's own later site reads it (gradient) only in sequence, not beside it in one group
    # (the H100's torch-sac-titan records: attention saved, a nested dropout beside dropout_p0)
    ("torch-sac-save-first-rng", "nonreentrant-default-eager-((native_dropout+(native_dropout)&nodraw))-none-cpu"),
    ("torch-sac-save-first-rng", "nonreentrant-default-eager-((native_dropout+(native_dropout)+nodraw))-none-cpu"),
    ("torch-sac-titan", "nonreentrant-tracked-eager-(rand+(native_dropout))-none-cpu"),
    ("neg-id-pool", "nonreentrant-default-eager-(native_dropout)&(native_dropout)-none-cpu"),
    ("neg-id-pool", "nonreentrant-default-eager-(native_dropout)&closure(native_dropout)-none-cpu"),
    ("neg-id-pool", "reentrant-default-eager-(native_dropout+native_dropout&(native_dropout))+(native_dropout)"
                    "-none-cpu"),
    # reentrant: the outer recompute calls r2 and r3 again with one new tensor, and they collide again
    ("neg-id-pool", "reentrant-mixed-eager-f16.odd.x3:autocast(autocast(dict(randperm.bf16)&keyword(bernoulli_@t"
                    "+randn_like.f32))+randperm.f32@t)+keyword(native_dropout&native_dropout)-draws-cpu"),
    ("neg-id-pool", "nonreentrant-default-eager-(native_dropout+native_dropout&(native_dropout+(native_dropout)"
                    "+native_dropout))+(native_dropout)+(native_dropout)-none-cpu"),
])
def test_the_prediction_is_what_the_impl_does(impl, case_id):
    # The models against the real thing: the oracles a model predicts are those the run fires
    # (the prediction names every oracle it expects; the run must fire exactly those of them that
    # are RNG oracles, and the model must not predict a failure where the run passes).
    case = parse_case_id(case_id)
    entry = expectations.find(expectations.load(), impl, case)
    result = runner.run(case, impls.load(impl))
    fired = {m.oracle for m in result.mismatches}
    if entry is None:
        assert result.outcome.value == "pass", (result.outcome, fired)
        return
    assert entry.prediction is not None, entry.label
    assert result.outcome.value == entry.outcome, (result.outcome, result.error, fired)
    if entry.outcome == "mismatch":
        assert set(entry.oracles) == fired - {"ambient", "identity", "buffer"}, (entry.oracles, fired)


def test_composition_says_which_entries_decide():
    # torch in a tracked reentrant case with a list region after a positional one: the list region's
    # error (nothing after it) comes before any tracker mismatch could show
    entries = expectations.load()

    def find(program: str):
        return expectations.find(entries, "torch", f"reentrant-tracked-eager-{program}-none-cpu")

    entry = find("(native_dropout)+list(native_dropout)")
    assert entry.name == "torch-reentrant-container" and entry.outcome == "error"
    # with a site after it, no gradient reaches the first region: it is never recomputed, so the
    # tracker bug cannot show there; the container's mismatch alone
    entry = find("(native_dropout)+list(native_dropout)+native_dropout")
    assert (entry.name, entry.outcome, entry.oracles, entry.also) == (
        "torch-reentrant-container", "mismatch", ("recompute-mask", "gradient"), ())
    # the other way round, the second region's input does not require grad either: backward raises
    entry = find("list(native_dropout)+(native_dropout)")
    assert (entry.name, entry.outcome) == ("torch-reentrant-container", "error")
    # side by side, the positional region is recomputed with the tracker live: both show
    entry = find("list(native_dropout)&(native_dropout)")
    assert entry.outcome == "mismatch" and entry.also == ("torch-ignores-tracker",), entry
    assert entry.oracles == ALL_FIVE


@pytest.mark.parametrize("raw, message", [
    ({"streams": "tracker"}, "must be a table with a behaviour"),
    ({"behaviour": "nope"}, "behaviour 'nope' is none of"),
    ({"behaviour": "unsaved-streams"}, "needs streams"),
    ({"behaviour": "unsaved-streams", "streams": "gpu"}, "streams 'gpu' is none of"),
    ({"behaviour": "unsaved-streams", "streams": "tracker", "oracles": ["x"]}, "has no parameter 'oracles'"),
    ({"behaviour": "saved-rng-ops"}, "needs one of ops"),
    ({"behaviour": "saved-rng-ops", "first": True, "every": True}, "needs one of ops"),
    ({"behaviour": "refuses-input", "passing": "keyword", "message": "("}, "is not a regular expression"),
    ({"behaviour": "context-not-replayed", "context": "sdpa_kernel", "raises_from": "x"}, "must be a table"),
    ({"behaviour": "context-not-replayed", "context": "sdpa_kernel", "raises_from": {"fast": "x"}},
     "raises_from 'fast' is none of"),
    ({"behaviour": "context-not-replayed", "context": "sdpa_kernel", "raises_from": {"math": "("}},
     "is not a regular expression"),
])
def test_a_malformed_model_is_one_line(raw, message):
    with pytest.raises(ModelError, match=message):
        parse_model(raw, "entry 1")


def test_an_entry_with_a_model_says_no_outcome_of_its_own(tmp_path):
    path = tmp_path / "e.toml"
    path.write_text('[[expect]]\nimpl = "torch"\nmodel = { behaviour = "unsaved-streams", streams = "tracker" }\n'
                    'oracles = ["gradient"]\nreason = "r"\n')
    with pytest.raises(expectations.ExpectationError, match="has a model and oracles"):
        expectations.load(path)
    path.write_text('[[expect]]\nimpl = "torch"\nmodel = { behaviour = "early" }\nreason = "r"\n')
    with pytest.raises(expectations.ExpectationError, match="behaviour 'early' is none of"):
        expectations.load(path)


def test_expectations_diff_lists_the_cells_another_file_claims_otherwise(tmp_path, capsys):
    from harness.fronts.cli import main

    h200 = ["--machine", "cases/machines/h200-torch2.11.json", "--device", "cpu"]
    same = main(["expectations", "diff", str(expectations.DEFAULT_PATH), *h200])
    assert same == 0 and capsys.readouterr().out.strip().endswith("0 claimed differently (none)")
    # the negative control: the tracker model scoped to one layout claims fewer cells
    text = expectations.DEFAULT_PATH.read_text()
    narrowed = text.replace('model = { behaviour = "unsaved-streams", streams = "tracker" }',
                            'layout = "mixed"\nmodel = { behaviour = "unsaved-streams", streams = "tracker" }', 1)
    assert narrowed != text
    path = tmp_path / "old.toml"
    path.write_text(narrowed)
    assert main(["expectations", "diff", str(path), *h200]) == 1
    out = capsys.readouterr().out
    assert "torch (cpu): nothing  ->  mismatch (forward-mask, recompute-mask, gradient, live-stream, output)" in out
    bad = tmp_path / "facts.json"
    bad.write_text("{")
    assert main(["expectations", "diff", str(path), "--machine", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot read machine facts {bad}")


# --- behaviours of deepspeed-partition (issue 41) and error order -----------------------------------


EMPTIED = model(behaviour="emptied-argument")


@pytest.mark.parametrize("spec, expected", [
    ("(closure(native_dropout))", ("mismatch", ("recompute-mask", "gradient"))),  # the owner never recomputes
    ("(closure(closure(native_dropout)))", ("mismatch", ("recompute-mask", "gradient"))),
    ("(closure(nodraw))+native_dropout", ("mismatch", ("gradient",))),  # no draw: only the gradient
    ("(native_dropout&closure(native_dropout))", ("mismatch", ("recompute-mask", "gradient"))),
    ("(closure(native_dropout)+native_dropout)", ("pass", ())),  # the owner recomputes first, refills it
    ("(native_dropout+closure(native_dropout))", ("pass", ())),  # it reads a site's output, not the argument
    ("autocast(closure(native_dropout))", ("pass", ())),  # autocast's body reads its matmul's output
    ("closure(native_dropout)", ("pass", ())),  # the program's input is nobody's argument
])
def test_a_closure_reading_an_emptied_argument_recomputes_wrong_until_its_owner_refills_it(spec, expected):
    assert predicted(f"nonreentrant-default-eager-{spec}-none-cpu", EMPTIED) == expected


@pytest.mark.parametrize("spec, expected", [
    ("(closure(multinomial))", ("error", "^scalar")),  # an op that needs dimensions gets the scalar
    ("((closure(sdpa_auto)))", ("error", "^scalar")),
    ("(closure((native_dropout)+native_dropout))", ("error", "^call")),  # a region called on it returns unlike it
    ("(closure(autocast(native_dropout)+native_dropout))", ("error", "^call")),  # an autocast region's matmul
    ("(closure(native_dropout+multinomial))", ("mismatch", ("recompute-mask", "gradient"))),  # a site hands on
    ("(closure(native_dropout+(native_dropout)))", ("mismatch", ("recompute-mask", "gradient"))),  # its weight's shape
])
def test_what_first_meets_the_emptied_scalar_decides_between_an_error_and_a_silent_mismatch(spec, expected):
    emptied = model(behaviour="emptied-argument", message="^call", scalar_message="^scalar")
    assert predicted(f"nonreentrant-default-eager-{spec}-none-cpu", emptied) == expected


def test_an_input_refused_at_the_recompute_lets_the_forward_through_and_raises_where_backward_recomputes():
    refused = model(behaviour="refuses-input", passing=["list", "dict"], recompute=True, message="^TypeError")
    assert predicted("nonreentrant-default-eager-list(native_dropout)-none-cpu", refused) == ("error", "^TypeError")
    # a list region with no site of its own never recomputes on its own: nothing raises
    assert predicted("nonreentrant-default-eager-(list((native_dropout)))-none-cpu", refused) == ("pass", ())


def test_an_autocast_matmul_error_comes_after_the_recomputes_of_the_regions_inside():
    refused = model(behaviour="refuses-input", passing="list", recompute=True, message="^TypeError")
    autocast = model(behaviour="context-not-replayed", context="autocast", message="^RuntimeError: expected m1")
    case = "nonreentrant-default-eager-(autocast(native_dropout+list(native_dropout)+native_dropout))-none-cpu"
    assert predicted(case, autocast, refused) == ("error", "^TypeError")  # seen on two CPU ranks, deepspeed 0.19.8
    assert predicted(case, autocast) == ("error", "^RuntimeError: expected m1")


def test_an_autocast_region_entered_in_another_dtype_raises_in_its_recompute_before_the_regions_inside():
    refused = model(behaviour="refuses-input", passing="list", recompute=True, message="^TypeError")
    autocast = model(behaviour="context-not-replayed", context="autocast", message="^RuntimeError: expected m1")
    case = "nonreentrant-default-eager-(native_dropout.bf16+autocast(list(native_dropout)+native_dropout))-none-cpu"
    assert predicted(case, autocast, refused) == ("error", "^RuntimeError: expected m1")  # two CPU ranks, 0.19.8


def test_the_cpu_math_attention_recomputed_in_another_dtype_redraws_and_raises_nothing():
    autocast = model(behaviour="context-not-replayed", context="autocast", message="^RuntimeError: expected m1",
                     attention_message="^RuntimeError: attention")
    # seen with deepspeed 0.19.8 on the CPU: a mismatch in a bfloat16 program, the matmul's error in a float32 one
    assert predicted("nonreentrant-default-eager-bf16:autocast(native_dropout+native_dropout+sdpa_math.f32)-none-cpu",
                     autocast) == ("mismatch", ("recompute-mask", "gradient"))
    assert predicted("nonreentrant-default-eager-autocast(native_dropout+native_dropout+sdpa_math)-none-cpu",
                     autocast) == ("error", "^RuntimeError: expected m1")
    # the CPU's flash kernel (attention with no dropout, on the backend the CPU picks) raises
    assert predicted("nonreentrant-default-eager-autocast(sdpa_auto)-none-cpu", autocast) == (
        "error", "^RuntimeError: attention")


def test_a_fresh_recompute_observed_claims_only_where_the_backward_graph_draws_afresh():
    observed = model(behaviour="fresh-recompute", observed=True)
    case = "nonreentrant-default-eager-(bernoulli_)-none-cpu"
    seen = lambda ops: Machine({"compiled.backward_rng": ops}, probe=False)  # noqa: E731
    assert predicted(case, observed, machine=seen(["aten.bernoulli.p"]))[0] == "mismatch"
    assert predicted(case, observed, machine=seen(["prims.inductor_random.default", "prims.inductor_seeds.default"])
                     )[0] == "mismatch"
    # the forward's seeds replayed (no seeds of its own), nothing in backward, or nobody looked: no claim
    assert predicted(case, observed, machine=seen(["prims.inductor_random.default"])) == ("pass", ())
    assert predicted(case, observed, machine=seen([])) == ("pass", ())
    assert predicted(case, observed) == ("pass", ())
    # without `observed` the model claims every drawing program with a region, as before
    assert predicted(case, model(behaviour="fresh-recompute"))[0] == "mismatch"
