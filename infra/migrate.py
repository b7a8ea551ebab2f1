"""Apply the versioned SQL migrations in infra/migrations to a database, once each.

Files are named NNNN_description.sql and applied in order inside one transaction each; the
`schema_migrations` table records what has been applied, so running this again is a no-op.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import psycopg2

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def pending(applied: set[str]) -> list[Path]:
    return [p for p in sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql")) if p.stem not in applied]


def migrate(database_url: str) -> list[str]:
    """Apply every migration not yet applied; return the names applied now."""
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                        "version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
            cur.execute("SELECT pg_advisory_xact_lock(4242)")
            cur.execute("SELECT version FROM schema_migrations")
            applied = {row[0] for row in cur.fetchall()}
            done = []
            for path in pending(applied):
                cur.execute(path.read_text())
                cur.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (path.stem,))
                done.append(path.stem)
        return done
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                        help="libpq URL (default: $DATABASE_URL)")
    args = parser.parse_args()
    if not args.database_url:
        parser.error("no database: pass --database-url or set DATABASE_URL")
    for name in migrate(args.database_url):
        print(f"applied {name}")


if __name__ == "__main__":
    main()
