"""What a notebook shows for the values a program returns, in a real kernel (nbclient)
against a real CPU server, as the saved notebook keeps it:

* a returned image file too large to inline is named with its size and a ``.save`` hint,
  not put whole into the notebook (a 60 MiB PNG made an 84 MB cell output);
* a tensor's NaN and infinities are counted beside min/max/mean, which are said to be of
  the finite values (``[1, nan, 3, inf]`` read 'min 1 · max 3 · mean 2', the rest unsaid;
  all NaN read only its shape and dtype);
* a ``bytes`` value cut to its first bytes says so;
* the line plot of a long tensor draws its spikes, and its labels say the true least and
  greatest values (every n-th value alone drew a 'max 5' tensor flat, labelled 0);
* a line plot is an ``<img>``, which JupyterLab still shows in a notebook it did not run;
* HTML the server rendered carries its text inside its iframe, which JupyterLab shows for
  a notebook it did not run (its sanitizer drops the iframe: the output was blank);
* laid out by chromium, a results table stays inside its box (200 bytes drew it far past);
* an ``(h, w, 3)`` or ``(h, w, 1)`` tensor of uint8, or of floats in [0, 1], is drawn as the
  image it holds (it showed only as a column of numbers);
* a heatmap drawn from every n-th row and column says so (a 'max 5' tensor's one spike
  between them was silently left out of its picture).
"""

from __future__ import annotations

import base64
import html as markup
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from notebook_cells import connected_cells, executed
from png_reader import decode_png

pytestmark = pytest.mark.timeout(300)

#: The remote functions of the program cell, each returning one value under its name.
MODULE = """
import torch
def some_nan(): return torch.tensor([1.0, float('nan'), 3.0, float('inf')])
def only_nan(): return torch.tensor([float('nan'), float('inf'), -float('inf')])
def plain(): return torch.tensor([1.0, 2.0, 3.0])
def raw(): return bytes(range(200))
def picture():
    pixels = torch.zeros(4, 8, 3, dtype=torch.uint8)
    pixels[:, :4, 0] = 255  # the left half red
    pixels[:, 4:, 2] = 255  # the right half blue
    return pixels
def heat():
    values = torch.zeros(600, 600)
    values[301, 301] = 5.0  # between the rows a picture of every 3rd row draws
    return values
def grey():
    return torch.linspace(0, 1, 16).reshape(4, 4, 1)
def spike():
    values = torch.zeros(1_000_000)
    values[500_001] = 5.0  # between two of every 1954th value
    return values
"""

PROGRAM_CELL = f"""import kcoral
program = kcoral.Program()
module = program.upload(kind="module", source={MODULE!r})
for name in ("some_nan", "only_nan", "plain", "raw", "spike", "picture", "grey", "heat"):
    function = program.get_function(module=module, name=name)
    program.return_(key=name, value=program.run(fn=function))
kcoral.Client(URL).execute(program)"""

LARGE_PNG_CELL = """%%kcoral --return-file big.png
with open("big.png", "wb") as file:  # a PNG's signature, then 6 MiB
    file.write(b"\\x89PNG\\r\\n\\x1a\\n")
    file.truncate(6 << 20)"""

SMALL_PNG_CELL = """%%kcoral --return-file small.png
with open("small.png", "wb") as file:
    file.write(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(1000))"""

#: A value only the server can render (its class is the cell's own): its HTML comes back.
SERVER_HTML_CELL = """%%kcoral
class Table:
    def __repr__(self):
        return "Table(<b>2 rows</b>)"
    def _repr_html_(self):
        return "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>"
Table()"""


