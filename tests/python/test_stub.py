"""python/datahelix/_C.pyi matches the module datahelix._C: every public name of the module is
in the stub and every name of the stub is in the module (type aliases, plain assignments in
the stub, excepted); a class's members in the stub exist on the class and its public methods
are in the stub; a function whose signature inspect can read has the stub's parameters."""
import ast
import inspect
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUB = os.path.join(ROOT, "python", "datahelix", "_C.pyi")


def _stub():
    with open(STUB, encoding="utf-8") as f:
        tree = ast.parse(f.read(), STUB)
    names, aliases = {}, set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names, aliases


def _params(fn):
    """(name, kind) of a stub function's parameters, self left out."""
    a = fn.args
    out = [(p.arg, inspect.Parameter.POSITIONAL_ONLY) for p in a.posonlyargs]
    out += [(p.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    out += [(p.arg, inspect.Parameter.KEYWORD_ONLY) for p in a.kwonlyargs]
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return [p for p in out if p[0] != "self"]


def _public(name):
    return not name.startswith("_")


def test_every_module_name_is_in_the_stub_and_back(datahelix):
    names, aliases = _stub()
    module = {n for n in dir(datahelix._C) if _public(n)}
    assert sorted(module - set(names)) == [], "in datahelix._C, not in _C.pyi"
    assert sorted(set(names) - module) == [], "in _C.pyi, not in datahelix._C"
    assert not aliases & module, "a stub alias shadows a module name"


def test_class_members_match(datahelix):
    names, _ = _stub()
    for name, node in names.items():
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(datahelix._C, name)
        members = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                members.add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members.add(item.target.id)
        if issubclass(cls, BaseException):
            continue  # code and name are set on each instance
        for m in members:
            if m == "__buffer__":  # the buffer protocol: a slot, a method from Python 3.12
                continue
            assert hasattr(cls, m), f"_C.pyi: {name}.{m} is not on datahelix._C.{name}"
        for m, value in vars(cls).items():
            if _public(m) and callable(value):
                assert m in members, f"datahelix._C.{name}.{m} is not in _C.pyi"


def test_signatures_match_where_inspect_reads_them(datahelix):
    names, _ = _stub()
    checked = 0
    for name, node in names.items():
        if not isinstance(node, ast.FunctionDef):
            continue
        try:
            sig = inspect.signature(getattr(datahelix._C, name))
        except (ValueError, TypeError):
            continue  # no __text_signature__
        got = [(p.name, p.kind) for p in sig.parameters.values()]
        assert got == _params(node), f"_C.{name}: the module has {sig}"
        checked += 1
    assert checked >= 3  # values.c's functions carry their signatures
