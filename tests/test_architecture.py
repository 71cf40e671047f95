"""The layering of the packages, read from the source with ``ast``: imports point one way
(job_list <- ir_utils <- passes <- tools), no module circle (module-level and function-level
imports alike), and every package stays in small pieces."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("job_list", "ir_utils", "passes", "tools")
#: packages each package must not import
FORBIDDEN = {"job_list": ("passes", "ir_utils", "tools"), "ir_utils": ("passes", "tools"),
             "passes": ("tools",)}
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _module_files():
    """module name (``job_list.auto``, ``passes`` for a package's __init__) -> path."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join(parts)] = path
    return found


MODULES = _module_files()


def _imported(module, path):
    """Our modules ``module`` imports anywhere in its file (module level or inside functions)."""
    is_package = path.endswith("__init__.py")
    base = module.split(".") if is_package else module.split(".")[:-1]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    targets = set()
    type_only = {id(inner) for node in ast.walk(tree) if _is_type_checking_block(node)
                 for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue  # "if TYPE_CHECKING:" imports never run
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[:len(base) - (node.level - 1)]
                prefix = ".".join(anchor + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("pipesplit."):
                prefix = node.module[len("pipesplit."):]
            else:
                continue
            # "from . import classic" / "from .registry import build_schedule": a submodule if
            # one is named, else the module itself
            names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("pipesplit."):
                name = name[len("pipesplit."):]
            while name and name not in MODULES:  # "pipesplit.job_list.ir.Job" -> job_list.ir
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def _is_type_checking_block(node):
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


GRAPH = {module: _imported(module, path) for module, path in MODULES.items()}


def _edges():
    return {(a, b) for a, targets in GRAPH.items() for b in targets}


def test_graph_sees_module_and_function_level_imports():
    assert ("job_list.auto", "job_list.greedy") in _edges()            # relative, module level
    assert ("passes.per_rank", "job_list.ir") in _edges()              # absolute pipesplit.
    assert "job_list.zero_bubble" in GRAPH["job_list"]                 # from . import x
    assert any(b.startswith("job_list") for b in GRAPH["tools.cli"])   # function level (lazy)


def test_no_import_cycles():
    edges = _edges()
    succ = {m: sorted(b for a, b in edges if a == m) for m in MODULES}
    state, stack, cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in succ[node]:
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for module in sorted(MODULES):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package):
    bad = sorted((a, b) for a, b in _edges()
                 if a.split(".")[0] == package and b.split(".")[0] in FORBIDDEN[package])
    assert not bad, f"{package} must not import {FORBIDDEN[package]}: {bad}"


def test_files_and_functions_are_small():
    long_files, long_functions = [], []
    for module, path in sorted(MODULES.items()):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            long_files.append(f"{module}: {lines} lines")
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{module}.{node.name}: {length} lines")
    assert not long_files, long_files
    assert not long_functions, long_functions
