"""Which process of a multi-process launch runs the runtime (``runtime/ranks.py``), the per-rank names, and the
observer's view of FSDP2's memory (DTensor parameters, storages resized in place).

The decisions are checked as functions of (environment, pid, command line), then in real processes: a rank's
children stay plain, a rank whose variables make no rank says one line and runs plain, an error in a rank's
start-up names the rank. The torchrun runs themselves are in ``test_runtime_torchrun.py``.
"""

import json
import os
import subprocess
import sys

import pytest

from uvmprefetch.errors import DeviceError
from uvmprefetch.runtime.ranks import (OWNER, OWNER_RANK, Rank, claim, device_index, for_rank, is_launcher,
                                       program_of, rank_from_env, rank_path, reports_of, role_of)

PY = sys.executable
TORCHRUN_WORKER = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}


def test_program_of_reads_the_interpreter_command_line():
    assert program_of([PY, "/usr/bin/torchrun", "--nproc_per_node=2", "t.py"]) == ("script", "torchrun")
    assert program_of([PY, "-u", "-X", "dev", "-m", "torch.distributed.run", "t.py"]) == ("-m", "torch.distributed.run")
    assert program_of([PY, "-c", "print(1)"]) == ("-c", "")
    assert program_of([PY]) == ("", "")


@pytest.mark.parametrize("argv,launcher", [
    ([PY, "/x/bin/torchrun", "--standalone", "t.py"], True),
    ([PY, "-m", "torch.distributed.run", "t.py"], True),
    ([PY, "-m", "torch.distributed.launch", "t.py"], True),
    ([PY, "train.py"], False),
    ([PY, "-u", "train.py", "torchrun"], False),  # an argument named torchrun is not the program
    ([PY, "-m", "torch.distributed.elastic.foo"], False),
])
def test_launchers_are_recognised_by_their_program(argv, launcher):
    assert is_launcher(argv) is launcher


