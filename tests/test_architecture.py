"""The layering of the packages, read from the source with ``ast``: imports point one way
(job_list <- ir_utils <- passes <- tools), no module circle (module-level, function-level and
``if TYPE_CHECKING:`` imports alike), every package and every test file (in every folder of
``tests/``) stays in small pieces, job-type strings are built only by ``job_list.ir.job_type``,
no test module imports another, only the transport package names a collective backend, and
only it (and the engine state's opening) resolves a device or reads a plan's way."""
import ast
import os
import re

import pytest
from _paths import REPO

ROOT = str(REPO)
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


def _parse(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _imported(module, path):
    """Our modules ``module`` imports anywhere in its file: module level, inside functions or
    under ``if TYPE_CHECKING:`` (a circle only type checkers walk is still a circle)."""
    is_package = path.endswith("__init__.py")
    base = module.split(".") if is_package else module.split(".")[:-1]
    targets = set()
    for node in ast.walk(_parse(path)):
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


GRAPH = {module: _imported(module, path) for module, path in MODULES.items()}


def _edges():
    return {(a, b) for a, targets in GRAPH.items() for b in targets}


def test_graph_sees_module_and_function_level_imports():
    assert ("job_list.auto", "job_list.greedy") in _edges()            # relative, module level
    assert ("passes.split.per_rank", "job_list.ir") in _edges()        # absolute pipesplit.
    assert "job_list.zero_bubble" in GRAPH["job_list"]                 # from . import x
    assert any(b.startswith("job_list") for b in GRAPH["tools.cli"])   # function level (lazy)


def test_graph_sees_type_checking_imports(tmp_path):
    path = tmp_path / "validate.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from .views import step_grid\n")
    assert "job_list.views" in _imported("job_list.validate", str(path))


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
    """Every module of the packages and every file under ``tests/`` (any folder)."""
    long_files, long_functions = [], []
    for module, path in sorted(MODULES.items()) + sorted(TEST_FILES.items()):
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


# --------------------------------------------------------------------------- job types

#: the kinds a job type starts with (``send_`` / ``recv_`` cover the four comm kinds)
_JOB_KIND_TAIL = re.compile(r"(?<![A-Za-z0-9_])(forward|backward|backward_b|backward_w|send_|recv_"
                            r"|send_forward|recv_forward|send_backward|recv_backward)$")
#: a formatted value that names a job kind: ``{kind}``, ``{job.kind}``, ``{self.kind}``
_KIND_VALUE = re.compile(r"(^|\.)kind$")
#: files allowed to build job-type strings themselves, each with why
JOB_TYPE_ALLOWED = {
    # Paddle's own job types, fed to Paddle's VScheduleCreator by a script that runs with
    # paddlepaddle alone (pipesplit need not be installed)
    "tools/bench/reference_orders/dump_paddle_orders.py",
}


def _is_kind_text(node):
    return isinstance(node, ast.Constant) and isinstance(node.value, str) \
        and _JOB_KIND_TAIL.search(node.value) is not None


def _is_kind_value(node):
    return isinstance(node, ast.FormattedValue) and \
        _KIND_VALUE.search(ast.unparse(node.value)) is not None


def _names_a_bystander(node):
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and re.search(r"bystander_?$", node.value) is not None) or (
        isinstance(node, ast.FormattedValue) and ast.unparse(node.value).endswith("BYSTANDER"))


