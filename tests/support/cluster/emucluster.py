"""An emulated multi-host SLURM cluster on one machine: real munged/slurmd/slurmctld, one namespace set per host.

Each emulated host is a set of Linux namespaces (network, UTS, mount, PID) held open by a tiny init process:
its own hostname, its own interface name and address on a bridge that lives in a namespace of its own, its own
/tmp, /dev/shm and /run, and /etc/hosts + /etc/slurm bind-mounted from the cluster's state directory. Every host
runs Debian's `munged` and `slurmd`; master-node also runs `slurmctld`. Killing a host's init ends every process
in that host (PID namespace), so `stop()` removes everything, and nothing touches the machine's own network.

Use it from Python (`EmulatedCluster(...).start()`, `.run(host, cmd)`, `.stop()`), from pytest (the
`slurm_cluster` fixture in pytest_emucluster.py) or from the shell (`tests/support/cluster/setup`,
`tests/support/cluster/teardown`, or `python -m tests.support.cluster.emucluster`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support import debian

REPO = Path(__file__).resolve().parents[3]


def shared_tmp_paths() -> list[Path]:
    """The repo and the venv when they live under /tmp, outermost only: every host sees them at the same path."""
    paths = {REPO, Path(sys.prefix).resolve()}
    under_tmp = sorted(p for p in paths if p.is_relative_to("/tmp") and p != Path("/tmp"))
    return [p for p in under_tmp if not any(p != q and p.is_relative_to(q) for q in under_tmp)]


APT_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "iproute2", "util-linux", "procps"]
REQUIRED_BINARIES = [
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scontrol",
    "munged",
    "ip",
    "nsenter",
    "unshare",
    "runuser",
    "ps",
    "ss",
]
MARKER = "raydist-emucluster"
SUBNET_PREFIX = 24


class ClusterUnavailable(RuntimeError):
    """The emulated cluster cannot be built on this machine; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    ip: str
    iface: str


# The seeds' cluster: master-node and node01 on ens1f1, node02 on ens1f0np0.
DEFAULT_HOSTS = (
    Host("master-node", "192.168.20.15", "ens1f1"),
    Host("node01", "192.168.20.16", "ens1f1"),
    Host("node02", "192.168.20.17", "ens1f0np0"),
)

# PID 1 of each host: reaps the orphans that daemons leave behind (munged, slurmd and slurmstepd double-fork).
# `unshare --kill-child` ends it with its unshare, which in turn dies with the test run (PDEATHSIG), so a
# killed test run cannot leave a host behind.
_INIT = r"""
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.1)
"""


def _set_pdeathsig() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def check_prerequisites(install: bool = True) -> None:
    """Root, namespaces and the Debian packages; installs missing packages with apt-get when allowed."""
    if os.geteuid() != 0:
        raise ClusterUnavailable(
            "the emulated SLURM cluster needs root (namespaces, mounts, slurmd); "
            "run the slurm tests as root, or deselect them with -m 'not slurm'"
        )
    try:
        debian.ensure(REQUIRED_BINARIES, APT_PACKAGES, install=install)
    except debian.Unavailable as e:
        raise ClusterUnavailable(str(e)) from None
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "--pid", "--fork", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        raise ClusterUnavailable(
            f"cannot create namespaces here ({probe.stderr.strip()}); the emulated cluster needs CAP_SYS_ADMIN"
        )


