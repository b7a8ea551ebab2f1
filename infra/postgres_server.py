"""PostgreSQL from Debian's `postgresql` package, in a project-local data directory.

Debian's server is on every machine this project targets and installs with `apt-get` where it
is missing, so no binary is downloaded from outside a package registry. The server refuses to
run as root; when the stack is started as root it runs as the `postgres` system user that the
package creates.

It listens on 127.0.0.1 only and every connection, over TCP or the socket, authenticates with
the superuser's password (SCRAM-SHA-256); the stack generates the password and keeps it in its
stack.env. A data directory from before, created with `trust` authentication, is given the
password and the same rules in place.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from host.files import write_private
from host.processes import tail
from infra.layout import Layout

DATABASES = ("pipeline", "airflow")
PG_HBA = ("# Written by infra/postgres_server.py: password (SCRAM) authentication only.\n"
          "local all all scram-sha-256\n"
          "host all all 127.0.0.1/32 scram-sha-256\n")


def bin_dir() -> Path:
    """The newest installed PostgreSQL server's bin folder."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise RuntimeError("PostgreSQL server not found: run `make deps` (apt-get install postgresql)")
    return Path(found[-1]).parent


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


def data_dir(layout: Layout) -> Path:
    return layout.root / "postgres"


def _owned_by_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        shutil.chown(path, user.pw_uid, user.pw_gid)


def init(layout: Layout, password: str) -> None:
    """Create the cluster once, its superuser `postgres` with `password`."""
    directory = data_dir(layout)
    if (directory / "PG_VERSION").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    _owned_by_server_user(directory)
    os.chmod(directory, 0o700)
    # initdb reads the password from a file: owner-only, the server user's, removed after.
    fd, pwfile = tempfile.mkstemp(prefix="pwfile-", dir=layout.root)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(password + "\n")
        _owned_by_server_user(Path(pwfile))
        subprocess.run(
            _as_server_user([str(bin_dir() / "initdb"), "-D", str(directory), "-U", "postgres",
                             "--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
                             f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C.UTF-8"]),
            check=True, capture_output=True, text=True,
        )
    finally:
        os.unlink(pwfile)
    _write_pg_hba(directory)


def require_password(layout: Layout, password: str) -> None:
    """Upgrade a running cluster created with `trust` authentication: give the superuser
    `password` (sent as a SCRAM verifier, never in clear), then allow password logins only."""
    directory = data_dir(layout)
    hba = directory / "pg_hba.conf"
    if hba.read_text() == PG_HBA:
        return
    import psycopg2
    from psycopg2.extensions import encrypt_password

    conn = psycopg2.connect(layout.database_url("postgres", password))  # trust: let in as is
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            verifier = encrypt_password(password, "postgres", conn, "scram-sha-256")
            cur.execute("ALTER ROLE postgres PASSWORD %s", (verifier,))
            _write_pg_hba(directory)
            cur.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()


def _write_pg_hba(directory: Path) -> None:
    write_private(directory / "pg_hba.conf", PG_HBA)
    _owned_by_server_user(directory / "pg_hba.conf")


def running(layout: Layout) -> bool:
    """True when this stack's own server is up (pg_ctl status exits 0)."""
    directory = data_dir(layout)
    if not (directory / "postmaster.pid").exists():
        return False
    return subprocess.run(_as_server_user([str(bin_dir() / "pg_ctl"), "-D", str(directory), "status"]),
                          capture_output=True).returncode == 0


def start(layout: Layout) -> None:
    """Start the server on the stack's port (unless it runs) and create the project's databases."""
    directory = data_dir(layout)
    if running(layout):
        for database in DATABASES:
            create_database(layout, database)
        return
    log = directory / "server.log"
    # Every fleet holds a pool (up to 48 connections) and a quota's lease: pipelines that share
    # a quota run side by side on one server, three of them fifteen fleets.
    options = (f"-p {layout.postgres_port} -k {directory} -c listen_addresses=127.0.0.1 "
               "-c max_connections=800 -c shared_buffers=256MB -c fsync=off "
               "-c synchronous_commit=off")
    result = subprocess.run(
        _as_server_user([str(bin_dir() / "pg_ctl"), "-D", str(directory), "-l", str(log),
                         "-o", options, "-w", "-t", "60", "start"]),
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"PostgreSQL did not start:\n{result.stderr}\n{tail(log)}")
    for database in DATABASES:
        create_database(layout, database)


def create_database(layout: Layout, database: str) -> None:
    """CREATE DATABASE unless it exists."""
    import psycopg2

    conn = psycopg2.connect(layout.database_url("postgres"))
    conn.autocommit = True  # CREATE DATABASE refuses to run inside a transaction
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{database}"')
    finally:
        conn.close()


def stop(layout: Layout) -> None:
    """Fast shutdown: roll back open transactions, then exit."""
    directory = data_dir(layout)
    if not running(layout):
        return
    subprocess.run(
        _as_server_user([str(bin_dir() / "pg_ctl"), "-D", str(directory), "-m", "fast",
                         "-w", "-t", "60", "stop"]),
        capture_output=True, text=True,
    )