def _built_job_types(tree):
    """(line, source) of every expression that writes a kind and a number together: an
    f-string with a kind literal (``f"forward{c}"``, ``f"send_{kind}{c}"``) or a kind value
    (``f"{kind}{c}"``) directly followed by a formatted value, a bystander job type
    (``f"bystander{s}_{t}"``, ``f"{BYSTANDER}_{r}_{t}"``; "a bystander of {x}" is prose), or
    ``"forward" + ...``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            pairs = list(zip(node.values, node.values[1:]))
            if any(isinstance(b, ast.FormattedValue) and (_is_kind_text(a) or _is_kind_value(a))
                   for a, b in pairs) or any(
                    _names_a_bystander(a) and any(isinstance(b, ast.FormattedValue)
                                                  for b in node.values[i + 1:])
                    for i, a in enumerate(node.values)):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) \
                and _is_kind_text(node.left) and not isinstance(node.right, ast.Constant):
            yield node.lineno, ast.unparse(node)


def test_the_scan_sees_built_job_types():
    code = ('a = f"forward{c}"; b = f"send_{kind}{chunk}"; c = f"{job.kind}{job.chunk}"; '
            'd = "backward_b" + str(c); e = f"{k} ms"; f = f"rank{r}_{x}"; g = f"pipesplit_{c}"\n'
            'h = f"bystander{s}_{t}"; i = f"{BYSTANDER}_{r}_{t}"; j = f"a bystander of {x}"')
    assert [line for line, _ in _built_job_types(ast.parse(code))] == [1, 1, 1, 1, 2, 2]


def _lines_of_job_type(tree):
    """The lines of ``job_type`` and ``bystander_type`` (job_list/ir.py), the one place that
    builds them."""
    return {line for node in tree.body if isinstance(node, ast.FunctionDef)
            and node.name in ("job_type", "bystander_type")
            for line in range(node.lineno, node.end_lineno + 1)}


def test_job_types_are_built_by_job_type_only():
    found = []
    for module, path in sorted(MODULES.items()):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if rel in JOB_TYPE_ALLOWED:
            continue
        tree = _parse(path)
        own = _lines_of_job_type(tree) if module == "job_list.ir" else set()
        found += [f"{rel}:{line}: {src}" for line, src in _built_job_types(tree)
                  if line not in own]
    assert not found, "build job types with pipesplit.job_list.ir.job_type(kind, chunk):\n" + \
        "\n".join(found)


def test_the_checkout_imports_the_package_without_path_tricks():
    """``pipesplit/`` links each sub-package folder: the checkout imports the very files an
    installation copies, through one ``__path__``, and nothing else of the repository root
    (``pipesplit.setup`` is not ``setup.py``)."""
    import importlib

    import pipesplit

    assert len(pipesplit.__path__) == 1
    for package in PACKAGES:
        module = importlib.import_module(f"pipesplit.{package}")
        if os.path.realpath(os.path.dirname(pipesplit.__file__)) == os.path.join(ROOT, "pipesplit"):
            assert os.path.realpath(module.__file__) == os.path.join(ROOT, package, "__init__.py")
    with pytest.raises(ImportError):
        importlib.import_module("pipesplit.setup")


# --------------------------------------------------------------------------- state

#: the one attribute pipesplit sets on Paddle's objects, and the one line that names it
HANDLE_LINE = ("passes/engine/state.py", 'HANDLE = "_pipesplit"')


def _pipesplit_attributes(tree):
    """(line, source) of every ``_pipesplit...`` attribute name: a string constant
    (``setattr(x, "_pipesplit_plan", ...)``) or an attribute (``engine._pipesplit_plan``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("_pipesplit"):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_pipesplit"):
            yield node.lineno, ast.unparse(node)


def test_the_engine_state_is_the_one_pipesplit_attribute_on_paddle_objects():
    found = []
    for module, path in sorted(MODULES.items()):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        lines = open(path, encoding="utf-8").read().splitlines()
        found += [f"{rel}:{line}: {src}" for line, src in _pipesplit_attributes(_parse(path))
                  if (rel, lines[line - 1].strip()) != HANDLE_LINE]
    assert not found, ("keep what pipesplit knows of an engine in its EngineState "
                       "(passes/engine/state.py), at its one handle:\n" + "\n".join(found))


#: module-level objects that stand for changes pipesplit makes to Paddle's own process-wide
#: registries (its functions, its pass names): the only process-wide state, each with why
PROCESS_WIDE = {
    ("passes/engine/door.py", "DOOR"): "Paddle's functions replaced, and Paddle's own",
    ("passes/split/registration.py", "ROUTING"): "Paddle's pass names routed, and Paddle's own",
    ("passes/engine/cpu_hooks.py", "_gloo_rings"): "the gloo contexts made in Paddle's "
                                            "CommContextManager, which cannot be asked",
}
_MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "Counter", "OrderedDict", "deque"}
#: objects that hold no state of their own: a type variable; a context variable, whose value
#: belongs to the running context (set by the call that owns it)
_STATELESS_CALLS = {"TypeVar", "ContextVar"}


