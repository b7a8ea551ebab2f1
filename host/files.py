"""Files that hold a secret: the stack's passwords and keys, supervisord's program files (their
environments), a fleet's Kubernetes Secrets."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """An owner-only file (it holds a password or a private key), renamed into place so no
    reader sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, 0o600)  # the file may have been left from before with wider permissions
    os.replace(tmp, path)
