"""Source capture for JSON-mode remote functions (CLIENT_API.md §8).

A JSON-mode call uploads the function's *source*, so the function must be rebuildable from
its text alone: no closure, no outside globals, no decorators but ours, no lambda. This
module checks that and produces the uploaded module: ``from __future__ import
annotations``, the function with decorators, annotations and default expressions removed
(defaults are bound client-side), and a generated dispatcher.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dis
import inspect
import textwrap
import types
from collections.abc import Callable

#: Parameters of the generated dispatcher (CLIENT_API §8 program shape).
_DISPATCHER_PARAMETERS = ("nargs", "names", "literals", "values")

_PICKLE_HINT = "; use serialization='pickle' to send it by value"


def dispatcher_name(fn: Callable[..., object]) -> str:
    """Name of the generated dispatcher for ``fn``."""
    return f"_kcoral_invoke_{fn.__name__}"


def json_module_source(fn: types.FunctionType) -> str:
    """Check that ``fn`` can travel as source and return the module to upload.

    ``ValueError`` names the first reason it cannot (closure, decorator, missing source,
    lambda, outside global). The caller checks the callable's type first.
    """
    name = fn.__name__
    if name == "<lambda>":
        raise ValueError("a lambda cannot be a JSON-mode remote function" + _PICKLE_HINT)
    if fn.__code__.co_freevars:
        names = ", ".join(fn.__code__.co_freevars)
        raise ValueError(
            f"remote function {name!r} uses closure variables ({names})" + _PICKLE_HINT
        )
    node, lines = _parse_function(fn)
    _check_decorators(fn, node)
    _check_globals(fn)
    return _module_text(fn, node, lines)


def _parse_function(
    fn: types.FunctionType,
) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, list[str]]:
    # getsource on the *code object*: on the function it would follow __wrapped__.
    try:
        source = inspect.getsource(fn.__code__)
    except (OSError, TypeError) as exc:
        raise ValueError(
            f"the source of remote function {fn.__name__!r} is not available from a file "
            f"({exc})" + _PICKLE_HINT
        ) from None
    text = textwrap.dedent(source)
    lines = text.splitlines()
    tree: ast.Module | None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        # dedent cannot strip a common indent (e.g. a multi-line string inside an
        # indented function): parse it nested in a block instead and unparse later.
        lines = []
        try:
            tree = ast.parse("if 1:\n" + source)
        except SyntaxError:
            tree = None
        if tree is not None:
            block = tree.body[0]
            assert isinstance(block, ast.If)
            tree = ast.Module(body=block.body, type_ignores=[])
    node = tree.body[0] if tree is not None and tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != fn.__name__:
        raise ValueError(
            f"the source of remote function {fn.__name__!r} could not be located in its file"
            + _PICKLE_HINT
        )
    return node, lines


def _check_decorators(fn: types.FunctionType, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    decorators = node.decorator_list
    # The one decorator allowed is the one making this remote function: `@x.function(...)`.
    if len(decorators) == 1 and _is_function_decorator(decorators[0]):
        return
    if decorators:
        # The message names the others only: it called `@client.function()` "other" too.
        others = [d for d in decorators if not _is_function_decorator(d)] or decorators
        shown = ", ".join("@" + ast.unparse(d) for d in others)
        raise ValueError(
            f"remote function {fn.__name__!r} has other decorators ({shown}); they would be "
            "lost remotely" + _PICKLE_HINT
        )


def _is_function_decorator(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr == "function"
    return isinstance(expr, ast.Name) and expr.id == "function"


def referenced_globals(code: types.CodeType) -> set[str]:
    """Global names read by ``code`` and the code nested in it (comprehensions, inner defs)."""
    loaded: set[str] = set()
    assigned: set[str] = set()
    stack = [code]
    while stack:
        current = stack.pop()
        class_loads: set[str] = set()
        class_stores: set[str] = set()
        for instruction in dis.get_instructions(current):
            op, arg = instruction.opname, instruction.argval
            if op in ("LOAD_GLOBAL", "DELETE_GLOBAL"):
                loaded.add(arg)
            elif op == "STORE_GLOBAL":
                assigned.add(arg)
            elif op == "LOAD_NAME":  # class bodies nested in the function
                class_loads.add(arg)
            elif op in ("STORE_NAME", "DELETE_NAME", "IMPORT_FROM"):
                class_stores.add(arg)
        loaded |= class_loads - class_stores - {"__name__"}
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    # A global the function assigns itself (`global x; import x`) exists remotely too.
    return loaded - assigned


def _check_globals(fn: types.FunctionType) -> None:
    outside: list[str] = []
    for name in sorted(referenced_globals(fn.__code__)):
        if name == fn.__name__:
            continue  # recursion: the uploaded module defines the name
        if name in fn.__globals__:
            value = fn.__globals__[name]
            builtin = getattr(builtins, name, _MISSING)
            # IPython puts a wrapped `open` into every notebook namespace; that is not a
            # user global, so a global that *is* (or wraps) the builtin stays allowed.
            if builtin is _MISSING or inspect.unwrap(value) is not builtin:
                outside.append(name)
        elif not hasattr(builtins, name):
            outside.append(name)
    if outside:
        raise ValueError(
            f"remote function {fn.__name__!r} refers to names defined outside it "
            f"({', '.join(outside)}); import modules inside the function body and pass "
            "values as arguments" + _PICKLE_HINT
        )


_MISSING = object()


def _module_text(
    fn: types.FunctionType, node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]
) -> str:
    is_async = isinstance(node, ast.AsyncFunctionDef)
    header = f"{'async def' if is_async else 'def'} {node.name}({_parameters(node.args)}):"
    start = _verbatim_body_start(node, lines)
    if start is not None:
        # Keep the body verbatim (comments, layout) so remote tracebacks read like it.
        body = "\n".join(lines[start - 1 : node.end_lineno])
    else:  # a one-line `def f(x): return x`, or source we had to re-nest
        stripped = copy.copy(node)
        stripped.decorator_list = []
        body = "\n".join(ast.unparse(stripped).splitlines()[1:])
    return (
        f"from __future__ import annotations\n\n{header}\n{body}\n\n\n{_dispatcher(fn, is_async)}"
    )


#: The uploaded module's line of the function's header; its body starts on the next one.
_HEADER_LINE = 3


def _verbatim_body_start(
    node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]
) -> int | None:
    """The source line where the body starts when it can be uploaded verbatim, else None."""
    first = node.body[0]
    decorators: list[ast.expr] = getattr(first, "decorator_list", [])
    start = min([first.lineno] + [d.lineno for d in decorators])
    body_indent = len(lines[start - 1]) - len(lines[start - 1].lstrip()) if lines else 0
    if lines and first.col_offset == body_indent and first.col_offset > 0:
        return start
    return None


def uploaded_line_map(fn: types.FunctionType) -> Callable[[int], int | None]:
    """For a JSON-mode function's uploaded module (``json_module_source``): the line of
    ``fn``'s own file that an uploaded line is, ``None`` for the generated dispatcher (not
    the user's code), or the uploaded line itself where the body was rewritten (source
    re-nested to parse) and no file line matches; a one-line ``def``'s body is its line.
    A remote traceback then points at the user's file."""
    node, lines = _parse_function(fn)
    heads = (f"def {dispatcher_name(fn)}(", f"async def {dispatcher_name(fn)}(")
    uploaded_lines = enumerate(_module_text(fn, node, lines).splitlines(), start=1)
    dispatcher = max(number for number, line in uploaded_lines if line.startswith(heads))
    start = _verbatim_body_start(node, lines)
    first = fn.__code__.co_firstlineno  # the source's first line (a decorator's, if any)
    one_line = start is None and bool(lines) and node.end_lineno == node.lineno

    def file_line(uploaded: int) -> int | None:
        if uploaded >= dispatcher:
            return None
        # the header of a re-nested source (``start is None``, not one line) has no file line
        header = uploaded == _HEADER_LINE and (start is not None or one_line)
        if header or (one_line and uploaded > _HEADER_LINE):
            return first + node.lineno - 1
        if start is not None and uploaded > _HEADER_LINE:
            return first + start - 1 + uploaded - _HEADER_LINE - 1
        return uploaded

    return file_line


