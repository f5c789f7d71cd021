"""The model: what a case is, as data: axes and programs (`programs`, `spec`), the RNG ops
(`ops`), the case matrix (`cases`, `corpus`, `shards`) and the facts expectations match on
(`case_facts`).  Imports only the base (`harness.errors`, `harness.results`, `harness.axes`)."""