def _module_state(tree):
    """(line, name) of module-level names bound to a mutable container or an object, and
    ``global`` statements anywhere."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else []
        value = getattr(node, "value", None)
        mutable = isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp,
                                     ast.SetComp)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and (value.func.id in _MUTABLE_CALLS or value.func.id[:1].isupper())
            and value.func.id not in _STATELESS_CALLS)
        for target in targets:
            if isinstance(target, ast.Name) and mutable and target.id != "__all__" \
                    and not (target.id.isupper() and not isinstance(value, ast.Call)):
                yield node.lineno, target.id
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            yield node.lineno, "global " + ", ".join(node.names)


def test_the_scan_sees_module_state():
    code = ("a = [0]\n_b = {}\nc: dict = dict()\nD = Door()\nE = {'x': 1}\n__all__ = ['a']\n"
            "T = ('x',)\ndef f():\n    global a\nV = ContextVar('v')\n")
    assert list(_module_state(ast.parse(code))) == [(1, "a"), (2, "_b"), (3, "c"), (4, "D"),
                                                   (9, "global a")]


def test_no_module_level_state_in_passes():
    """No counters, last plans or switches kept in a module of ``passes/`` or ``ir_utils/``:
    an engine's belong to its EngineState, an exchange's round to the launch store
    (``passes/transport/launch_store.py``); UPPER_CASE literals are constants."""
    found = []
    for module, path in sorted(MODULES.items()):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if rel.split("/")[0] not in ("passes", "ir_utils"):
            continue
        found += [f"{rel}:{line}: {name}" for line, name in _module_state(_parse(path))
                  if (rel, name) not in PROCESS_WIDE]
    assert not found, "module-level state:\n" + "\n".join(found)


# --------------------------------------------------------------------------- tests

TESTS = os.path.join(ROOT, "tests")


#: other projects' files the tests run as they are (Paddle's own test, vendored unchanged):
#: not ours to restyle
VENDORED = os.path.join(TESTS, "vendor")


def _test_files():
    """Every .py file under ``tests/``, in every folder but the vendored ones: relative path
    -> path."""
    found = {}
    for folder, dirs, files in os.walk(TESTS):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__"))
                         and os.path.join(folder, d) != VENDORED)
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[os.path.relpath(path, ROOT).replace(os.sep, "/")] = path
    return found


TEST_FILES = _test_files()
#: the test modules pytest collects (relative path -> module name: pytest imports a test file
#: of a folder without ``__init__.py`` by its file name)
TEST_MODULES = {rel: os.path.basename(rel)[:-3] for rel in TEST_FILES
                if os.path.basename(rel).startswith("test_")}


def test_the_scan_sees_the_test_modules_of_every_folder():
    folders = {os.path.dirname(rel) for rel in TEST_MODULES}
    on_disk = {os.path.relpath(folder, ROOT).replace(os.sep, "/")
               for folder, _, files in os.walk(TESTS)
               if any(n.startswith("test_") and n.endswith(".py") for n in files)}
    assert folders == on_disk and {"tests", "tests/engine", "tests/multiprocess"} <= folders
    assert TEST_MODULES["tests/engine/test_loss_location.py"] == "test_loss_location"
    assert "tests/helpers/_launch.py" in TEST_FILES and "tests/workers/engine_grid.py" in TEST_FILES


def test_test_modules_have_names_of_their_own():
    """pytest imports each test file by its name (``rootdir``-relative packages are not used):
    two of one name in two folders would shadow each other."""
    by_name = {}
    for rel, name in sorted(TEST_MODULES.items()):
        by_name.setdefault(name, []).append(rel)
    assert not {n: rels for n, rels in by_name.items() if len(rels) > 1}


def _imported_names(tree):
    """(line, dotted name) of every module an import names, and of every name a ``from``
    import takes (``from tests.engine import test_strategy`` takes a module too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module:
                yield node.lineno, module
            yield from ((node.lineno, f"{module}.{a.name}".lstrip(".")) for a in node.names)


def test_the_scan_sees_imports_of_test_modules():
    code = ("import test_a\nfrom test_b import x\nfrom tests.engine import test_c\n"
            "from . import test_d\nimport _launch\n")
    names = {"test_a", "test_b", "test_c", "test_d"}
    seen = {line for line, m in _imported_names(ast.parse(code))
            if set(m.split(".")) & names}
    assert seen == {1, 2, 3, 4}


def test_no_test_module_imports_another():
    """Shared test code lives in helper modules (``tests/helpers``), never in a test module:
    no file under ``tests/`` (any folder: tests, helpers, workers) imports a test module."""
    names = set(TEST_MODULES.values())
    found = []
    for rel, path in sorted(TEST_FILES.items()):
        found += [f"{rel}:{line}: {m}" for line, m in _imported_names(_parse(path))
                  if set(m.split(".")) & names]
    assert not found, "\n".join(found)


# --------------------------------------------------------------------------- backends

#: the one package that names a collective backend
TRANSPORT = "passes/transport/"


def _declared_backends():
    """{constant name: backend name} of the backends the transport package declares (its
    ``BACKENDS = (GLOO, NCCL)`` and their assignments), read with ``ast``."""
    tree = _parse(os.path.join(ROOT, "passes", "transport", "__init__.py"))
    values = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)
              and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    return {e.id: values[e.id].value for e in values["BACKENDS"].elts}


