"""The import contracts (pyproject.toml's [tool.importlinter]) hold on the tree, and each one
catches its violation: a copy of the tree with one forbidden import added fails that contract,
by name, and only that one. The copies live in the test's own folder; the tree is never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c for c in CONFIG["contracts"]}
# The checked packages' folders (plugins/ holds pipeline_ops, which Airflow puts on the path).
TREE = ["consumers", "measure", "spark", "infra", "host", "bench", "pipelines", "dags", "plugins"]
VERDICT = re.compile(r"^(?P<name>.+) (?P<verdict>KEPT|BROKEN)$", re.MULTILINE)


def lint_imports(root: Path) -> tuple[int, str]:
    """lint-imports over the tree at `root`, with plugins/ on the path as Airflow puts it."""
    env = {**os.environ, "PYTHONPATH": str(root / "plugins"), "COLUMNS": "300", "NO_COLOR": "1"}
    result = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo"],
                            cwd=root, env=env, capture_output=True, text=True, timeout=300)
    return result.returncode, result.stdout + result.stderr


def verdicts(output: str) -> dict[str, str]:
    """KEPT or BROKEN for each contract id, from lint-imports' summary."""
    by_name = {m["name"]: m["verdict"] for m in VERDICT.finditer(output)}
    return {cid: by_name.get(contract["name"], "missing") for cid, contract in CONTRACTS.items()}


def test_the_tree_keeps_every_contract() -> None:
    code, output = lint_imports(ROOT)
    assert code == 0, output
    assert verdicts(output) == dict.fromkeys(CONTRACTS, "KEPT"), output


def test_the_runtime_contract_holds_every_module_a_fleet_process_imports() -> None:
    """The contract names the runtime by package: every module the fleet comes to import lies in
    one of them, and each of them holds a module the fleet imports."""
    packages = CONTRACTS["runtime"]["source_modules"]
    graph = grimp.build_graph("consumers", cache_dir=None)
    reached, todo = set(), ["consumers.runtime.fleet_process"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph.find_modules_directly_imported_by(module)
    outside = {m for m in reached if m != "consumers" and not any(
        m == p or m.startswith(p + ".") for p in packages)}
    assert outside == set()
    assert {p for p in packages if any(m == p or m.startswith(p + ".") for m in reached)} == set(packages)


@pytest.mark.parametrize(("contract", "importer", "imported"), [
    ("runtime", "consumers.runtime.window_pool", "airflow"),
    ("runtime", "consumers.runtime.stages", "consumers.stand_in"),
    ("runtime", "consumers.config.presets", "consumers.loadgen.source"),
    ("runtime", "consumers.kafka_clients.provisioning", "consumers.runs.pipeline_run"),
    ("spark", "spark.jars", "airflow"),
    ("plugins", "pipeline_ops.registry", "infra.layout"),
    ("measure", "measure.sizing", "consumers.config.events"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, contract: str, importer: str,
                                                imported: str) -> None:
    for folder in TREE:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    package_root = tmp_path / "plugins" if importer.startswith("pipeline_ops") else tmp_path
    module = package_root.joinpath(*importer.split(".")).with_suffix(".py")
    module.write_text(module.read_text() + f"\nimport {imported}  # the violation\n")

    code, output = lint_imports(tmp_path)

    assert code != 0, output
    assert verdicts(output) == {cid: "BROKEN" if cid == contract else "KEPT" for cid in CONTRACTS}, output
    assert f"{importer} -> {imported} (l." in output
