"""The package's layout as docs/design.md describes it: every module in its tree, imports only down its layers.

The imports are read from the source (``ast``), those inside functions too,
so nothing here imports the modules.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nblstm"
DESIGN = ROOT / "docs" / "design.md"


def _modules():
    """``{dotted name: path}`` of every module of the package (a package by its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name, source, is_package, modules):
    """The package's modules that module ``name`` (its ``source``) imports, anywhere in it."""
    found = set()

    def add(base, names):
        for alias in names:
            candidate = f"{base}.{alias}" if base else alias
            found.add(candidate if candidate in modules else base)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)] + ([node.module] if node.module else [])
            add(".".join(base), [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "nblstm":
            add(node.module, [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "nblstm")
    found.discard(name)
    unknown = found - set(modules)
    assert not unknown, f"{name} imports {sorted(unknown)}, which are not modules of nblstm"
    return found


def _design_blocks():
    text = DESIGN.read_text()
    blocks = re.findall(r"```text\n(.*?)```", text, re.S)
    tree = next(b for b in blocks if b.startswith("nblstm/\n"))
    layers = next(b for b in blocks if re.match(r"0 ", b))
    return tree, layers


def _tree_modules(tree):
    """Dotted names of the modules the layout tree lists (folders are packages)."""
    names, stack = set(), []
    for line in tree.splitlines()[1:]:
        entry = line.strip().split("  ")[0]
        depth = (len(line) - len(line.lstrip())) // 2 - 1
        stack = stack[:depth]
        if entry.endswith("/"):
            stack.append(entry[:-1])
            names.add(".".join(["nblstm", *stack]))
            continue
        for file in (f.strip() for f in entry.split(",")):
            stem = file[:-3]
            names.add(".".join(["nblstm", *stack]) if stem == "__init__" else ".".join(["nblstm", *stack, stem]))
    return names


def _layer_of(layers):
    table = {}
    for line in layers.splitlines():
        number, *names = line.split()
        for n in names:
            table["nblstm" if n == "__init__" else f"nblstm.{n}"] = int(number)

    def layer(module):
        parts = module.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in table:
                return table[".".join(parts[:k])]
        raise AssertionError(f"docs/design.md's layers do not place {module}")

    return layer


@pytest.fixture(scope="module")
def graph():
    modules = _modules()
    return {name: _imports(name, path.read_text(), path.name == "__init__.py", modules)
            for name, path in modules.items()}


def test_every_module_is_in_the_layout_tree():
    tree, _ = _design_blocks()
    listed, actual = _tree_modules(tree), set(_modules())
    assert not sorted(actual - listed), f"modules missing from docs/design.md's layout: {sorted(actual - listed)}"
    assert not sorted(listed - actual), f"docs/design.md's layout lists modules that do not exist: " \
                                        f"{sorted(listed - actual)}"


def test_no_import_runs_up_a_layer(graph):
    layer = _layer_of(_design_blocks()[1])
    up = sorted(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
                for a, targets in graph.items() for b in targets if layer(b) > layer(a))
    assert not up, "imports up a layer:\n" + "\n".join(up)


def _cycles(graph):
    """The loops of ``graph`` (Tarjan's strongly connected components of more than one module)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles(graph):
    cycles = _cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def test_the_checks_see_an_import_up_a_layer_and_a_loop():
    """The checks above can fail: an import inside a function, up a layer, and a loop of two modules."""
    modules = {"nblstm.options": None, "nblstm.cell": None, "nblstm.cell.cell": None, "nblstm.cell.stepper": None}
    source = "def f():\n    from .cell import cell\n"
    assert _imports("nblstm.options", source, False, modules) == {"nblstm.cell.cell"}
    layer = _layer_of("0  options\n4  cell\n")
    assert layer("nblstm.cell.cell") > layer("nblstm.options")
    cell = _imports("nblstm.cell.cell", "def g():\n    from .stepper import Stepper\n", False, modules)
    stepper = _imports("nblstm.cell.stepper", "from .cell import LSTMCell\n", False, modules)
    assert _cycles({"nblstm.cell.cell": cell, "nblstm.cell.stepper": stepper}) == [
        ["nblstm.cell.cell", "nblstm.cell.stepper"]]


#: The most parameters a compiled function may take: options travel as one record
#: (:class:`nblstm.options.KernelOptions`), arrays in the records of their family.
MAX_KERNEL_PARAMETERS = 12
_COMPILED = re.compile(r"^(njit|jit|cuda\.jit|kernel|numba\.njit|overload)\b")


def _compiled_functions(source):
    """``(name, parameter count)`` of every function compiled by numba in ``source`` (by its decorator)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(
                _COMPILED.match(ast.unparse(d)) and not ast.unparse(d).startswith("overload")
                for d in node.decorator_list):
            args = node.args
            yield node.name, len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) + bool(args.vararg)


def test_no_compiled_function_takes_more_than_twelve_parameters():
    too_many = [f"{path.relative_to(ROOT)}:{name} ({count})" for path in _modules().values()
                for name, count in _compiled_functions(path.read_text()) if count > MAX_KERNEL_PARAMETERS]
    assert not too_many, f"more than {MAX_KERNEL_PARAMETERS} parameters: {too_many}"


def test_the_parameter_check_sees_a_long_kernel():
    source = "@njit(**KERNEL)\ndef k(a, b, c, d, e, f, g, h, i, j, k, l, m):\n    pass\n"
    source += "@cuda.jit(device=True)\ndef d(a, *rest):\n    pass\n"
    assert list(_compiled_functions(source)) == [("k", 13), ("d", 2)]
