"""The workflow on a real single-node SLURM cluster started for this test: munge, slurmctld and
slurmd on 127.0.0.1 with their own key, config, state and ports in a temporary folder, driven by
`snakemake --executor slurm --workflow-profile workflow/profiles/slurm`."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY_SPEC, snakemake, write_spec

pytestmark = pytest.mark.slow

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(root: Path, node: str, munge_socket: Path) -> str:
    cpus = len(os.sched_getaffinity(0))  # what slurmd will find; more would drain the node
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return f"""\
ClusterName=cflpipe-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "log/slurmctld.log"}
SlurmdLogFile={root / "log/slurmd.log"}
PlugStackConfig={root / "plugstack.conf"}
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={int(mem_mb * 0.9)} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """Environment for SLURM clients talking to a one-node cluster; the daemons stop afterwards."""
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"SLURM is not installed (missing {', '.join(missing)}); apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("a local SLURM cluster needs root (slurmd launches jobs)")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("munge", "state", "spool", "log", "bin"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o700)
    key = root / "munge/munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_socket = root / "munge/munge.socket"
    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, node, munge_socket))
    (root / "plugstack.conf").write_text("")
    # snakemake's job step strips SLURM_* variables, SLURM_CONF included, before its nested srun;
    # on a real cluster srun finds /etc/slurm/slurm.conf, here a wrapper points it at ours.
    srun = root / "bin/srun"
    srun.write_text(f'#!/bin/sh\nSLURM_CONF={conf} exec {shutil.which("srun")} "$@"\n')
    srun.chmod(0o755)
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SLURM_JOB_ID", None)

    daemons, outputs = [], []

    def log(name):
        outputs.append(open(root / "log" / f"{name}.out", "w"))
        return outputs[-1]

    try:
        daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge_socket}", f"--key-file={key}",
             f"--pid-file={root / 'munge/munged.pid'}", f"--log-file={root / 'log/munged.log'}",
             f"--seed-file={root / 'munge/munged.seed'}"], stdout=log("munged"), stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 20
        while not munge_socket.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-c", "-i", "-f", str(conf)], env=env,
                                        stdout=log("slurmctld"), stderr=subprocess.STDOUT))
        daemons.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", node], env=env,
                                        stdout=log("slurmd"), stderr=subprocess.STDOUT))
        deadline, state = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True,
                                   text=True).stdout.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "\n".join((root / "log" / f).read_text()[-2000:] for f in ("munged.log", "slurmctld.log",
                                                                                 "slurmd.log")
                             if (root / "log" / f).exists())
            pytest.fail(f"the SLURM node did not become idle (state {state!r}):\n{logs}")
        yield env
    finally:
        if len(daemons) == 3:  # jobs left by a failed test would outlive slurmd (slurmstepd)
            subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True, timeout=30)
            time.sleep(1)
        for process in reversed(daemons):
            stop(process)
        for output in outputs:
            output.close()


def test_workflow_on_slurm(slurm_cluster, tmp_path):
    env = slurm_cluster
    write_spec(tmp_path / "tiny.yaml", TINY_SPEC)  # one scenario, two methods: one train job
    out = snakemake("--configfile", "tiny.yaml", "--executor", "slurm", "--workflow-profile",
                    str(ROOT / "workflow/profiles/slurm"), "--slurm-no-account", "--slurm-status-command",
                    "squeue", "--slurm-init-seconds-before-status-checks", "1", "--latency-wait", "5",
                    "--jobs", "2", cwd=tmp_path, env=env, timeout=420)
    assert out.returncode == 0, out.stdout
    # partition and train went through sbatch; download, aggregate and report are local rules
    assert out.stdout.count("has been submitted with SLURM jobid") == 2, out.stdout
    results = tmp_path / "results/tiny"  # results/<spec file name>
    for method in ("fedavg", "fedprox"):
        for name in ("summary.json", "metrics.parquet", "rounds.parquet", "clusters.parquet", "plots.csv"):
            assert (results / "runs/swap" / method / "seed0" / name).is_file(), (method, name)
    run_dir = results / "runs/swap/fedavg/seed0"
    assert (results / "aggregate/summary.parquet").is_file()
    assert (results / "report/index.html").is_file()

    # The train job asked SLURM for what the rule derives from the spec: 1 CPU, 2000 MB, 30 minutes
    # plus 2 rounds of each of its 2 runs, no GPU (the spec's device is auto).
    jobs = subprocess.run(["squeue", "--states=all", "-h", "-o", "%k|%T|%C|%m|%l|%b"], env=env,
                          capture_output=True, text=True).stdout.splitlines()
    train = [line.split("|") for line in jobs if line.startswith("rule_train")]
    assert len(train) == 1, jobs
    _, state, cpus, mem, limit, gres = train[0]
    assert (state, cpus, mem, limit) == ("COMPLETED", "1", "2000M", "34:00"), train[0]
    assert "gpu" not in gres
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["device"] == "auto"
