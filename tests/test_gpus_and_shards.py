"""One GPU per xdist worker (the mapping, on the CPU) and deterministic shards."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.fronts import gpus
from harness.impls import BUILTIN
from harness.model import shards
from harness.model.matrix import generate


def test_visible_gpus_follow_cuda_visible_devices():
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5,7"}) == ["3", "5", "7"]
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_worker_index():
    assert [gpus.worker_index(w) for w in ("gw0", "gw7", "main", "gwx")] == [0, 7, 0, 0]


def test_workers_get_their_own_gpu_in_order(tmp_path):
    claimed = [gpus.claim_gpu(i, ["4", "6"], tmp_path)[0] for i in range(2)]
    assert claimed == ["4", "6"]


def test_a_restarted_worker_takes_the_gpu_its_dead_predecessor_freed(tmp_path):
    # gw0 and gw1 hold GPUs 4 and 6 in processes of their own; gw1 dies; xdist's replacement gets
    # a new id (gw2, which would prefer GPU 4, held) and must land on the freed GPU 6.
    script = (
        "import sys, time; from pathlib import Path; from harness.fronts import gpus; "
        "print(gpus.claim_gpu(int(sys.argv[1]), ['4', '6'], Path(sys.argv[2])), flush=True); time.sleep(60)"
    )

    def start(index):
        return subprocess.Popen([sys.executable, "-c", script, str(index), str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)

    holders = [start(0), start(1)]
    try:
        assert [h.stdout.readline().strip() for h in holders] == ["('4', True)", "('6', True)"]
        holders[1].kill()
        holders[1].wait()
        holders.append(start(2))
        assert holders[-1].stdout.readline().strip() == "('6', True)"
    finally:
        for h in holders:
            h.kill()
            h.wait()


def test_index_preference_yields_to_a_free_gpu(tmp_path):
    first = gpus.claim_gpu(1, ["4", "6"], tmp_path)  # gw1 takes 6 in this process
    other = subprocess.run(
        [sys.executable, "-c",
         "from pathlib import Path; from harness.fronts import gpus; "
         f"print(gpus.claim_gpu(3, ['4','6'], Path({str(tmp_path)!r})))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert first == ("6", True)
    assert other == "('4', True)"  # gw3 prefers 6 (3 % 2), finds it taken, takes the free 4


def test_more_workers_than_gpus_share_round_robin(tmp_path):
    gpus.claim_gpu(0, ["0"], tmp_path)
    out = subprocess.run(
        [sys.executable, "-c",
         "from pathlib import Path; from harness.fronts import gpus; "
         f"print(gpus.claim_gpu(1, ['0'], Path({str(tmp_path)!r})))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert out == "('0', False)"


def test_pin_worker_sets_cuda_visible_devices(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus.tempfile, "gettempdir", lambda: str(tmp_path))
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpus.pin_worker("gw1", "run-a", env) == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert gpus.pin_worker("gw0", "run-a", {"CUDA_VISIBLE_DEVICES": ""}) is None


@pytest.mark.parametrize("spec", ["0/2", "3/2", "1/0", "a/b", "1", "", "2 of 3"])
def test_bad_shards_are_refused(spec):
    with pytest.raises(shards.ShardError, match="expected i/n with 1 <= i <= n"):
        shards.parse_shard(spec)


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_the_matrix(count):
    keys = [(impl, case.id) for impl in BUILTIN for case in generate()]
    parts = [[k for k in keys if shards.in_shard(*k, (i, count))] for i in range(1, count + 1)]
    assert sorted(k for part in parts for k in part) == sorted(keys)  # union is everything, no case twice
    assert all(parts)


def test_shards_do_not_depend_on_order_or_process():
    keys = [("bundled", case.id) for case in generate()]
    here = [shards.shard_of(f"{i}-{c}", 4) for i, c in keys]
    code = ("from harness.model import shards; from harness.model.matrix import generate; "
            "print([shards.shard_of('bundled-' + c.id, 4) for c in reversed(list(generate()))])")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin"}, cwd=Path(__file__).parent.parent).stdout
    assert eval(there) == list(reversed(here))
