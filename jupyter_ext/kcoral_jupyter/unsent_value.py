"""What a ``%%kcoral`` cell says under a final value that did not come back.

A final value the protocol does not carry (an instance of the cell's own class, a generator,
an open file, a function, a pandas DataFrame, a complex tensor, a dict with an int key, or a
dict or list holding one of them) comes back only as the server's text of it (and its HTML,
in a sandbox). Alone, that text read as if the value had come back; the note under it says
that it did not, why (the type, and where in a dict or list), and what to do instead.

Who can reach what (a malicious server): the note is built only from the record's
``unsent`` fields that pass strict checks (identifiers, a plain dtype name, keys and indexes
shown by ``repr``); anything else gives the same note without the details, never the
server's words. The caller shows it as text, and escaped in HTML.
"""

from __future__ import annotations

import re
from typing import Any

from kcoral.run.terminal_filter import screened
from kcoral_jupyter.display import escape

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_DTYPE = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: The longest path ("['a'][0]") the note shows whole; a longer one is cut with "…".
_PATH_CHARS = 80

_CARRIED = "numbers, strings, bytes, tensors, and lists and dicts of them"
#: Built-in types that list(...) brings back whole.
_ITERABLES = frozenset(
    (
        "generator",
        "map",
        "filter",
        "zip",
        "range",
        "enumerate",
        "reversed",
        "set",
        "frozenset",
        "dict_keys",
        "dict_values",
        "dict_items",
    )
)
#: Built-in callables, by the word the note says for them.
_FUNCTIONS = {
    "function": "function",
    "builtin_function_or_method": "function",
    "method": "method",
    "type": "class",
}
_FILES = frozenset(
    ("TextIOWrapper", "BufferedReader", "BufferedWriter", "BufferedRandom", "FileIO")
)
#: How to send back a tensor of a dtype the protocol does not carry, by library.
_TENSOR_HINTS = {
    ("torch", True): "return torch.view_as_real(t) and torch.view_as_complex it here",
    ("numpy", True): "return numpy.stack([a.real, a.imag], -1) and rebuild it here",
    ("torch", False): "return it as one that is, e.g. t.to(torch.float32)",
    ("numpy", False): "return it as one that is, e.g. a.astype(numpy.float32)",
}


#: The note's style under the sandboxed iframe of the server's HTML.
_NOTE_STYLE = "font-size:12px;margin:2px 0;max-width:900px"


def add_unsent_note(shown: dict[str, str], unsent: Any, *, pickled: bool, in_session: bool) -> None:
    """Put the note under a final value the server could only show (``shown``, made safe by
    ``server_display``): in its text, and after its iframe, escaped, where it has HTML
    (JupyterLab shows only the HTML of a bundle that has some)."""
    for kind, shown_as in (("text/plain", "text"), ("text/html", "rendering")):
        if kind not in shown:
            continue
        note = screened(
            unsent_note(unsent, pickled=pickled, in_session=in_session, shown_as=shown_as)
        )
        if kind == "text/plain":
            shown[kind] += "\n" + note
        else:
            shown[kind] += f'<div class="kcoral-note" style="{_NOTE_STYLE}">{escape(note)}</div>'


def unsent_note(unsent: Any, *, pickled: bool, in_session: bool, shown_as: str = "text") -> str:
    """The line under a final value that came back only as the server's ``shown_as`` (text,
    rendering): that the value did not come back, why and what to do. ``unsent`` is the
    record's untrusted ``unsent`` field; ``pickled``: the cell was sent with pickle, so ``-o``
    brings back what pickles; ``in_session``: the cell ran in a session."""
    subject, why, hint, keep = _reason(unsent if isinstance(unsent, dict) else {})
    where = _where(unsent.get("path") if isinstance(unsent, dict) else None)
    hints = [hint]
    if keep:
        if pickled and "generator" not in subject:  # a generator does not pickle
            hints.append("bring it back pickled with -o NAME (this cell was sent with pickle)")
        hints.append(
            "name it: this session keeps it for its next cell"
            if in_session
            else "keep it remote: a session (%kcoral session start) keeps the cell's names"
        )
    return (
        f"The value did not come back: {subject}{where} {why} (above is the server's "
        f"{shown_as} of it); {', or '.join(hints)}."
    )


def _reason(unsent: dict[str, Any]) -> tuple[str, str, str, bool]:
    """(what, why it is not carried, what to return instead, whether keeping it remote,
    or pickling it, is worth saying) from the record's checked fields."""
    library, name = unsent.get("library"), unsent.get("type")
    key, dtype = unsent.get("key"), unsent.get("dtype")
    carried = f"return what the protocol carries ({_CARRIED})"
    if isinstance(key, str) and _NAME.fullmatch(key):
        return (
            f"a dict with {_article(key)} key",
            "is not a value the protocol carries, whose keys are strings",
            "make the keys strings, or return a list of (key, value) pairs",
            False,
        )
    if not (isinstance(library, str) and _NAME.fullmatch(library)):
        return "a value", "is not of a type the protocol carries", carried, True
    if not (isinstance(name, str) and _NAME.fullmatch(name)):
        return "a value", "is not of a type the protocol carries", carried, True
    if name == "tensor" and library in ("torch", "numpy"):
        if isinstance(dtype, str) and _DTYPE.fullmatch(dtype):
            hint = _TENSOR_HINTS[(library, dtype.startswith("complex"))]
            return f"a {library} {dtype} tensor", "is not a type the protocol carries", hint, False
        return f"a {library} tensor", "has a dtype the protocol does not carry", carried, False
    if library == "builtins":
        if name == "float":
            return (
                "a float NaN or infinity",
                "is not a value the protocol carries",
                "return it in a tensor or as a string",
                False,
            )
        if name == "complex":
            return (
                "a complex",
                "is not a type the protocol carries",
                "return [z.real, z.imag]",
                False,
            )
        if name in _ITERABLES:
            hint = "return list(...) of it"
            return _article(name), "is not a type the protocol carries", hint, name == "generator"
        if name in _FUNCTIONS:
            hint = "call it there and return its result"
            return _article(_FUNCTIONS[name]), "is not a type the protocol carries", hint, True
    if library in ("_io", "io") and name in _FILES:
        hint = "return its contents (f.read()), or the file itself with --return-file PATH"
        return f"an open file ({name})", "is not a type the protocol carries", hint, False
    what = (
        name
        if library in ("__main__", "builtins") or library.startswith("_")
        else (f"{library} {name}")
    )
    return _article(what), "is not a type the protocol carries", carried, True


def _article(what: str) -> str:
    """``what`` after "a" or "an"."""
    return f"{'an' if what[:1] in 'aeioAEIO' else 'a'} {what}"


def _where(path: Any) -> str:
    """`` at ['grads'][1]`` for a checked path inside the value; nothing for the value
    itself or a path that is not a list of keys and indexes."""
    if not isinstance(path, list) or not path:
        return ""
    if not all(type(step) in (str, int) for step in path):
        return ""
    shown = "".join(f"[{step!r}]" for step in path)
    if len(shown) > _PATH_CHARS:
        shown = shown[: _PATH_CHARS - 1] + "…"
    return f" at {shown}"