@pytest.fixture(scope="module")
def notebook(cpu_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    with pytest.MonkeyPatch.context() as monkeypatch:
        sources = connected_cells(
            cpu_server_url,
            monkeypatch,
            f"URL = {cpu_server_url!r}",
            LARGE_PNG_CELL,
            SMALL_PNG_CELL,
            PROGRAM_CELL,
            SERVER_HTML_CELL,
        )
        return executed(sources, tmp_path_factory.mktemp("returned-values"))


def html_of(cell: Any, marker: str) -> str:
    """The one ``text/html`` output of ``cell`` that holds ``marker``."""
    found = [
        output["data"]["text/html"]
        for output in cell.outputs
        if marker in output.get("data", {}).get("text/html", "")
    ]
    assert len(found) == 1, cell.outputs
    return found[0]


def test_a_large_returned_image_file_is_named_not_inlined(notebook) -> None:
    cell = notebook.cells[3]
    html = html_of(cell, "kcoral-file")
    assert "<b>big.png</b> · 6.0 MiB" in html
    assert "PNG image over 4.0 MiB, not shown; save it with" in html
    assert ".save(&#x27;big.png&#x27;)" in html
    assert "data:image" not in html
    assert len(json.dumps(cell.outputs)) < 20_000  # the saved cell, not 8 MB of base64


def test_a_small_returned_image_file_is_still_shown_inline(notebook) -> None:
    assert 'src="data:image/png;base64,' in html_of(notebook.cells[4], "kcoral-file")


def facts_of(notebook: Any, name: str) -> str:
    """What the program cell's result says of its tensor ``name``, after the name."""
    found = re.search(rf"<b>{name}</b> <span>([^<]*)</span>", row_of(notebook, name))
    assert found is not None, name
    return found.group(1)


def row_of(notebook: Any, name: str) -> str:
    """The program cell's results table row of ``name``."""
    html = html_of(notebook.cells[5], "kcoral-results")
    row = html[html.index(f"<b>{name}</b>") :]
    return row[: row.index("</tr>")]


def test_a_tensor_with_nan_and_inf_counts_them_beside_its_finite_statistics(notebook) -> None:
    assert facts_of(notebook, "some_nan") == (
        "shape (4,) · dtype float32 · 1 NaN · 1 +inf · min 1 · max 3 · mean 2 of the finite values"
    )
    assert facts_of(notebook, "plain") == "shape (3,) · dtype float32 · min 1 · max 3 · mean 2"


def test_a_tensor_without_a_finite_value_says_so(notebook) -> None:
    assert facts_of(notebook, "only_nan") == (
        "shape (3,) · dtype float32 · 1 NaN · 1 +inf · 1 -inf · no finite values"
    )


def test_a_long_bytes_value_says_only_its_start_is_shown(notebook) -> None:
    html = html_of(notebook.cells[5], "kcoral-results")
    assert "<code>200 bytes</code> b&#x27;\\x00\\x01" in html
    assert "?&#x27; … (the first 64 shown)" in html


def test_the_line_plot_of_a_long_tensor_keeps_its_spike(notebook) -> None:
    assert (
        facts_of(notebook, "spike")
        == "shape (1000000,) · dtype float32 · min 0 · max 5 · mean 5e-06"
    )
    labels = re.findall(r"<text [^>]*>([^<]*)</text>", plot_in(row_of(notebook, "spike")))
    assert labels == ["5", "0"]


def plot_in(row: str) -> str:
    """The SVG of the one line plot in ``row``, an ``<img>`` data URI."""
    assert "<svg" not in row
    (encoded,) = re.findall(
        r'<img class="kcoral-plot" src="data:image/svg\+xml;base64,([^"]+)"', row
    )
    return base64.b64decode(encoded).decode()


def test_a_line_plot_is_an_image_that_a_notebook_reopened_elsewhere_still_shows(
    notebook,
) -> None:
    # JupyterLab shows outputs it did not produce (a notebook reopened elsewhere) through a
    # sanitizer that drops inline <svg> and kept its labels as stray text ('448-1');
    # an <img> with a data URI passes it
    row = row_of(notebook, "plain")
    svg = plot_in(row)
    assert svg.startswith("<svg") and "<polyline" in svg
    assert 'alt="line plot of plain"' in row


def test_html_the_server_rendered_carries_its_text_for_a_notebook_reopened_elsewhere(
    notebook,
) -> None:
    html = html_of(notebook.cells[6], "kcoral-server-html")
    frame, _, after = html.partition("><pre>")
    assert frame.startswith('<iframe class="kcoral-server-html" sandbox="" srcdoc="')
    inside, _, note = after.partition("</iframe>")
    assert inside == "Table(&lt;b&gt;2 rows&lt;/b&gt;)</pre>"
    assert note.startswith('<div class="kcoral-note"')  # the value did not come back


#: Added to the exported page: once it is laid out, each KCoral box with something drawn past
#: its right edge, as JSON in an element that chromium's --dump-dom prints.
MEASURE = """<script>
window.addEventListener('load', () => {
  const over = [...document.querySelectorAll('.kcoral-result, .kcoral-file, .kcoral-folder')]
    .map(box => {
      const right = box.getBoundingClientRect().right;
      const past = [...box.querySelectorAll('*')]
        .filter(n => n.getBoundingClientRect().right > right + 0.5);
      const first = past.length ? `${past[0].tagName} ${past[0].textContent.slice(0, 60)}` : '';
      return first && `${box.className}: ${first}`;
    })
    .filter(Boolean);
  const report = document.createElement('pre');
  report.id = 'kcoral-overflow';
  report.textContent = JSON.stringify(over);
  document.body.appendChild(report);
});
</script>"""


def test_a_results_table_stays_inside_its_box_in_chromium(notebook, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("needs chromium (apt-get install -y chromium) to lay the page out")
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter(template_name="lab").from_notebook_node(notebook)
    path = tmp_path / "values.html"
    path.write_text(page.replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,900",
         "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    found = re.search(r'<pre id="kcoral-overflow">([^<]*)</pre>', dom)
    assert found is not None, dom[-2000:]
    assert json.loads(markup.unescape(found.group(1))) == []


def image_in(row: str) -> np.ndarray:
    """The pixels of the one image tensor's picture in ``row``."""
    (encoded,) = re.findall(r'<img class="kcoral-image" src="data:image/png;base64,([^"]+)"', row)
    return decode_png(base64.b64decode(encoded))


def test_an_image_tensor_is_drawn_as_its_image(notebook) -> None:
    row = row_of(notebook, "picture")
    assert facts_of(notebook, "picture").startswith("shape (4, 8, 3) · dtype uint8")
    assert 'alt="image of picture"' in row
    pixels = image_in(row)
    assert pixels.shape == (48, 96, 3)  # 4x8, each pixel 12x12
    assert (pixels[:, :48] == (255, 0, 0)).all() and (pixels[:, 48:] == (0, 0, 255)).all()


def test_a_one_channel_float_image_is_drawn_in_grey(notebook) -> None:
    pixels = image_in(row_of(notebook, "grey"))
    assert pixels.shape == (96, 96, 3)
    corners = [tuple(pixels[y, x]) for y, x in ((0, 0), (-1, -1))]
    assert corners == [(0, 0, 0), (255, 255, 255)]


def test_a_heatmap_of_a_large_matrix_says_it_is_drawn_from_every_nth_row(notebook) -> None:
    row = row_of(notebook, "heat")
    assert facts_of(notebook, "heat").endswith("min 0 · max 5 · mean 1.38889e-05")
    assert '<img class="kcoral-heatmap"' in row
    assert '<div style="color:#57606a">drawn from every 3rd row and column</div>' in row
    assert "drawn from" not in row_of(notebook, "picture")  # 4x8: every pixel is drawn