class EmulatedCluster:
    """A running (or stoppable) emulated cluster whose whole state lives under `workdir`."""

    def __init__(
        self,
        workdir: str | os.PathLike | None = None,
        hosts=DEFAULT_HOSTS,
        cpus_per_host: int = 2,
        tie_to_parent: bool = True,
    ):
        # Not under /tmp: each host mounts its own /tmp, and the state dir must be the same path on every host.
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="raydist-emu-", dir="/var/tmp"))
        self.hosts = {h.name: h for h in hosts}
        self.head = next(iter(self.hosts))
        self.cpus_per_host = cpus_per_host
        self.tie_to_parent = tie_to_parent
        self.init_pids: dict[str, int] = {}  # host (and "bridge") -> PID of its init in the machine's namespace
        self._anchors: list[subprocess.Popen] = []

    # ---- paths -------------------------------------------------------------------------------------------
    @property
    def shared(self) -> Path:
        """A directory every host sees at the same path, like a cluster's shared home or scratch."""
        return self.workdir / "shared"

    def host_dir(self, name: str) -> Path:
        return self.workdir / "hosts" / name

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> EmulatedCluster:
        check_prerequisites()
        try:
            self._write_files()
            self._start_namespaces()
            self._start_daemons()
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every host (its PID namespace goes with its init), the bridge, and remove the state dir."""
        pids = dict(self.init_pids)
        if not pids and self.state_file.exists():
            pids = json.loads(self.state_file.read_text()).get("init_pids", {})
        for pid in pids.values():
            if MARKER in _cmdline(int(pid)):  # a recycled PID is not ours
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for pid in pids.values():
            while MARKER in _cmdline(int(pid)) and time.monotonic() < deadline:
                time.sleep(0.05)
        for p in self._anchors:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        self._anchors.clear()
        self.init_pids.clear()
        if self.workdir.exists() and (self.workdir / ".emucluster").exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- running things inside a host -------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        """The environment a user of the cluster would have: the project's venv first on PATH."""
        venv_bin = str(REPO / ".venv" / "bin")
        path = os.pathsep.join(
            [venv_bin, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        )
        env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra)
        return env

    def nsenter(self, host: str) -> list[str]:
        pid = self.init_pids[host]
        return ["nsenter", "-t", str(pid), "--net", "--uts", "--mount", "--pid", "--"]

    def run(
        self,
        host: str,
        cmd: str | list[str],
        *,
        env: dict | None = None,
        cwd: str | os.PathLike = REPO,
        timeout: float = 120,
        check: bool = False,
        **kw,
    ) -> subprocess.CompletedProcess:
        """Run a command (a list, or a string for bash) inside `host`; returns the completed process (text)."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        full = self.nsenter(host) + ["env", "-C", str(cwd)] + argv
        r = subprocess.run(full, env=env or self.env(), capture_output=True, text=True, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"on {host}: {argv} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def popen(
        self, host: str, cmd: str | list[str], *, env: dict | None = None, cwd: str | os.PathLike = REPO, **kw
    ) -> subprocess.Popen:
        """Start a command inside `host`. The Popen is nsenter's, which forks into the host's PID namespace:
        killing it does not end the command, so give the command a way to end (its stdin closing, say)."""
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return subprocess.Popen(self.nsenter(host) + ["env", "-C", str(cwd)] + argv, env=env or self.env(), **kw)

    def processes(self, host: str) -> list[tuple[int, str]]:
        """(pid, command line) of every process in `host`, but its init and this query."""
        r = self.run(host, ["ps", "-e", "-o", "pid=,stat=,args="], check=True)
        out = []
        for line in r.stdout.splitlines():
            pid, stat, args = line.split(None, 2)
            if int(pid) == 1 or stat.startswith("Z") or args.startswith(("ps -e", "env -C")):
                continue
            out.append((int(pid), args))
        return out

    def listening_ports(self, host: str) -> set[int]:
        r = self.run(host, ["ss", "-Hltn"], check=True)
        return {int(line.split()[3].rsplit(":", 1)[1]) for line in r.stdout.splitlines() if line.strip()}

    # ---- SLURM helpers -----------------------------------------------------------------------------------
    def sbatch(self, *args: str, env: dict | None = None, host: str | None = None) -> int:
        r = self.run(host or self.head, ["sbatch", "--parsable", *args], env=env, check=True)
        return int(r.stdout.strip().split(";")[0])

    def job_state(self, job_id: int) -> str:
        r = self.run(self.head, ["scontrol", "show", "job", "-o", str(job_id)])
        for field in r.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def wait_job(
        self,
        job_id: int,
        states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"),
        timeout: float = 120,
    ) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {state} after {timeout:.0f}s")
            time.sleep(0.3)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until sinfo shows every host idle (also after a job, once its nodes stop completing)."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            r = self.run(self.head, ["sinfo", "-h", "-N", "-o", "%N %t"])
            out = r.stdout + r.stderr
            states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
            if r.returncode == 0 and set(states) == set(self.hosts) and set(states.values()) == {"idle"}:
                return
            time.sleep(0.2)
        raise ClusterUnavailable(
            f"SLURM nodes not idle after {timeout:.0f}s: {out.strip()!r}; "
            f"logs: {self.workdir / 'slurm' / 'log'}\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        chunks = []
        for log in sorted((self.workdir / "slurm" / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            chunks.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(chunks)

    # ---- building blocks ---------------------------------------------------------------------------------
    def _write_files(self) -> None:
        w = self.workdir
        w.mkdir(parents=True, exist_ok=True)
        (w / ".emucluster").write_text("state dir of an emulated SLURM cluster; safe to delete when stopped\n")
        os.chmod(w, 0o755)  # munged runs as `munge` and must reach its key and log below
        for d in ("etc/slurm", "slurm/state", "slurm/log", "slurm/spool", "munge", "shared"):
            (w / d).mkdir(parents=True, exist_ok=True)
        os.chmod(w / "shared", 0o1777)
        hosts = "127.0.0.1 localhost\n" + "".join(f"{h.ip} {h.name}\n" for h in self.hosts.values())
        (w / "etc" / "hosts").write_text(hosts)
        key = w / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        shutil.chown(w / "munge", "munge", "munge")
        shutil.chown(key, "munge", "munge")
        os.chmod(w / "munge", 0o700)
        os.chmod(key, 0o400)
        for name in self.hosts:
            hd = self.host_dir(name)
            for d in ("tmp", "munge"):
                (hd / d).mkdir(parents=True, exist_ok=True)
            os.chmod(hd / "tmp", 0o1777)
            shutil.chown(hd / "munge", "munge", "munge")
        (w / "etc" / "slurm" / "slurm.conf").write_text(self._slurm_conf())
        # slurmd loads a cgroup plugin whatever the config says (cluster-facts #1); keep it from mounting anything.
        (w / "etc" / "slurm" / "cgroup.conf").write_text(
            "CgroupAutomount=no\nConstrainCores=no\nConstrainRAMSpace=no\n"
        )
        shutil.copy("/etc/slurm/plugstack.conf", w / "etc" / "slurm") if Path(
            "/etc/slurm/plugstack.conf"
        ).exists() else None

    def _slurm_conf(self) -> str:
        s = self.workdir / "slurm"
        head = self.hosts[self.head]
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.ip} CPUs={self.cpus_per_host} State=UNKNOWN\n" for h in self.hosts.values()
        )
        return f"""# Generated by tests/support/cluster/emucluster.py for an emulated cluster; see {self.workdir}
