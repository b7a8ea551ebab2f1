"""The fleet image holds the repository files the fleet runs on: its COPY lines, laid out as the
image lays them out, are enough to import `consumers.runtime.fleet` and load every shipped pipeline
spec, and every repository module that takes is one the image copied; of consumers/, it copies
exactly the runtime's packages (the import contract "runtime" of pyproject.toml)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "infra/docker/fleet.Dockerfile"


def copied_paths(dockerfile: str) -> list[tuple[str, str]]:
    """(source, destination) of each COPY into the image's work tree (not into /tmp: the
    requirements, installed and removed in the same layer)."""
    pairs = []
    for line in dockerfile.splitlines():
        if not line.upper().startswith("COPY "):
            continue
        *sources, dest = [w for w in shlex.split(line)[1:] if not w.startswith("--")]  # (flags)
        if not dest.startswith("/"):
            pairs += [(source, dest) for source in sources]
    return pairs


def image_tree(root: Path) -> Path:
    """The image's WORKDIR, with what the Dockerfile copies into it."""
    app = root / "app"
    for source, dest in copied_paths(DOCKERFILE.read_text()):
        target = app / dest
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target = target / Path(source).name if dest.endswith("/") else target
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / source, target)
    return app


# Run in the image's tree with the repository off the path: what it imports comes from there.
PROBE = """
import sys
sys.path = [p for p in sys.path if p not in ("", REPO)]
sys.path.insert(0, APP)
import consumers.runtime.fleet
from consumers.config import pipeline_spec
for name in pipeline_spec.available():
    pipeline_spec.resolve(pipeline_spec.load(name).load.generator)
files = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
print(*sorted(f for f in files if f.startswith(REPO) and not f.startswith(sys.prefix)))
"""


def test_the_image_copies_what_the_fleet_imports_and_loads(tmp_path: Path) -> None:
    app = image_tree(tmp_path)
    code = f"REPO, APP = {str(REPO)!r}, {str(app)!r}\n{PROBE}"
    done = subprocess.run([sys.executable, "-c", code], cwd=app, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == []  # nothing came from the repository itself


def test_the_image_copies_exactly_the_runtimes_packages() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    runtime = next(c for c in contracts if c["id"] == "runtime")["source_modules"]
    copied = {source.rstrip("/") for source, _ in copied_paths(DOCKERFILE.read_text())
              if source.startswith("consumers/")}
    assert copied == {"consumers/__init__.py", *(p.replace(".", "/") for p in runtime)}
