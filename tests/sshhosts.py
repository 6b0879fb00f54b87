"""Worker hosts for tests and bench scripts: real OpenSSH servers in private network namespaces.

Each host is a network namespace made here, joined to this one by a veth pair
(``10.213.S.4i+1`` on this side, ``10.213.S.4i+2`` inside), running Debian's ``sshd`` with its
own host key, config and ``authorized_keys``; nothing listens anywhere else and no traffic
leaves the machine.  The hosts share this machine's filesystem (each has its own rundir) and
log in as the current user (root: namespaces need it) with a key made for the lab.

    with SshLab(tmp_path, hosts=2) as lab:
        config = lab.config(cpus=[1])          # a dict for dispatcher.config.parse_config
        lab.kill(lab.hosts[0])                 # the host "reboots": sshd and agents die
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


class LabUnavailable(RuntimeError):
    """This machine cannot host the lab (not root, no sshd, no network namespaces)."""


def lab_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in (SSHD, shutil.which("ip"), shutil.which("ssh-keygen")):
        if not tool or not os.access(tool, os.X_OK):
            return "needs openssh-server, openssh-client and iproute2 (scripts/bootstrap)"
    return None


def _run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabUnavailable(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class LabHost:
    name: str
    netns: str
    address: str
    port: int
    root: Path  # this host's files: sshd config, host key, rundir
    host_key_line: str  # "ssh-ed25519 AAAA..." as known_hosts wants it
    sshd_config: Path

    @property
    def rundir(self) -> Path:
        return self.root / "rundir"

    def known_hosts_line(self) -> str:
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{name} {self.host_key_line}\n"

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True,
                             text=True).stdout
        return [int(p) for p in out.split()]


class SshLab:
    def __init__(self, root: Path, hosts: int = 2, sshd_options: dict | None = None):
        """``sshd_options``: extra sshd_config lines per host index, e.g. {1: ["SetEnv X=1"]}."""
        reason = lab_unavailable_reason()
        if reason:
            raise LabUnavailable(reason)
        self.root = Path(root)
        self.count = hosts
        self.sshd_options = sshd_options or {}
        self.hosts: list[LabHost] = []
        self._tag = f"{os.getpid() % 100000}"
        self._subnet = self._free_subnet()
        self.client_key = self.root / "client_ed25519"
        self.known_hosts = self.root / "known_hosts"

    def _free_subnet(self) -> int:
        used = _run("ip", "-o", "addr").split()
        for k in range(250):
            s = (os.getpid() + k) % 250
            if not any(w.startswith(f"10.213.{s}.") for w in used):
                return s
        raise LabUnavailable("no free 10.213.x.0/24 subnet")

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> SshLab:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab-client",
             "-f", str(self.client_key))
        known = []
        for i in range(self.count):
            host = self._make_host(i)
            self.hosts.append(host)
            self.start_sshd(host)
            known.append(host.known_hosts_line())
        self.known_hosts.write_text("".join(known))

    def _make_host(self, i: int) -> LabHost:
        netns = f"iolab{self._tag}h{i}"
        outer, inner = f"iol{self._tag}h{i}a", f"iol{self._tag}h{i}b"
        here, there = f"10.213.{self._subnet}.{4 * i + 1}", f"10.213.{self._subnet}.{4 * i + 2}"
        _run("ip", "netns", "add", netns)
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", netns)
        _run("ip", "addr", "add", f"{here}/30", "dev", outer)
        _run("ip", "link", "set", outer, "up")
        _run("ip", "-n", netns, "addr", "add", f"{there}/30", "dev", inner)
        _run("ip", "-n", netns, "link", "set", inner, "up")
        _run("ip", "-n", netns, "link", "set", "lo", "up")
        root = self.root / f"h{i}"
        root.mkdir()
        (root / "rundir").mkdir()
        key = root / "ssh_host_ed25519_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"lab-host-{i}", "-f", str(key))
        pub = key.with_suffix(".pub").read_text().split()
        authorized = root / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        config = root / "sshd_config"
        lines = [f"ListenAddress {there}", "Port 22", f"HostKey {key}",
                 f"PidFile {root / 'sshd.pid'}", f"AuthorizedKeysFile {authorized}",
                 "PubkeyAuthentication yes", "PasswordAuthentication no",
                 "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
                 "StrictModes no", "UsePAM no", "UseDNS no", "LogLevel ERROR",
                 "Subsystem sftp internal-sftp", *self.sshd_options.get(i, [])]
        config.write_text("\n".join(lines) + "\n")
        return LabHost(name=f"h{i}", netns=netns, address=there, port=22, root=root,
                       host_key_line=f"{pub[0]} {pub[1]}", sshd_config=config)

    def start_sshd(self, host: LabHost, timeout: float = 10.0) -> None:
        log = open(host.root / "sshd.log", "ab")
        subprocess.Popen(["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f",
                          str(host.sshd_config)], stdout=log, stderr=log,
                         start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((host.address, host.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise LabUnavailable(f"sshd of {host.name} did not start: "
                                         f"{(host.root / 'sshd.log').read_text()[-300:]}"
                                         ) from None
                time.sleep(0.05)

    def kill(self, host: LabHost) -> None:
        """Every process of the host dies at once (sshd, sessions, agents): a crash."""
        for _ in range(20):
            pids = host.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def close(self) -> None:
        for host in self.hosts:
            self.kill(host)
        for i in range(self.count):
            subprocess.run(["ip", "netns", "del", f"iolab{self._tag}h{i}"],
                           capture_output=True)
            subprocess.run(["ip", "link", "del", f"iol{self._tag}h{i}a"], capture_output=True)

    # ------------------------------------------------------------------ configs

    def host_entry(self, host: LabHost, cpus, **extra) -> dict:
        entry = {"name": host.name, "host": host.address, "port": host.port, "user": "root",
                 "rundir": str(host.rundir), "cpus": list(cpus)}
        entry.update(extra)
        return entry

    def config(self, cpus=(1,), hosts: list[LabHost] | None = None, store: Path | None = None,
               **ssh_extra) -> dict:
        """A config (as a dict) whose backend is these hosts."""
        ssh = {"known_hosts": str(self.known_hosts), "key_file": str(self.client_key),
               "connect_timeout": 5,
               "hosts": [self.host_entry(h, cpus) for h in (hosts or self.hosts)]}
        ssh.update(ssh_extra)
        return {"backend": "ssh", "store": str(store or self.root / "store"), "ssh": ssh,
                "scheduler": {"backoff_s": 0.2, "backoff_max_s": 2, "quarantine_after": 3}}