ClusterName=raydistemu
SlurmctldHost={head.name}({head.ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation={s}/state
SlurmdSpoolDir={s}/spool/%n
SlurmctldPidFile={s}/slurmctld.pid
SlurmdPidFile={s}/slurmd-%n.pid
SlurmctldLogFile={s}/log/slurmctld.log
SlurmdLogFile={s}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
MinJobAge=300
KillWait=20
MessageTimeout=10
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def _anchor(self, unshare_args: list[str], tag: str) -> int:
        """Start an init in new namespaces; returns the PID (in our namespace) that holds them."""
        argv = ["unshare", *unshare_args, "--", sys.executable, "-c", _INIT, MARKER, tag, str(self.workdir)]
        p = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_set_pdeathsig if self.tie_to_parent else None,
            start_new_session=not self.tie_to_parent,
        )
        self._anchors.append(p)
        # With --fork the namespaces' init is unshare's child: that is the PID nsenter must target.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kids = [k for k in _children(p.pid) if MARKER in _cmdline(k)]
            if kids:
                return kids[0]
            if p.poll() is not None:
                raise ClusterUnavailable(f"unshare for {tag} exited {p.returncode}")
            time.sleep(0.02)
        raise ClusterUnavailable(f"namespace init for {tag} did not start")

    def _sh(self, pid_or_host, script: str) -> None:
        pid = self.init_pids[pid_or_host] if isinstance(pid_or_host, str) else pid_or_host
        r = subprocess.run(
            ["nsenter", "-t", str(pid), "--net", "--uts", "--mount", "--pid", "--", "bash", "-ec", script],
            capture_output=True,
            text=True,
            env=self.env(),
        )
        if r.returncode != 0:
            raise ClusterUnavailable(f"setting up {pid_or_host} failed: {r.stderr.strip()}")

    @staticmethod
    def _keep_visible(hd: Path) -> str:
        """Shell that re-mounts, over the host's private /tmp, the paths of the machine's /tmp that every host
        needs at the same place: the repo and its venv (a CI clone may well live in /tmp)."""
        return "\n".join(
            f"mkdir -p {p} && mount --bind {hd}/machine-tmp/{p.relative_to('/tmp')} {p}" for p in shared_tmp_paths()
        )

    def _start_namespaces(self) -> None:
        # The bridge (the "switch") lives in a namespace of its own so that no host owns it.
        self.init_pids["bridge"] = self._anchor(["--net", "--fork", "--kill-child"], "bridge")
        br = str(self.init_pids["bridge"])
        subprocess.run(
            [
                "nsenter",
                "-t",
                br,
                "--net",
                "--",
                "bash",
                "-ec",
                "ip link set lo up; ip link add br0 type bridge; ip link set br0 up",
            ],
            check=True,
        )
        for i, h in enumerate(self.hosts.values()):
            pid = self._anchor(
                [
                    "--net",
                    "--uts",
                    "--mount",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount-proc",
                    "--propagation",
                    "private",
                ],
                h.name,
            )
            self.init_pids[h.name] = pid
            hd = self.host_dir(h.name)
            w = self.workdir
            self._sh(
                h.name,
                f"""
                hostname {h.name}
                mkdir -p {hd}/machine-tmp && mount --bind /tmp {hd}/machine-tmp
                mount --bind {hd}/tmp /tmp
                {self._keep_visible(hd)}
                umount -l {hd}/machine-tmp
                mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm
                mount -t tmpfs -o mode=755 tmpfs /run
                install -d -o munge -g munge -m 755 /run/munge
                mount --bind {w}/etc/hosts /etc/hosts
                mkdir -p /etc/slurm && mount --bind {w}/etc/slurm /etc/slurm
                ip link set lo up
                # A decoy like Docker's bridge: an up interface with an address that routes nowhere useful.
                ip link add docker0 type bridge
                ip addr add 172.17.0.1/16 dev docker0
                ip link set docker0 up
            """,
            )
            peer = f"v{i}-{h.name}"[:15]
            subprocess.run(
                [
                    "nsenter",
                    "-t",
                    br,
                    "--net",
                    "--",
                    "bash",
                    "-ec",
                    f"ip link add {peer} type veth peer name {h.iface} netns {pid}; ip link set {peer} master br0 up",
                ],
                check=True,
            )
            self._sh(h.name, f"ip addr add {h.ip}/{SUBNET_PREFIX} dev {h.iface}; ip link set {h.iface} up")
        self.state_file.write_text(
            json.dumps(
                {"init_pids": self.init_pids, "hosts": [dataclasses.asdict(h) for h in self.hosts.values()]}, indent=1
            )
        )

    # ---- the network -------------------------------------------------------------------------------------
    def link_names(self) -> dict[str, tuple[str, str]]:
        """host -> (its interface, the bridge-side end of its veth)."""
        return {h.name: (h.iface, f"v{i}-{h.name}"[:15]) for i, h in enumerate(self.hosts.values())}

    def shape(self, rate_mbit: float | None, hosts: list[str] | None = None) -> None:
        """Limit each host's link to `rate_mbit` in both directions (None: unlimited again), like a switch port of
        that speed: a token bucket (tc tbf) on the host's interface (what it sends) and on the bridge's end of its
        veth (what it receives). Latency is not added: this kernel has no sch_netem (docs/dev/testing.md)."""
        if not self.init_pids:
            self.init_pids = json.loads(self.state_file.read_text())["init_pids"]
        br = str(self.init_pids["bridge"])
        for name, (iface, peer) in self.link_names().items():
            if hosts is not None and name not in hosts:
                continue
            for pid, dev in ((str(self.init_pids[name]), iface), (br, peer)):
                if rate_mbit is None:
                    cmd = f"tc qdisc del dev {dev} root 2>/dev/null || true"
                else:
                    # The bucket holds 10 ms of traffic (at least 64 KiB: tbf needs rate/HZ plus a packet); the
                    # queue 20 ms, about what a switch port buffers.
                    burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 / 100))
                    cmd = f"tc qdisc replace dev {dev} root tbf rate {rate_mbit:g}mbit burst {burst} latency 20ms"
                subprocess.run(
                    ["nsenter", "-t", pid, "--net", "--", "bash", "-ec", cmd],
                    check=True,
                    capture_output=True,
                    text=True,
                )

    def _start_daemons(self) -> None:
        w = self.workdir
        for name in self.hosts:
            hd = self.host_dir(name)
            self._sh(
                name,
                f"runuser -u munge -- munged --key-file={w}/munge/munge.key "
                f"--log-file={hd}/munge/munged.log --seed-file={hd}/munge/munged.seed "
                f"--pid-file=/run/munge/munged.pid",
            )
        self._sh(self.head, "slurmctld -c")
        for name in self.hosts:
            self._sh(name, f"slurmd -N {name}")


