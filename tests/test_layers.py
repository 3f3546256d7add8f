"""The layering, enforced: the import-linter contracts in pyproject.toml (storage < models < tasks <
flows; within tasks, every stage family above the compute layer) pass, and no module imports another
family's `stages.py` beyond the crossings listed here: tasks/config.py gathering each family's config
section (a new family with a config section adds its line; a family shares code through a library
module, never through its stages)."""
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

from tasks.config import PROJECT_ROOT

# (importer, imported): tasks.config gathers each family's config section from its stages.py, or
# from the family's config module where it has one (refresh, silver), which is no crossing.
KNOWN_CROSSINGS = {
    *(("tasks.config", f"tasks.{family}.stages") for family in (
        "bm25", "chunking", "dense", "evaluation", "fusion", "negatives", "pretrain", "qgen", "readers", "rerank",
        "training")),
}


def _family(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "tasks" and len(parts) > 2 else None


def crossings(graph) -> set[tuple[str, str]]:
    """Every direct import of a family's `stages` module from outside that family, within tasks/."""
    found = set()
    for importer in graph.modules:
        if not importer.startswith("tasks."):
            continue
        for imported in graph.find_modules_directly_imported_by(importer):
            if imported.endswith(".stages") and _family(imported) and _family(importer) != _family(imported):
                found.add((importer, imported))
    return found


def test_the_import_linter_contracts_pass():
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_the_compute_contract_puts_every_family_above_the_compute_layer():
    # tasks.compute could import a family the contract leaves out, unseen: it lists them all.
    contracts = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    compute = next(c for c in contracts if c.get("containers") == ["tasks"])
    families, bottom = compute["layers"]
    packages = {p.parent.name for p in (PROJECT_ROOT / "tasks").glob("*/__init__.py")}
    assert bottom == "compute"
    assert {name.strip() for name in families.split(":")} == packages - {"compute"}


def test_no_family_reaches_into_another_familys_stages_beyond_the_known_exceptions():
    found = crossings(grimp.build_graph("tasks", cache_dir=None))   # a cache can outlive a checkout's edits
    assert not found - KNOWN_CROSSINGS, sorted(found - KNOWN_CROSSINGS)   # a new crossing
    assert not KNOWN_CROSSINGS - found, sorted(KNOWN_CROSSINGS - found)   # removed: drop it from the list


def test_the_check_sees_a_crossing():
    graph = grimp.ImportGraph()
    for module in ("tasks", "tasks.a", "tasks.a.helpers", "tasks.b", "tasks.b.stages", "tasks.b.models"):
        graph.add_module(module)
    graph.add_import(importer="tasks.a.helpers", imported="tasks.b.stages")
    graph.add_import(importer="tasks.a.helpers", imported="tasks.b.models")  # a library module: allowed
    graph.add_import(importer="tasks.b.models", imported="tasks.b.stages")   # its own family: allowed
    assert crossings(graph) == {("tasks.a.helpers", "tasks.b.stages")}


def test_the_independence_contract_lists_every_familys_stages():
    # a family's stages left out of the list could be imported by another family's stages, unseen
    contracts = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    independent = next(c for c in contracts if c["type"] == "independence")
    stages = {f"tasks.{p.parent.name}.stages" for p in (PROJECT_ROOT / "tasks").glob("*/stages.py")}
    assert set(independent["modules"]) == stages
