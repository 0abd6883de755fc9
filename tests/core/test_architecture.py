"""The shape of the core: no import cycles, and no backend named outside docstrings and comments."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
BACKEND_NAMES = re.compile(r"chroma|faiss|qdrant|pgvector|pinecone", re.IGNORECASE)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "tombstone").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every tombstone module ``name`` imports, at the top or inside functions (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk meets (each as the path that closes it)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_import_cycles_among_core_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # a package's __init__ only re-exports its own submodules; a submodule importing a sibling through
    # the package is not a cycle of behaviour, so parents are not edges
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
    # control: the finder sees a cycle when there is one, and the graph is not empty
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert "tombstone.saga.engine" in graph["tombstone.api"] | graph["tombstone.saga"]


def test_api_and_saga_do_not_import_each_other():
    modules = _modules()
    saga = [n for n in modules if n.startswith("tombstone.saga")]
    assert "tombstone.saga" in _imports("tombstone.api", modules["tombstone.api"], modules)
    for name in saga:
        assert "tombstone.api" not in _imports(name, modules[name], modules), f"{name} imports the facade"


def _code_without_docs(path: Path) -> list[tuple[int, str]]:
    """The module's tokens that are code: comments dropped, docstrings (string statements) dropped."""
    source = path.read_text()
    tree = ast.parse(source)
    doc_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            doc_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE) or tok.start[0] in doc_lines:
            continue
        out.append((tok.start[0], tok.string))
    return out


def test_the_core_names_no_backend():
    """Everything the core does per backend is an adapter hook; a backend's name appears only in prose."""
    offenders = [f"{path.relative_to(SRC)}:{line}: {text}"
                 for path in sorted((SRC / "tombstone").rglob("*.py"))
                 for line, text in _code_without_docs(path) if BACKEND_NAMES.search(text)]
    assert not offenders, "\n".join(offenders)


def test_the_name_check_can_fail(tmp_path):
    """Control: a backend name in code is found; the same name in a docstring or comment is not."""
    module = tmp_path / "m.py"
    module.write_text('"""About chroma."""\n# faiss\nBACKEND = "qdrant"\n')
    assert [t for _, t in _code_without_docs(module) if BACKEND_NAMES.search(t)] == ['"qdrant"']
