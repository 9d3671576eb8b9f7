"""A single-node SLURM cluster in a temporary directory, for the tests of ``--launcher slurm``.

Debian's ``slurm-wlm`` (22.05) and ``munge``: ``munged``, ``slurmctld`` and ``slurmd`` run as root with
their configuration, state, logs and sockets under the directory, on free ports, so they touch nothing
of the machine's own SLURM (if any). The node is CPU-only (no gres). Process tracking by
``/proc`` (``proctrack/linuxproc``) and no task plugin: no cgroups, which a container does not give.
With ``accounting=True`` a MariaDB server and ``slurmdbd`` run there too, so ``sacct`` answers.
Two settings shorten what a test waits for: ``KillWait=5`` (SIGTERM to SIGKILL; default 30 s) and
``cred_expire=10`` (how long a requeued job is held before it may start again; default 120 s).

    cluster = Cluster(tmp_dir); cluster.start(); ... env=cluster.env ...; cluster.stop()

:meth:`stop` ends every daemon it started by its PID (never by name), also after a failed start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

PACKAGES = ["slurm-wlm", "munge"]
ACCOUNTING_PACKAGES = ["mariadb-server", "slurmdbd"]
DAEMONS = ["munged", "slurmctld", "slurmd"]


def missing_programs(accounting: bool = False) -> List[str]:
    names = DAEMONS + ["sbatch", "squeue", "sinfo", "scontrol", "scancel"]
    names += ["slurmdbd", "mariadbd", "mariadb-install-db", "sacct"] if accounting else []
    return [n for n in names if shutil.which(n) is None and not Path("/usr/sbin", n).exists()]


def install_command(accounting: bool = False) -> str:
    return "sudo apt-get install -y " + " ".join(PACKAGES + (ACCOUNTING_PACKAGES if accounting else []))


def ensure_installed(accounting: bool = False) -> Optional[str]:
    """Install the packages from Debian when root and missing (as the Makefile does for
    Fashion-MNIST). Returns None when everything is there, else why not (with the command to run)."""
    if not missing_programs(accounting):
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"SLURM is not installed here: run  {install_command(accounting)}"
    pkgs = PACKAGES + (ACCOUNTING_PACKAGES if accounting else [])
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", *pkgs]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            return f"installing {' '.join(pkgs)} failed: {res.stderr[-500:]}"
    still = missing_programs(accounting)
    return f"still missing after the install: {', '.join(still)}" if still else None


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """The daemons of a one-node cluster under ``root`` (see the module docstring)."""

    def __init__(self, root, cpus: int = 2, accounting: bool = False, kill_wait: int = 5) -> None:
        self.root = Path(root)
        self.cpus = cpus
        self.accounting = accounting
        self.kill_wait = kill_wait
        self.node = socket.gethostname().split(".")[0]
        self.procs: Dict[str, subprocess.Popen] = {}  # daemon -> its process
        self.conf = self.root / "etc" / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # ------------------------------------------------------------------------------ configuration
    def _write_config(self) -> None:
        for d in ("etc", "state", "spool", "log", "run", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        ctl, slurmd = free_port(), free_port()
        self.munge_socket = self.root / "munge" / "munge.socket"
        lines = [
            "ClusterName=rpctest", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctl}", f"SlurmdPort={slurmd}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={self.root / 'state'}", f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SchedulerType=sched/backfill",
            "ReturnToService=2", f"KillWait={self.kill_wait}", "JobAcctGatherType=jobacct_gather/none",
            "SlurmctldTimeout=30", "SlurmdTimeout=60", "InactiveLimit=0", "MinJobAge=300",
            f"PlugStackConfig={self.root / 'etc' / 'plugstack.conf'}",
        ]
        if self.accounting:
            self.dbd_port = free_port()
            lines += ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
                      f"AccountingStoragePort={self.dbd_port}", f"AccountingStoragePass={self.munge_socket}",
                      "JobCompType=jobcomp/none"]
        else:
            lines += ["AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none"]
        lines += [f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
                  f"PartitionName=cpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP"]
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "etc" / "plugstack.conf").write_text("")
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)

    # ---------------------------------------------------------------------------------- daemons
    def _start(self, name: str, argv: List[str]) -> None:
        """Start a daemon in the foreground (its own session, output to ``log/<name>.out``)."""
        with open(self.root / "log" / f"{name}.out", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True)

    def _tail(self, name: str) -> str:
        text = ""
        for f in sorted((self.root / "log").glob("*")):
            if name in f.name:
                text += f"--- {f.name}\n" + f.read_text(errors="replace")[-1500:]
        return text

    def start(self) -> None:
        self._write_config()
        self._start("munged", [_program("munged"), "--foreground", f"--socket={self.munge_socket}",
                               f"--key-file={self.root / 'munge' / 'munge.key'}",
                               f"--pid-file={self.root / 'run' / 'munged.pid'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}",
                               f"--seed-file={self.root / 'munge' / 'munge.seed'}", "--force"])
        self._wait(lambda: self.munge_socket.exists(), "munged")
        if self.accounting:
            self._start_accounting()
        self._start("slurmctld", [_program("slurmctld"), "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run(["scontrol", "ping"]).returncode == 0, "slurmctld")
        self._start("slurmd", [_program("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: "idle" in self.run(["sinfo", "-h", "-o", "%T"]).stdout, "slurmd", 60)

    def _wait(self, ready, name: str, wait_s: float = 30) -> None:
        for _ in range(int(wait_s * 5)):
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not become ready in {wait_s} s:\n{self._tail(name)}")

    def run(self, argv: List[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, **kw)

    # ------------------------------------------------------------------------------- accounting
    def _start_accounting(self) -> None:
        """MariaDB (its own data directory, on a free port of 127.0.0.1) and slurmdbd, then the cluster,
        an account and root registered (sacctmgr), all before slurmctld starts: slurmctld with
        accounting and no state files refuses to start without slurmdbd."""
        data, sock, db_port = self.root / "mysql", self.root / "run" / "mysqld.sock", free_port()
        subprocess.run([_program("mariadb-install-db"), f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       capture_output=True, check=True)
        self._start("mariadbd", [_program("mariadbd"), "--no-defaults", f"--datadir={data}", f"--socket={sock}",
                                 "--user=root", "--bind-address=127.0.0.1", f"--port={db_port}",
                                 f"--pid-file={self.root / 'run' / 'mysqld.pid'}",
                                 f"--log-error={self.root / 'log' / 'mariadbd.log'}"])
        self._wait(lambda: _listening(db_port), "mariadbd", 60)
        dbd = self.root / "etc" / "slurmdbd.conf"  # slurmdbd reads it beside SLURM_CONF
        dbd.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}", "DbdHost=localhost",
            "DbdAddr=127.0.0.1", f"DbdPort={self.dbd_port}", "SlurmUser=root",
            f"PidFile={self.root / 'run' / 'slurmdbd.pid'}", f"LogFile={self.root / 'log' / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={db_port}",
            "StorageLoc=slurm_acct", "StorageUser=root", ""]))
        os.chmod(dbd, 0o600)
        self._start("slurmdbd", [_program("slurmdbd"), "-D"])
        self._wait(lambda: _listening(self.dbd_port), "slurmdbd", 60)
        self._wait(lambda: self.run(["sacctmgr", "-i", "add", "cluster", "rpctest"]).returncode == 0, "slurmdbd", 60)
        for argv in (["add", "account", "rpc"], ["add", "user", "root", "account=rpc"]):
            res = self.run(["sacctmgr", "-i", *argv])
            if res.returncode != 0 and "Nothing new added" not in res.stdout + res.stderr:
                raise RuntimeError(f"sacctmgr {' '.join(argv)}: {res.stdout} {res.stderr}")

    def stop(self) -> None:
        """End every daemon it started, by its PID (SIGTERM, then SIGKILL after 20 s), the newest first."""
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
