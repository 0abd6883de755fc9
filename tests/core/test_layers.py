"""The adapter contract stands below everything it names, and each adapter package imports in one direction.

Read from the source, every import counted (at the top, inside a function, or only for type checking): a
new engine is written against a contract that reaches nothing which reaches it back, and an adapter package
whose modules import each other in a circle cannot be read (or loaded) from one end.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"tombstone": ROOT / "src" / "tombstone", "tombstone_adapters": ROOT / "adapters"}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _known(name: str) -> str | None:
    """The module of ours that ``name`` (a module, or a name inside one) is, or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if _known(full) == full else base)
    return {m for m in map(_known, found) if m and m != module}


GRAPH = {module: _imports(module) for module in MODULES}


def _reach(start: str, within: str = "") -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt.startswith(within) and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_is_read_from_the_source():
    """Control: the reader sees the imports it must (so the checks below can fail)."""
    assert "tombstone.errors" in GRAPH["tombstone.contract"]
    assert "tombstone.contract" in GRAPH["tombstone.demo"]
    assert "tombstone_adapters.chroma.wrapper" in GRAPH["tombstone_adapters.chroma.adapter"]
    # a cycle the checks below would report, built from two real modules
    assert "tombstone.api" in _reach("tombstone.demo")


def test_the_contract_reaches_nothing_that_reaches_it():
    circles = sorted(m for m in _reach("tombstone.contract") if "tombstone.contract" in _reach(m))
    assert not circles, f"the contract imports, through these, a module that imports it: {circles}"


def test_the_contract_names_the_demo_kit_and_scan_report_from_below():
    reached = _reach("tombstone.contract")
    assert {"tombstone.kit", "tombstone.scanreport"} <= reached
    assert not {"tombstone.demo", "tombstone.scan", "tombstone.api", "tombstone.cli"} & reached


@pytest.mark.parametrize("package", sorted({m.split(".")[1] for m in MODULES
                                            if m.startswith("tombstone_adapters.") and m.count(".") >= 1}))
def test_each_adapter_package_imports_in_one_direction(package):
    prefix = f"tombstone_adapters.{package}"
    mine = [m for m in MODULES if m == prefix or m.startswith(prefix + ".")]
    circles = sorted(m for m in mine if m != prefix and m in _reach(m, within=prefix + "."))
    assert not circles, f"modules of {prefix} that import themselves back through the package: {circles}"


def test_the_demo_kit_is_what_the_contract_says_hooks_get():
    """Every member the contract's ``Kit`` lists, the demo's ``DemoKit`` has (a field, a method or a property);
    the control: a name not in the kit is reported."""
    import dataclasses

    from tombstone.demo import DemoKit
    from tombstone.kit import Kit

    listed = set(Kit.__annotations__) | {n for n, v in vars(Kit).items()
                                          if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    has = {f.name for f in dataclasses.fields(DemoKit)} | {n for n in dir(DemoKit) if not n.startswith("_")}
    assert {"root", "tomb", "lineage", "chunks", "embedder", "services"} <= listed
    assert not listed - has, f"the kit lists what DemoKit lacks: {sorted(listed - has)}"
    assert "no_such_member" not in has
