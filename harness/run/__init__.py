"""Running cases: one case under one impl against a reference (`runner`, `workload`, `capture`,
`compiled`), in this process or an isolated worker (`isolation`), judged (`execution`), with the
run-side RNG and ambient state (`streams`, `ambient`), the environment probe and signal handling.
Imports check, verdict, impls, checkpoint, model and the base; never a front or the report."""
