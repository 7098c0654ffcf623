"""A ``%%kcoral`` cell's final value that the protocol does not carry, in a real kernel
(nbclient) against a real CPU server that asks for a token, as the README starts one: the
server's text of it (and its HTML, in a sandbox) comes with a line saying that the value did
not come back, why (its type, and where in a dict) and what to do. Only a complex tensor said
so (1a52678); an instance of the cell's own class, a generator, an open file, a lambda or a
dict holding a generator among tensors showed the server's text alone, as if ``_`` held it.
"""

from __future__ import annotations

import html
from typing import Any

import pytest
from notebook_cells import executed_on_a_token_server, shown

pytest.importorskip("torch", reason="the dict of tensors is made of torch tensors")
pytestmark = pytest.mark.timeout(300)

NOTE = "The value did not come back: "
SEEN = " (above is the server's text of it); "
CARRIED = (
    "return what the protocol carries (numbers, strings, bytes, tensors, and lists and dicts "
    "of them)"
)
SESSION = "keep it remote: a session (%kcoral session start) keeps the cell's names."

#: A dict with HTML of its own (so the note follows an iframe) holding, under a key of markup,
#: an instance of a type named with markup.
HOSTILE_HTML_CELL = """%%kcoral
class Shown(dict):
    def _repr_html_(self):
        return "<b>x</b>"
Shown({"<img src=x onerror=alert(1)>": type("<script>alert(1)</script>", (), {})()})"""

CELLS = {
    "own class": "%%kcoral\nclass Net:\n    pass\nNet()",
    "generator": "%%kcoral\n(i for i in range(3))",
    "open file": '%%kcoral\nopen("notes.txt", "w")',
    "lambda": "%%kcoral\nlambda x: x + 1",
    "dict": '%%kcoral\nimport torch\n{"loss": torch.ones(2), "gen": (i for i in range(3))}',
    "html": """%%kcoral
class Table:
    def __repr__(self):
        return "Table(2 rows)"
    def _repr_html_(self):
        return "<table><tr><td>1</td></tr></table>"
Table()""",
    "pickled lambda": "%%kcoral -i s\nlambda x: x + 1",  # s, a set, is sent pickled
    "its hint": "%%kcoral -i s -o f\nf = lambda x: x + len(s)",
    "used": "f(1)",
    "pandas": "%%kcoral\nimport pandas\npandas.DataFrame({'a': [1, 2]})",
    "int key": "%%kcoral\n{'runs': {1: 'a'}}",
    "nan": "%%kcoral\nfloat('nan')",
    "carried": "%%kcoral\n{'n': 3, 'name': 'x'}",
    "session": "%kcoral session start",
    "in a session": "%%kcoral\n(i for i in range(3))",
    "session end": "%kcoral session stop",
    # what a malicious server (or cell) can make the record say: markup and a terminal's
    # clipboard escape in a key, a type named with markup
    "hostile key": '%%kcoral\n{"<img src=x onerror=alert(1)>\\x1b]52;c;eA==\\x07": print}',
    "hostile type": HOSTILE_HTML_CELL,
}


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ran = executed_on_a_token_server(["s = {1, 2}", *CELLS.values()], tmp_path_factory)
    return dict(zip(CELLS, ran.cells[3:], strict=True))


def test_an_instance_of_the_cells_own_class_says_it_did_not_come_back(notebook) -> None:
    text = shown(notebook["own class"])
    assert "\n<__main__.Net object at 0x" in text, text
    assert text.endswith(
        f"\n{NOTE}a Net is not a type the protocol carries{SEEN}{CARRIED}, or {SESSION}"
    ), text


def test_a_generator_says_to_return_a_list_of_it(notebook) -> None:
    assert shown(notebook["generator"]).endswith(
        f"\n{NOTE}a generator is not a type the protocol carries{SEEN}"
        f"return list(...) of it, or {SESSION}"
    )


def test_an_open_file_says_to_return_its_contents_or_the_file(notebook) -> None:
    text = shown(notebook["open file"])
    assert "\n<_io.TextIOWrapper name='notes.txt' mode='w'" in text, text
    assert text.endswith(
        f"\n{NOTE}an open file (TextIOWrapper) is not a type the protocol carries{SEEN}"
        "return its contents (f.read()), or the file itself with --return-file PATH."
    ), text


def test_a_lambda_says_functions_do_not_come_back(notebook) -> None:
    assert shown(notebook["lambda"]).endswith(
        f"\n{NOTE}a function is not a type the protocol carries{SEEN}"
        f"call it there and return its result, or {SESSION}"
    )


