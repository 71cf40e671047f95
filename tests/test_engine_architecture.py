"""The engine integration's shape, read from the source with ``ast``: one session per engine
found once per hook, ``Engine.run`` wrapped once, and nothing patched or registered when a
module is imported but the two calls the user's path needs (each with why)."""
import ast
import os

from _paths import REPO

PASSES = os.path.join(str(REPO), "passes")
#: the functions that find an engine's session
FINDERS = {"session_of", "session_of_engine", "served_session", "engine_state", "held_request"}
#: the modules that may call them: the trampolines, the user's entry points (which ask once
#: which a pipeline section is), and the finders' own module
FINDER_CALLERS = {"engine/hooks.py", "strategy.py", "engine/session.py", "engine/section.py"}
#: module-level calls that change Paddle (a patch, a registration), each with why it runs at
#: import; no other module-level call may be one of CHANGES_PADDLE
AT_IMPORT = {
    ("__init__.py", "register_all"): "the user's new_pass(...) after import pipesplit.passes",
    ("strategy.py", "enable"): "the schedule_names guard: an engine built before "
                               "enable_strategy() gets no call of ours before its train()",
}
#: the names of the calls that patch Paddle's functions or write its registries
CHANGES_PADDLE = {"enable", "register_all", "hold", "_register", "_install", "setattr"}


def _python_files():
    for folder, _, files in os.walk(PASSES):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, PASSES).replace(os.sep, "/"), path


def _tree(rel):
    with open(os.path.join(PASSES, rel), encoding="utf-8") as f:
        return ast.parse(f.read())


def _called_name(call):
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def _finder_calls(node):
    return [n for n in ast.walk(node)
            if isinstance(n, ast.Call) and _called_name(n) in FINDERS]


def test_only_the_trampolines_and_the_entry_points_find_a_session():
    found = [f"{rel}:{call.lineno}" for rel, path in _python_files()
             if rel not in FINDER_CALLERS for call in _finder_calls(_tree(rel))]
    assert not found, ("an engine's code gets its session as an argument; only the "
                       "trampolines (engine/hooks.py) and the user's entry points find it:\n"
                       + "\n".join(found))


def test_each_hook_finds_the_session_once():
    twice = []
    for rel in ("engine/hooks.py", "strategy.py"):
        for node in _tree(rel).body:
            if isinstance(node, ast.FunctionDef) and len(_finder_calls(node)) > 1:
                twice.append(f"{rel}: {node.name}")
    assert not twice, "a hook that finds the session twice:\n" + "\n".join(twice)


def test_engine_run_is_wrapped_once():
    runs = [call.lineno for call in ast.walk(_tree("engine/paddle_patches.py"))
            if isinstance(call, ast.Call) and _called_name(call) == "Patch"
            and len(call.args) > 1 and isinstance(call.args[1], ast.Constant)
            and call.args[1].value == "run"]
    assert len(runs) == 1, f"Engine.run patched at lines {runs}: one wrapper, one step list"


def test_no_session_method_hides_a_state_field():
    """The session is its state with methods: a method named as a field would be replaced by
    the field's value on the first assignment."""
    fields = {node.target.id for cls in ast.walk(_tree("engine/state.py"))
              if isinstance(cls, ast.ClassDef) and cls.name == "EngineState"
              for node in cls.body if isinstance(node, ast.AnnAssign)}
    methods = {node.name for cls in ast.walk(_tree("engine/session.py"))
               if isinstance(cls, ast.ClassDef) and cls.name == "EngineSession"
               for node in cls.body if isinstance(node, ast.FunctionDef)}
    assert fields and methods and not fields & methods


def _module_level_calls(tree):
    """Calls made when the module is imported: its statements' calls outside any function or
    class body."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def test_nothing_is_patched_or_registered_at_import_but_the_named_two():
    found, seen = [], set()
    for rel, _ in _python_files():
        for call in _module_level_calls(_tree(rel)):
            name = _called_name(call)
            if (rel, name) in AT_IMPORT:
                seen.add((rel, name))
            elif name in CHANGES_PADDLE:
                found.append(f"{rel}:{call.lineno}: {ast.unparse(call)}")
    assert not found, "patched or registered at import:\n" + "\n".join(found)
    assert seen == set(AT_IMPORT)


def test_the_scan_sees_module_level_calls():
    code = "x = f()\nif y:\n    g(1)\ndef h():\n    k()\nclass C:\n    m = n()\n"
    assert sorted(_called_name(c) for c in _module_level_calls(ast.parse(code))) == ["f", "g"]


def test_the_engine_keeps_no_context_variable():
    """What an engine's moments need is the session's, handed as arguments: no context
    variable steers them from outside (the plan the bare pass built last, a record for the
    user, is :mod:`pipesplit.passes.last_built`'s)."""
    found = [f"{rel}:{node.lineno}" for rel, _ in _python_files() if rel.startswith("engine/")
             for node in ast.walk(_tree(rel))
             if isinstance(node, ast.Name) and node.id == "ContextVar"
             or isinstance(node, ast.alias) and node.name == "contextvars"]
    assert not found, "a context variable in passes/engine/:\n" + "\n".join(found)


def test_the_session_completes_chunks_without_paddles_completion():
    """Chunk completion is the session's (:mod:`~pipesplit.passes.engine.chunk_completion`):
    nothing in passes/ calls Paddle's ``complete_chunk_id`` or asks its stage rule but the
    trampoline that hands Paddle's own VPP engine Paddle's function."""
    found = [f"{rel}:{call.lineno} {_called_name(call)}" for rel, _ in _python_files()
             for call in ast.walk(_tree(rel)) if isinstance(call, ast.Call)
             and _called_name(call) in ("complete_chunk_id", "get_pp_stage_by_process_mesh",
                                        "paddle_completion")]
    assert not found, "Paddle's chunk completion called:\n" + "\n".join(found)


#: the longest function the engine integration keeps (issue 57: a step list, not nested
#: callbacks; the rest of pipesplit: tests/test_architecture.py's MAX_FUNCTION_LINES)
MAX_ENGINE_FUNCTION_LINES = 60


def test_no_engine_function_is_longer_than_60_lines():
    long = [f"engine/{rel[len('engine/'):]}:{node.lineno} {node.name} "
            f"({node.end_lineno - node.lineno + 1} lines)"
            for rel, _ in _python_files() if rel.startswith("engine/")
            for node in ast.walk(_tree(rel))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_ENGINE_FUNCTION_LINES]
    assert not long, f"engine functions over {MAX_ENGINE_FUNCTION_LINES} lines:\n" + "\n".join(long)
