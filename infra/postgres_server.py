"""PostgreSQL from Debian's `postgresql` package, in a project-local data directory.

Debian's server is on every machine this project targets and installs with `apt-get` where it
is missing, so no binary is downloaded from outside a package registry. The server refuses to
run as root; when the stack is started as root it runs as the `postgres` system user that the
package creates. Authentication is `trust` on 127.0.0.1 only: a local development stack.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from infra.layout import Layout
from infra.processes import tail

DATABASES = ("pipeline", "airflow")


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


def init(layout: Layout) -> None:
    """Create the cluster once."""
    directory = data_dir(layout)
    if (directory / "PG_VERSION").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    _owned_by_server_user(directory)
    os.chmod(directory, 0o700)
    subprocess.run(
        _as_server_user([str(bin_dir() / "initdb"), "-D", str(directory), "-U", "postgres",
                         "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"]),
        check=True, capture_output=True, text=True,
    )


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
    options = (f"-p {layout.postgres_port} -k {directory} -c listen_addresses=127.0.0.1 "
               "-c max_connections=200 -c shared_buffers=256MB -c fsync=off "
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
