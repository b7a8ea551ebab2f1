"""supervisord: its configuration, the daemon, and a client over its XML-RPC API.

Long-running consumer fleets are supervisord programs (one per run and stage), so a fleet that
crashes, or exits non-zero because a member died, is started again without anyone acting.
Everything lives in one folder (`.local/<stack>/supervisor/` for a stack, infra/supervisor.py):

    supervisord.conf  supervisord.sock  supervisord.pid  supervisord.log
    programs/<name>.conf   one per program (mode 0600: environments hold secrets)
    logs/<name>.log        each program's stdout and stderr
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any

from supervisor.xmlrpc import Faults, SupervisorTransport

from host.files import write_private
from host.processes import alive, tail, terminate

# States in which supervisord holds no process and will not start one by itself.
STOPPED_STATES = frozenset({"STOPPED", "EXITED", "FATAL", "UNKNOWN"})
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# configparser (inline_comment_prefixes ';' and '#') cuts a value at whitespace + ';' or '#'.
_INLINE_COMMENT = re.compile(r"\s[;#]")
# Variables supervisord itself keeps; its programs get these plus their own `environment`.
_DAEMON_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")


@dataclass(frozen=True)
class Paths:
    """Where one supervisord keeps its configuration, socket, pid, logs and program files."""

    folder: Path

    @property
    def conf(self) -> Path:
        return self.folder / "supervisord.conf"

    @property
    def socket(self) -> Path:
        return self.folder / "supervisord.sock"

    @property
    def pidfile(self) -> Path:
        return self.folder / "supervisord.pid"

    @property
    def logfile(self) -> Path:
        return self.folder / "supervisord.log"

    @property
    def programs(self) -> Path:
        return self.folder / "programs"

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def program_conf(self, name: str) -> Path:
        return self.programs / f"{name}.conf"

    def program_log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    @classmethod
    def from_url(cls, url: str) -> Paths:
        """The folder of a `unix://` SUPERVISOR_URL: program files are written next to the socket."""
        if not url.startswith("unix://"):
            raise ValueError(f"SUPERVISOR_URL must be unix://<folder>/supervisord.sock, got {url!r}")
        return cls(Path(url.removeprefix("unix://")).parent)


def program_name(*parts: str) -> str:
    """A valid supervisord name for `parts` joined by '-'.

    supervisord rejects ' ', ':' and '/' in names and the config file gives '%', '[' and ']'
    meanings, while Airflow run ids hold ':' and '+'; anything outside [A-Za-z0-9_.-] becomes
    '_', and a hash of the original then keeps two different run ids apart.
    """
    raw = "-".join(parts)
    name = _NAME_UNSAFE.sub("_", raw)
    if name != raw or len(name) > 120:
        name = f"{name[:110]}-{hashlib.sha1(raw.encode()).hexdigest()[:8]}"
    return name


def conf_value(value: str) -> str:
    """`value` as a supervisord config value: '%' doubled (values are %-expanded), and
    refused when the config file cannot carry it (a line break, an inline comment)."""
    if "\n" in value or "\r" in value or _INLINE_COMMENT.search(value):
        raise ValueError(f"cannot write a value with a line break or ' ;'/' #' to a supervisord "
                         f"config: {value[:40]!r}...")
    return value.replace("%", "%%")


def env_value(value: str) -> str:
    """One `environment=` value, quoted as supervisord's parser (non-POSIX shlex, then quotes
    stripped from both ends) reads it back unchanged; refused when it cannot be."""
    if value and (value[0] in "'\"" or value[-1] in "'\""):
        raise ValueError("supervisord strips quotes at either end of an environment value")
    quote = '"' if '"' not in value else "'"
    if quote in value:
        raise ValueError("an environment value cannot hold both kinds of quote for supervisord")
    return conf_value(f"{quote}{value}{quote}")


def render_environment(env: Mapping[str, str]) -> str:
    for key in env:
        if not _ENV_KEY.fullmatch(key):
            raise ValueError(f"invalid environment variable name {key!r}")
    return ",".join(f"{key}={env_value(value)}" for key, value in sorted(env.items()))


@dataclass(frozen=True)
class Program:
    """One supervised process, restarted whenever it exits; stopped with SIGTERM to its group.

    `startsecs`: how long it must stay up to count as started; exits sooner are retried with
    a growing delay (1 s, 2 s, ...) `startretries` times before supervisord gives up (FATAL).
    `stopwaitsecs`: how long a stop waits for a graceful exit before SIGKILL.
    """

    name: str
    command: Sequence[str]
    directory: Path
    environment: Mapping[str, str]
    stopwaitsecs: int
    startsecs: int = 5
    startretries: int = 10

    def render(self, paths: Paths) -> str:
        if program_name(self.name) != self.name:
            raise ValueError(f"invalid supervisord program name {self.name!r}: use program_name()")
        lines = [
            f"[program:{self.name}]",
            f"command={conf_value(shlex.join(self.command))}",
            f"directory={conf_value(str(self.directory))}",
            f"environment={render_environment(self.environment)}",
            "autostart=true",
            "autorestart=true",
            f"startsecs={self.startsecs}",
            f"startretries={self.startretries}",
            "stopsignal=TERM",
            f"stopwaitsecs={self.stopwaitsecs}",
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={conf_value(str(paths.program_log(self.name)))}",
            "stdout_logfile_maxbytes=20MB",
            "stdout_logfile_backups=3",
        ]
        return "\n".join(lines) + "\n"


def render_supervisord(paths: Paths) -> str:
    """The daemon's own configuration; programs come from `programs/*.conf`."""
    folder = conf_value(str(paths.folder))
    return "\n".join([
        "; written by host/supervisor.py",
        "[unix_http_server]",
        f"file={conf_value(str(paths.socket))}",
        "chmod=0700",
        "",
        "[supervisord]",
        f"logfile={conf_value(str(paths.logfile))}",
        "logfile_maxbytes=20MB",
        "logfile_backups=3",
        "loglevel=info",
        f"pidfile={conf_value(str(paths.pidfile))}",
        f"childlogdir={conf_value(str(paths.logs))}",
        f"directory={folder}",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory=supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{conf_value(str(paths.socket))}",
        "",
        "[include]",
        "files=programs/*.conf",
    ]) + "\n"