def test_rank_from_env():
    assert rank_from_env({}) is None
    assert rank_from_env({"RANK": "3"}) is None  # no WORLD_SIZE: not a launched rank
    r = rank_from_env(TORCHRUN_WORKER)
    assert (r.rank, r.local_rank, r.world_size, r.source) == (1, 1, 2, "env")
    assert rank_from_env({"LOCAL_RANK": "2", "WORLD_SIZE": "4"}).rank == 2  # one node, LOCAL_RANK only
    for bad in ({"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "0", "WORLD_SIZE": "0"},
                {"RANK": "0", "LOCAL_RANK": "-1", "WORLD_SIZE": "2"}, {"RANK": "0", "WORLD_SIZE": "two"}):
        with pytest.raises(DeviceError):
            rank_from_env(bad)


def test_roles_launcher_rank_child():
    # GIVEN torchrun's own process THEN it does nothing and records no owner
    env = {"UVMPREFETCH": "1"}
    assert role_of(env, 100, [PY, "/b/torchrun", "t.py"]).kind == "launcher"
    assert OWNER not in env
    # GIVEN a worker torchrun started (no owner above it) THEN it owns a runtime as its rank
    worker = {**env, **TORCHRUN_WORKER}
    role = role_of(worker, 101, [PY, "-u", "t.py"])
    assert role.kind == "owner" and role.rank.rank == 1
    claim(worker, 101, role)
    # GIVEN that rank's DataLoader worker / subprocess (same rank variables) THEN it stays plain
    assert role_of(dict(worker), 102, [PY, "-c", "spawn_main()"]).kind == "child"
    # GIVEN the rank re-executed itself with the shim (same pid) THEN it is still the owner
    assert role_of(dict(worker), 101, [PY, "-u", "t.py"]).kind == "owner"
    # GIVEN a launcher we do not know that became the owner THEN its ranks still own their runtimes
    outer = dict(env)
    claim(outer, 50, role_of(outer, 50, [PY, "my_launcher.py"]))
    assert role_of({**outer, **TORCHRUN_WORKER}, 51, [PY, "t.py"]).kind == "owner"
    # GIVEN an owner's child without rank variables THEN plain, as before ranks existed
    assert role_of({**env, OWNER: "50"}, 52, [PY, "w.py"]).kind == "child"


def test_a_rank_whose_variables_make_no_rank_runs_plain_and_its_children_quietly_too():
    env = {"UVMPREFETCH": "1", "RANK": "1", "LOCAL_RANK": "gpu1", "WORLD_SIZE": "2"}
    role = role_of(env, 10, [PY, "t.py"])
    assert role.kind == "plain" and "LOCAL_RANK='gpu1'" in role.note and "without uvmprefetch" in role.note
    claim(env, 10, role)
    child = role_of(dict(env), 11, [PY, "t.py"])
    assert child.kind == "child" and child.note == ""


def test_device_of_a_rank():
    r = Rank(rank=5, world_size=8, local_rank=1)
    assert device_index(r, 8) == 1
    assert device_index(r, 1) == 0  # CUDA_VISIBLE_DEVICES left this rank one GPU: that one
    with pytest.raises(DeviceError, match="rank 5: LOCAL_RANK=5 names no GPU"):
        device_index(Rank(rank=5, world_size=8, local_rank=5), 2)
    assert device_index(Rank(rank=3, world_size=4), 4) == 3  # no LOCAL_RANK, one node: RANK
    with pytest.raises(DeviceError, match="no LOCAL_RANK"):
        device_index(Rank(rank=3, world_size=16), 8)
    with pytest.raises(DeviceError, match="sees 0 GPU"):
        device_index(r, 0)


def test_rank_paths(tmp_path):
    r1 = Rank(rank=1, world_size=2, local_rank=1)
    assert rank_path("/o/r.json", r1) == "/o/r.rank1.json"
    assert rank_path("/o.d/trace.uvmt", r1) == "/o.d/trace.rank1.uvmt"
    assert rank_path("/o/r", r1) == "/o/r.rank1"
    assert rank_path("/o/r-{rank}.json", r1) == "/o/r-1.json"
    assert rank_path("/o/r.json", None) == "/o/r.json"  # one process: the path as given
    assert rank_path("/o/r-{rank}.json", None) == "/o/r-0.json"
    assert rank_path(None, r1) is None
    from uvmprefetch.config import RuntimeConfig, parse_budget
    cfg = for_rank(RuntimeConfig(report="/o/r.json", trace="/o/t.uvmt", budget=parse_budget("0.5")), r1)
    assert (cfg.report, cfg.trace, cfg.budget.fraction) == ("/o/r.rank1.json", "/o/t.rank1.uvmt", 0.5)
    for name in ("r.rank0.json", "r.rank10.json", "r.rank1.json", "r.rankx.json", "q.rank2.json", "r-3.json"):
        (tmp_path / name).write_text("{}")
    assert list(reports_of(str(tmp_path / "r.json"))) == [0, 1, 10]
    assert list(reports_of(str(tmp_path / "r-{rank}.json"))) == [3]


def _py(code, env_extra, timeout=180):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH") and k not in TORCHRUN_WORKER}
    env.update(env_extra)
    return subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


# The runtime's state in a process, and in a child it starts the way a DataLoader worker with the spawn context
# or any subprocess starts: a fresh interpreter inheriting the environment.
PROBE = """
import json, os, subprocess, sys
import uvmprefetch.runtime as rt
s = rt.current()
me = {"active": s is not None, "rank": s.rank.as_dict() if s is not None and s.rank else None,
      "report": s.cfg.report if s is not None else None}
if len(sys.argv) < 2:  # the parent (python -c CODE); the child gets one argument
    child = subprocess.run([sys.executable, "-c", CODE, "child"], capture_output=True, text=True)
    me["child"] = json.loads(child.stdout.strip().splitlines()[-1])
print(json.dumps(me))
"""


def _probe(env_extra):
    code = "CODE = " + repr(PROBE) + "\n" + PROBE
    return _py(code, env_extra)


def test_a_launched_rank_owns_a_runtime_and_its_children_stay_plain(tmp_path):
    # GIVEN a process started as rank 1 of 2 with UVMPREFETCH=1 WHEN it starts THEN it runs the runtime with
    # rank-named outputs, and the fresh interpreter it starts (same rank variables) runs none
    rep = tmp_path / "r.json"
    r = _probe({"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_LOG": "quiet",
                "UVMPREFETCH_REPORT": str(rep), **TORCHRUN_WORKER})
    assert r.returncode == 0, r.stderr
    me = json.loads(r.stdout.strip().splitlines()[-1])
    assert me["active"] and me["rank"] == {"rank": 1, "world_size": 2, "local_rank": 1, "source": "env"}
    assert me["report"] == str(tmp_path / "r.rank1.json")
    assert me["child"] == {"active": False, "rank": None, "report": None}
    assert json.loads((tmp_path / "r.rank1.json").read_text())["rank"]["rank"] == 1
    assert not rep.exists()


def test_a_rank_with_unusable_variables_says_one_line_and_runs_plain(tmp_path):
    rep = tmp_path / "r.json"
    r = _probe({"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_REPORT": str(rep),
                "RANK": "1", "LOCAL_RANK": "gpu1", "WORLD_SIZE": "2"})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "LOCAL_RANK='gpu1'" in lines[0] and "without uvmprefetch" in lines[0], r.stderr
    me = json.loads(r.stdout.strip().splitlines()[-1])
    assert not me["active"] and not me["child"]["active"]  # the child said nothing either (one line in all)
    assert not list(tmp_path.iterdir())


def test_an_error_at_a_ranks_start_names_the_rank():
    # the same path as the cuda backend's "budget above the free device memory" refusal: an error raised while
    # the rank's session starts (here: a window for a policy without one)
    r = _py("print('the program ran')", {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun",
                                         "UVMPREFETCH_POLICY": "demand", "UVMPREFETCH_WINDOW": "8",
                                         **TORCHRUN_WORKER})
    assert r.returncode == 2 and "the program ran" not in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "rank 1: UVMPREFETCH_WINDOW=8" in lines[0], r.stderr


def test_torchrun_itself_starts_no_runtime(tmp_path):
    # GIVEN UVMPREFETCH=1 WHEN torchrun's own interpreter starts (here with --help: it launches nothing)
    # THEN no report, no owner recorded
    rep = tmp_path / "r.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(UVMPREFETCH="1", UVMPREFETCH_BACKEND="dryrun", UVMPREFETCH_REPORT=str(rep))
    r = subprocess.run([PY, "-m", "torch.distributed.run", "--help"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "uvmprefetch" not in r.stderr and not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------------- FSDP2 memory

def test_dtensor_accesses_are_its_local_shard():
    # GIVEN an op on a DTensor (FSDP2's parameters and optimizer states) THEN its accesses are its local tensor's
    # memory (the wrapper's own storage has no data pointer)
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from uvmprefetch.trace.format import READ, WRITE
    from uvmprefetch.trace.recorder import scan_op

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        local = torch.ones(8, 4)
        d = DTensor.from_local(local, mesh, [Shard(0)])
        acc, _, _ = scan_op(torch.ops.aten.mul_.Tensor, (d, 2.0), {}, d, "cpu")
    finally:
        if created:
            dist.destroy_process_group()
    assert [(t.untyped_storage().data_ptr(), m) for t, m in acc] == [
        (local.untyped_storage().data_ptr(), READ | WRITE), (local.untyped_storage().data_ptr(), WRITE)]
    assert all(type(t) is torch.Tensor for t, _ in acc)


def test_a_storage_resized_in_place_frees_its_old_memory():
    # GIVEN a storage the tracker saw WHEN it is resized to 0 and back (FSDP2's free/alloc of unsharded
    # parameters) and seen again THEN its old memory is queued dead once, and the books stay flat
    import torch
    from uvmprefetch.runtime.observe import StorageTracker

    tr = StorageTracker(2 << 20, virtual=True)
    t = torch.empty(1 << 20)  # 4 MiB
    st = t.untyped_storage()
    first = tr.lookup(st)
    hold = []
    for _ in range(5):
        st.resize_(0)
        hold.append(torch.empty(1 << 20))  # takes the freed memory, so the storage gets new memory elsewhere
        st.resize_(4 << 20)
        again = tr.lookup(st)
        assert again is not first and again.key != first.key and again.nbytes == 4 << 20
        died, _ = tr.drain_dead()
        assert died == [first]
        first = again
    assert tr.live_bytes == 4 << 20 and tr.counts() == (1, 4 << 20)
    # another storage object over the same memory (from_numpy of a view of it) does not make the first one dead,
    # and each object keeps its own record
    alias = torch.from_numpy(t.numpy())
    other = tr.lookup(alias.untyped_storage())
    assert other is not first and tr.lookup(st) is first and tr.lookup(alias.untyped_storage()) is other
    assert tr.drain_dead() == ([], [])
    del alias
    assert tr.drain_dead()[0] == [other]
    del t, st
    died, freed = tr.drain_dead()
    assert died == [first] and tr.live_bytes == 0 and len(freed) == 2


SPAWN = '''
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
import uvmprefetch

def work(i, folder):
    dist.init_process_group("gloo", init_method="file://" + os.path.join(folder, "store"), rank=i, world_size=2)
    uvmprefetch.enable(backend="dryrun", budget="4MiB", log="quiet", report=os.path.join(folder, "r.json"),
                       trace=os.path.join(folder, "t.uvmt"))  # (a trace keeps the planner awake: every launch)
    torch.manual_seed(0)
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                                                      torch.nn.Linear(256, 64)))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        m(torch.randn(8, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    uvmprefetch.disable()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(work, args=(sys.argv[1],), nprocs=2)
'''


def test_mp_spawn_workers_enable_the_runtime_themselves(tmp_path):
    # GIVEN torch.multiprocessing.spawn workers (no rank variables) WHEN each calls uvmprefetch.enable() after
    # init_process_group THEN each runs its own runtime, named after its torch.distributed rank
    script = tmp_path / "spawn_job.py"
    script.write_text(SPAWN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH") and k not in TORCHRUN_WORKER}
    r = subprocess.run([PY, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        rep = json.loads((tmp_path / f"r.rank{rank}.json").read_text())
        assert rep["rank"] == {"rank": rank, "world_size": 2, "local_rank": None, "source": "torch.distributed"}
        assert rep["launches"] > 0 and rep["iterations"] == 2 and not rep["degraded"]
    assert not (tmp_path / "r.json").exists()