#: the constants that name a backend for Paddle's APIs, and the names (Paddle's)
BACKEND_CONSTANTS = tuple(_declared_backends())
BACKEND_NAMES = tuple(_declared_backends().values())
#: files outside the transport allowed to compare with a backend name, each with why
BACKEND_COMPARISONS_ALLOWED = {
    # Paddle's _new_process_group_impl(backend, ...) names the backend of the group it makes;
    # the CPU stand-in gives gloo's groups a store of their own and leaves the others alone
    "passes/engine/cpu_hooks.py",
    # the transport's own test checks what each device type answers
    "tests/builders/test_transport.py",
}
#: folders no checkout's Python lives in: build outputs, caches, logs (.gitignore)
_NOT_SOURCE = ("build", "dist", "log")


def _python_files():
    """Every .py file of the checkout: relative path -> path (``pipesplit/``'s links to the
    package folders are not followed: the folders are walked themselves)."""
    found = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")) and d not in _NOT_SOURCE
                         and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[os.path.relpath(path, ROOT).replace(os.sep, "/")] = path
    return found


def _backend_literals(tree):
    """(line, source) of every string literal (an f-string's text too) that is a backend name:
    ``"gloo"``, ``'NCCL'`` (a sentence that mentions gloo is prose, not a name)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.strip().lower() in BACKEND_NAMES:
            yield node.lineno, repr(node.value)


def _names_a_backend(node) -> bool:
    name = node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else None
    return name in BACKEND_CONSTANTS or (isinstance(node, ast.Attribute) and name == "backend")


def _backend_comparisons(tree):
    """(line, source) of every comparison with a backend: with ``GLOO`` / ``NCCL`` or with a
    ``.backend`` attribute (a device decision, which belongs to the transport)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
                _names_a_backend(o) for o in [node.left] + node.comparators):
            yield node.lineno, ast.unparse(node)


def test_the_scan_sees_backend_names():
    code = ('a = "gloo"\nb = f"{x}NCCL"\nif t.backend == y: pass\nif b != GLOO: pass\n'
            'c = "gloo broadcasts"\nd = new_group(backend=GLOO)\ne = info.backend\n'
            'f = x.NCCL in ways\n')
    assert len(BACKEND_NAMES) == 2
    assert {n.upper() for n in BACKEND_NAMES} == set(BACKEND_CONSTANTS)
    tree = ast.parse(code)
    assert [line for line, _ in _backend_literals(tree)] == [1, 2]
    assert [line for line, _ in _backend_comparisons(tree)] == [3, 4, 8]
    files = _python_files()
    assert "passes/transport/gloo.py" in files and "tests/engine/test_cpu_group_store.py" in files
    assert "setup.py" in files and not any(rel.startswith("pipesplit/passes") for rel in files)