@dataclass(frozen=True)
class ProcessInfo:
    """What supervisord knows of a program's process (pid 0: none running).

    `exit_status` is None unless the last process ended after starting (EXITED) or on a stop
    request (STOPPED; -1 when a signal ended it): supervisord keeps no status for exits within
    `startsecs` (BACKOFF, then FATAL) and reports 0 for "none", which is not an exit code.
    """

    name: str
    state: str
    pid: int
    exit_status: int | None
    started_at: int
    spawn_error: str
    log_file: str

    @classmethod
    def from_rpc(cls, info: dict[str, Any]) -> ProcessInfo:
        state = info["statename"]
        status = info["exitstatus"] if state in ("EXITED", "STOPPED") else None
        return cls(info["group"], state, info["pid"], status, info["start"], info["spawnerr"],
                   info["stdout_logfile"])


class Client:
    """supervisord's XML-RPC API over its unix socket, for one folder's daemon."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    @property
    def rpc(self) -> Any:
        """The `supervisor.*` methods, on a fresh connection: the transport keeps one open and
        is left unusable after a failed request."""
        transport = SupervisorTransport(None, None, self.paths.url)
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport).supervisor

    def alive(self) -> bool:
        try:
            return self.rpc.getState()["statename"] == "RUNNING"
        except (OSError, HTTPException, xmlrpc.client.ProtocolError):
            return False

    def add(self, program: Program) -> ProcessInfo | None:
        """Write the program's file and load it: a new program starts, a changed one is stopped
        and started with its new file. Returns the replaced process's last info, if any."""
        write_private(self.paths.program_conf(program.name), program.render(self.paths))
        added, changed, _ = self.rpc.reloadConfig()[0]
        replaced = None
        if program.name in changed:
            replaced = self._stop_and_remove(program.name)
        if program.name in added or program.name in changed:
            self.rpc.addProcessGroup(program.name)
        return replaced

    def remove(self, name: str, timeout_s: float = 300.0) -> ProcessInfo | None:
        """Stop the program gracefully, forget it and delete its file; its last info, if loaded."""
        final = self._stop_and_remove(name, timeout_s) if self.info(name) else None
        self.paths.program_conf(name).unlink(missing_ok=True)
        self.rpc.reloadConfig()
        return final

    def stop(self, name: str) -> None:
        """Send the stop signal without waiting (to stop several programs at once)."""
        try:
            self.rpc.stopProcessGroup(name, False)
        except xmlrpc.client.Fault as fault:
            if fault.faultCode not in (Faults.NOT_RUNNING, Faults.BAD_NAME):
                raise

    def _stop_and_remove(self, name: str, timeout_s: float = 300.0) -> ProcessInfo | None:
        """Stop the program and forget it; its last info (None once supervisord has none)."""
        self.stop(name)
        deadline = time.monotonic() + timeout_s
        while (info := self.info(name)) is not None and info.state not in STOPPED_STATES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} still {info.state} after {timeout_s}s")
            time.sleep(0.2)
        self.rpc.removeProcessGroup(name)
        return info

    def info(self, name: str) -> ProcessInfo | None:
        try:
            return ProcessInfo.from_rpc(self.rpc.getProcessInfo(f"{name}:{name}"))
        except xmlrpc.client.Fault as fault:
            if fault.faultCode == Faults.BAD_NAME:
                return None
            raise

    def programs(self) -> list[ProcessInfo]:
        return [ProcessInfo.from_rpc(info) for info in self.rpc.getAllProcessInfo()]


def start(paths: Paths, timeout_s: float = 30.0) -> Client:
    """Start supervisord for `paths` unless it already runs; a client to it either way.

    The daemon keeps only a few variables of the caller's environment (its programs inherit
    them): each program's own `environment` says what it needs.
    """
    client = Client(paths)
    if client.alive():
        return client
    paths.programs.mkdir(parents=True, exist_ok=True)
    paths.logs.mkdir(parents=True, exist_ok=True)
    write_private(paths.conf, render_supervisord(paths))
    env = {key: os.environ[key] for key in _DAEMON_ENV if key in os.environ}
    result = subprocess.run([sys.executable, "-m", "supervisor.supervisord", "-c", str(paths.conf)],
                            env=env, cwd=paths.folder, capture_output=True, text=True)
    deadline = time.monotonic() + timeout_s
    while result.returncode == 0 and not client.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not client.alive():
        raise RuntimeError(f"supervisord did not start (exit {result.returncode}): "
                           f"{result.stdout}{result.stderr}\n{tail(paths.logfile)}")
    return client


def shutdown(paths: Paths, timeout_s: float = 300.0) -> None:
    """Stop every program (all at once, each gracefully), then supervisord itself."""
    client = Client(paths)
    if not client.alive():
        return
    pid = client.rpc.getPID()  # not the pidfile: one left by a killed daemon may name another process
    client.rpc.stopAllProcesses(True)
    client.rpc.shutdown()
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    terminate(pid, grace_s=10)
