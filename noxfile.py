"""nox sessions: gpu (the CUDA matrix), gpu-tests (the harness's own tests on a GPU runner), cpu (the CPU
matrix), tests (the harness's own), lint.

gpu, cpu and tests run in the current environment (no virtualenv) so a GPU runner's CUDA build of
torch is used as it is, never replaced by a download.  Arguments after ``--`` go to pytest, e.g.
``nox -s gpu -- -k tracked --impl torch``.
"""

from __future__ import annotations

import sys

import nox

nox.options.sessions = ["tests"]
DEFAULT_GPU_IMPLS = ["--impl", "bundled", "--impl", "torch"]
PYTHON = sys.executable  # the interpreter running nox: on a GPU runner, the one with its CUDA torch


def _has_impl(args: list[str]) -> bool:
    return any(a == "--impl" or a.startswith("--impl=") for a in args)


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """The full matrix on CUDA (all capture modes), several isolated case workers on every GPU.

    Impls: posargs' --impl, else bundled and torch.  `-n auto` starts the harness's count of xdist
    workers for CUDA (`--workers-per-gpu N`, else from the host's cores and the GPU's memory; the
    pytest header says how many and why); each pins itself to a GPU (harness.fronts.gpus) before
    its first CUDA call, and each case runs in a replaceable worker process (--isolate), so an
    abort or a sticky CUDA error is recorded and the run goes on.  Then the rank slice: two ranks
    per case (`harness run --ranks 2`), report in reports/gpu-ranks.
    """
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    count = int(session.run(PYTHON, "-c", probe, silent=True).strip().splitlines()[-1])
    if count < 1:
        session.error("no CUDA device is visible (torch.cuda.is_available() is False)")
    args = list(session.posargs)
    impl_args = [] if _has_impl(args) else DEFAULT_GPU_IMPLS
    session.log(f"{count} GPU(s)")
    session.run(PYTHON, "-m", "pytest", "cases", "--device", "cuda", "-n", "auto", "--isolate",
                *impl_args, *args)
    # The rank slice (issue 41): two ranks sharing the GPU (gloo), the correct checkpoints and the
    # controls only ranks catch, over the first matrix's flat program in the layouts where a stream
    # is seeded per rank, eager and in one graph: 64 cases (two ranks on one H100: about 1.75
    # cases/s with capture, so about 40 s; flat and nested in every layout were 320).
    session.run(PYTHON, "-m", "harness", "run", "--ranks", "2", "--device", "cuda",
                "--impl", "bundled,torch,neg-rank0-snapshot,neg-rank-reseed", "--program", "flat",
                "--layout", "tracked,mixed", "--capture", "eager,single", "--report-dir", "reports/gpu-ranks",
                "--replace-report", "-q")


@nox.session(name="gpu-tests", python=False)
def gpu_tests(session: nox.Session) -> None:
    """The harness's own tests where its users run them: a GPU runner with the CUDA torch and the
    optional packages it has (megatron-core, deepspeed, torch-remat, accelerate, transformers).
    Each test passes there or skips saying why (another torch, a package present or missing, no
    package index to fill a fresh environment from); none may fail because the machine is not CI's."""
    probe = "import torch; print(int(torch.cuda.is_available()))"
    if session.run(PYTHON, "-c", probe, silent=True).strip().splitlines()[-1] != "1":
        session.error("no CUDA device is visible (torch.cuda.is_available() is False)")
    session.run(PYTHON, "-m", "pytest", "tests", "-n", "auto", "-rs", *session.posargs)


@nox.session(python=False)
def cpu(session: nox.Session) -> None:
    """The CPU matrix (eager cases) for the impls given (default bundled), writing a report."""
    session.run(PYTHON, "-m", "pytest", "cases", "--device", "cpu", *session.posargs)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Lint, then the harness's own tests plus the CPU matrix, as CI runs them."""
    session.run(PYTHON, "-m", "ruff", "check", ".")
    session.run(PYTHON, "-m", "pytest", "-n", "2", *session.posargs)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Speed and memory of the default matrix for one impl (posargs go to `harness bench`)."""
    session.run(PYTHON, "-m", "harness", "bench", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """The CI templates against their schemas, then ruff lint (ruff format is not enforced yet).

    The GitHub workflow and GitLab CI schemas are vendored in check-jsonschema: no network needed.
    """
    session.install("ruff", "check-jsonschema")
    schemas = {
        ".github/workflows/gpu.yml": "vendor.github-workflows",
        ".gitlab-ci.yml": "vendor.gitlab-ci",
        "examples/ci/your-project-gpu.yml": "vendor.github-workflows",
    }
    for path, schema in schemas.items():
        session.run("check-jsonschema", "--builtin-schema", schema, path)
    session.run("ruff", "check", "harness", "tests", "cases", "noxfile.py", "conftest.py")