def _main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tests.support.cluster.emucluster", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="build and start the cluster; prints its state dir")
    up.add_argument("--workdir", help="state dir (default: a new /var/tmp/raydist-emu-*)")
    down = sub.add_parser("down", help="stop a cluster and remove its state dir")
    down.add_argument("workdir")
    sh = sub.add_parser("shape", help="limit every host's link to RATE Mbit/s each way ('off': unlimited)")
    sh.add_argument("workdir")
    sh.add_argument("rate")
    sh.add_argument("hosts", nargs="*", help="only these hosts (default: all)")
    sh = sub.add_parser("exec", help="run a command inside a host")
    sh.add_argument("workdir")
    sh.add_argument("host")
    sh.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    try:
        if a.cmd == "up":
            c = EmulatedCluster(a.workdir, tie_to_parent=False).start()
            print(c.workdir)
        elif a.cmd == "down":
            EmulatedCluster(a.workdir).stop()
        elif a.cmd == "shape":
            EmulatedCluster(a.workdir).shape(None if a.rate == "off" else float(a.rate), a.hosts or None)
        else:
            c = EmulatedCluster(a.workdir)
            c.init_pids = json.loads(c.state_file.read_text())["init_pids"]
            return subprocess.run(
                c.nsenter(a.host) + ["env", "-C", str(REPO)] + (a.command or ["bash"]), env=c.env()
            ).returncode
    except ClusterUnavailable as e:
        print(f"emucluster: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