def test_a_dict_of_tensors_holding_a_generator_says_where(notebook) -> None:
    text = shown(notebook["dict"])
    assert "\n{'loss': tensor([1., 1.]), 'gen': <generator object" in text, text
    assert text.endswith(
        f"\n{NOTE}a generator at ['gen'] is not a type the protocol carries{SEEN}"
        f"return list(...) of it, or {SESSION}"
    ), text


def test_html_the_server_rendered_stays_as_it_was_and_the_note_follows_it(notebook) -> None:
    (bundle,) = [
        o["data"]
        for o in notebook["html"].outputs
        if "kcoral-server-html" in o.get("data", {}).get("text/html", "")
    ]
    frame, _, after = bundle["text/html"].partition("</iframe>")
    assert "&lt;table&gt;&lt;tr&gt;&lt;td&gt;1&lt;/td&gt;" in frame  # the server's, sandboxed
    note = (
        f"{NOTE}a Table is not a type the protocol carries (above is the server's rendering "
        f"of it); {CARRIED}, or {SESSION}"
    )
    assert after.startswith('<div class="kcoral-note" style="'), after
    assert after.endswith(f'">{html.escape(note)}</div>'), after
    assert bundle["text/plain"].startswith("Table(2 rows)\n" + NOTE)


def test_a_cell_sent_with_pickle_says_o_brings_it_back_and_it_does(notebook) -> None:
    assert shown(notebook["pickled lambda"]).endswith(
        f"{SEEN}call it there and return its result, or bring it back pickled with -o NAME "
        f"(this cell was sent with pickle), or {SESSION}"
    )
    assert shown(notebook["used"]) == "3"


def test_a_pandas_dataframe_says_it_did_not_come_back(notebook) -> None:
    pytest.importorskip("pandas", reason="pandas is not installed where the worker runs")
    assert shown(notebook["pandas"]).endswith(
        f"\n{NOTE}a pandas DataFrame is not a type the protocol carries{SEEN}{CARRIED}, "
        f"or {SESSION}"
    )


def test_markup_and_escapes_in_a_key_are_shown_as_text(notebook) -> None:
    text = shown(notebook["hostile key"])
    assert "\x1b" not in text and "\x07" not in text, text
    assert text.endswith(
        f"\n{NOTE}a function at ['<img src=x onerror=alert(1)>\\x1b]52;c;eA==\\x07'] "
        f"is not a type the protocol carries{SEEN}call it there and return its result, or {SESSION}"
    ), text


def test_a_type_named_with_markup_is_not_named_and_its_note_is_not_html(notebook) -> None:
    (bundle,) = [
        o["data"]
        for o in notebook["hostile type"].outputs
        if "kcoral-server-html" in o.get("data", {}).get("text/html", "")
    ]
    after = bundle["text/html"].partition("</iframe>")[2]
    assert "<script" not in after and "<img" not in after and "<b>" not in after, after
    assert after.endswith(
        f"{NOTE}a value at [&#x27;&lt;img src=x onerror=alert(1)&gt;&#x27;] is not of a type "
        "the protocol carries (above is the server&#x27;s "
        f"rendering of it); {html.escape(CARRIED)}, or {html.escape(SESSION)}</div>"
    ), after


def test_a_dict_with_an_int_key_says_where_and_to_make_the_keys_strings(notebook) -> None:
    assert shown(notebook["int key"]).endswith(
        f"\n{NOTE}a dict with an int key at ['runs'] is not a value the protocol carries, "
        f"whose keys are strings{SEEN}make the keys strings, or return a list of (key, value) "
        "pairs."
    )


def test_a_nan_says_to_return_it_in_a_tensor(notebook) -> None:
    assert shown(notebook["nan"]).endswith(
        f"\nnan\n{NOTE}a float NaN or infinity is not a value the protocol carries{SEEN}"
        "return it in a tensor or as a string."
    )


def test_a_value_that_comes_back_has_no_note(notebook) -> None:
    text = shown(notebook["carried"])
    assert text.endswith("\n{'n': 3, 'name': 'x'}"), text
    assert NOTE not in text


def test_in_a_session_it_says_the_session_keeps_a_name(notebook) -> None:
    assert shown(notebook["in a session"]).endswith(
        f"{SEEN}return list(...) of it, or name it: this session keeps it for its next cell."
    )
