"""The README's figures are what the harness generates (issue 43): matrix sizes are printed by
`python -m harness list`, never typed by hand, so a change to the matrix that leaves the README
behind fails here."""

from __future__ import annotations

import re
from pathlib import Path

from harness.model.matrix import generate

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _size(matrix: str, device: str) -> int:
    return sum(1 for _ in generate(matrix, device=device))


def test_the_matrix_sizes_the_readme_quotes_are_the_generated_ones():
    pattern = r"([\d,]+) CPU and\s+([\d,]+) CUDA\s+cases"
    quoted = [(_number(cpu), _number(cuda)) for cpu, cuda in re.findall(pattern, README)]
    generated = [(_size(matrix, "cpu"), _size(matrix, "cuda")) for matrix in ("default", "full")]
    assert quoted == generated


def test_the_quoted_first_line_of_a_cpu_run_counts_the_default_matrix():
    [count] = re.findall(r"running the CPU subset, (\d+) cases", README)
    assert int(count) == _size("default", "cpu")
