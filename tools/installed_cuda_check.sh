#!/usr/bin/env bash
# The installed package on a CUDA machine (issue 54), for a lent GPU machine that downloads nothing:
# install the wheel (built here: pip wheel --no-deps -w .hwheel .) into a folder of its own, then
# from a folder outside the checkout run the default CUDA matrix for bundled and torch through the
# CLI and through `pytest -p ckpt_harness`, run the checkout's CLI over the same matrix, and compare
# every case's outcome and verdict.  Prints one line per run and the comparison; logs under $OUT.
# Usage (in the checkout's root): bash tools/installed_cuda_check.sh
set -uo pipefail
out=${OUT:-/tmp/installed-cuda-check}
here=$PWD
mkdir -p "$out" /tmp/elsewhere
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/hsite .hwheel/*.whl || exit 9
cd /tmp/elsewhere || exit 9
PYTHONPATH=/tmp/hsite python3 -m harness --version
PYTHONPATH=/tmp/hsite python3 -m harness run --impl bundled,torch --device cuda -q \
    --report-dir "$out/installed" 2>&1 | tail -2 | tee "$out/installed.log"; installed=${PIPESTATUS[0]}
PYTHONPATH=/tmp/hsite python3 -m pytest -p ckpt_harness -p no:cacheprovider --pyargs harness.pytest_cases \
    --harness-impl bundled --harness-impl torch --harness-device cuda -n 8 -q \
    --harness-report-dir "$out/pytest" 2>&1 | tail -2 | tee "$out/pytest.log"; under_pytest=${PIPESTATUS[0]}
cd "$here" || exit 9
PYTHONPATH=$here python3 -m harness run --impl bundled,torch --device cuda -q \
    --report-dir "$out/checkout" 2>&1 | tail -2 | tee "$out/checkout.log"; checkout=${PIPESTATUS[0]}
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def verdicts(name):
    rows = [json.loads(line) for line in (out / name / "results.jsonl").read_text().splitlines()]
    return {(r["impl"], r["case_id"]): (r["outcome"], r["verdict"]) for r in rows}, {r["env"].get("harness") for r in rows}
checkout, _ = verdicts("checkout")
for name in ("installed", "pytest"):
    found, versions = verdicts(name)
    differ = sorted(k for k in checkout.keys() | found.keys() if checkout.get(k) != found.get(k))
    print(f"{name} vs checkout: {len(found)} and {len(checkout)} cases, {len(differ)} differ; harness {versions}")
    for key in differ[:5]:
        print("  ", key, checkout.get(key), found.get(key))
PY
echo "exit codes: installed $installed, pytest $under_pytest, checkout $checkout"