def _parameters(arguments: ast.arguments) -> str:
    """The signature without annotations and defaults."""
    parts = [a.arg for a in arguments.posonlyargs]
    if parts:
        parts.append("/")
    parts.extend(a.arg for a in arguments.args)
    if arguments.vararg is not None:
        parts.append("*" + arguments.vararg.arg)
    elif arguments.kwonlyargs:
        parts.append("*")
    parts.extend(a.arg for a in arguments.kwonlyargs)
    if arguments.kwarg is not None:
        parts.append("**" + arguments.kwarg.arg)
    return ", ".join(parts)


def _dispatcher(fn: types.FunctionType, is_async: bool) -> str:
    name = fn.__name__
    # Parameter names must not hide the function itself; `builtins` is imported locally so
    # a user function called `zip` or `dict` cannot hide the builtins either.
    nargs, names, literals, values = (
        ("_kcoral_" + p for p in _DISPATCHER_PARAMETERS)
        if name in (*_DISPATCHER_PARAMETERS, "builtins")
        else _DISPATCHER_PARAMETERS
    )
    call = (
        f"{name}(*{values}[:{nargs}], **builtins.dict(builtins.zip({names}, {values}[{nargs}:])))"
    )
    return (
        f"{'async def' if is_async else 'def'} {dispatcher_name(fn)}"
        f"({nargs}, {names}, {literals}, *{values}):\n"
        "    import builtins\n\n"
        f"    {values} = [\n"
        f"        value['value'] if literal else value\n"
        f"        for literal, value in builtins.zip({literals}, {values})\n"
        "    ]\n"
        f"    return {'await ' if is_async else ''}{call}\n"
    )