def test_only_the_transport_names_a_backend():
    """No ``"gloo"`` / ``"nccl"`` literal in any .py file of the checkout outside
    ``passes/transport/`` (Paddle's APIs that take a backend name get
    ``pipesplit.passes.transport.GLOO`` / ``NCCL``), and no comparison with one: which backend
    a device uses, and what follows from it, is the transport's to say
    (``pipesplit.passes.transport.devices``)."""
    literals, comparisons = [], []
    for rel, path in sorted(_python_files().items()):
        if rel.startswith(TRANSPORT):
            continue
        tree = _parse(path)
        literals += [f"{rel}:{line}: {src}" for line, src in _backend_literals(tree)]
        if rel not in BACKEND_COMPARISONS_ALLOWED:
            comparisons += [f"{rel}:{line}: {src}" for line, src in _backend_comparisons(tree)]
    assert not literals, "name a backend through pipesplit.passes.transport:\n" + \
        "\n".join(literals)
    assert not comparisons, "ask the transport (pipesplit.passes.transport.base.Transport) " \
        "instead of comparing backends:\n" + "\n".join(comparisons)


# --------------------------------------------------------------------------- device decisions

#: the transport package's functions that name the device a process runs on
#: (``passes/transport/devices.py``)
DEVICE_RESOLVERS = ("resolve_device", "transport_for")


def _declared_ways():
    """The constant names of the plans' ways the transport package declares (its ``WAYS``
    tuple), less those that also name a backend (the backend test covers them)."""
    tree = _parse(os.path.join(ROOT, "passes", "transport", "__init__.py"))
    ways = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and [ast.unparse(t) for t in n.targets] == ["WAYS"])
    return tuple(e.id for e in ways.elts if e.id not in BACKEND_CONSTANTS)


#: the ways only the transport reads: ``BROADCAST``, ``WORLD_RING``, ``LOCKSTEP``,
#: ``NCCL_ON_COMPUTE_STREAM``
WAY_CONSTANTS = _declared_ways()
#: library files outside the transport allowed to resolve a device, each with why
DEVICE_DECISIONS_ALLOWED = {
    # the engine's state is opened with its device's transport, once per engine
    "passes/engine/open_state.py",
}


def _device_decisions(tree):
    """(line, source) of every use of a device resolver (``transport_for(...)``,
    ``devices.resolve_device``), of a plan's ``.way`` and of a way constant (``WORLD_RING``):
    a device or way decision, which belongs to the transport."""
    for node in ast.walk(tree):
        name = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else None
        if name in DEVICE_RESOLVERS or name in WAY_CONSTANTS or (
                isinstance(node, ast.Attribute) and name == "way"):
            yield node.lineno, ast.unparse(node)


def test_the_scan_sees_device_decisions():
    code = ('t = transport_for("cpu")\nd = devices.resolve_device()\n'
            'if t.way == WORLD_RING: pass\nx = LOCKSTEP\nhandler = table[plan.way]\n'
            'y = t.backend\nz = rank_plan_transport("cpu", 2)\n'
            'def f():\n    return resolve_device("auto")\nw = "the way"\n')
    assert set(WAY_CONSTANTS) == {"BROADCAST", "WORLD_RING", "LOCKSTEP", "NCCL_ON_COMPUTE_STREAM"}
    assert sorted({line for line, _ in _device_decisions(ast.parse(code))}) == [1, 2, 3, 4, 5, 9]


def test_only_the_transport_decides_the_device():
    """No module of the library outside ``passes/transport/`` (and the engine state's opening)
    resolves the device a process runs on (``resolve_device``, ``transport_for``) or reads a
    plan's way (``transport.way``, ``WORLD_RING``): a builder hands its rank to the plan's
    transport (``Transport.rank_comm``), whose table picks the way's handler."""
    found = []
    for module, path in sorted(MODULES.items()):
        rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
        if rel.startswith(TRANSPORT) or rel in DEVICE_DECISIONS_ALLOWED:
            continue
        found += [f"{rel}:{line}: {src}" for line, src in _device_decisions(_parse(path))]
    assert not found, "ask the transport (pipesplit.passes.transport) instead:\n" + \
        "\n".join(found)
