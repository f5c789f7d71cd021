"""Loaded with ``-p corpus_path_plugin``: points the harness at the corpus file named by
$HARNESS_TEST_CORPUS, so a test can hand the pytest plugin a corrupt corpus without touching
cases/corpus.toml."""

import os
from pathlib import Path

import harness.model.corpus

harness.model.corpus.DEFAULT_PATH = Path(os.environ["HARNESS_TEST_CORPUS"])
