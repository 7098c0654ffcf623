"""HTML for ``ProgramResult``, ``ReturnedFile``, ``ReturnedFolder``, ``Job`` and tensors, and
the magics' own screens (a cell's status line, ``%kcoral status``/``jobs`` tables, a
submitted job): all HTML of the package is written here.

Self-contained markup with inline styles (no scripts, no widgets), so it renders the same in
JupyterLab, a saved notebook, nbconvert's HTML and a plain browser. Everything user-supplied
is escaped; images are data URIs inside ``<img>`` (an SVG there cannot run scripts).

Who can reach what (a malicious server): every string a server sends (names, messages,
dtypes, paths, stdout/stderr, tracebacks) is escaped into our own markup. HTML the server
*authored* (a remote DataFrame's ``_repr_html_``) is shown only by ``server_display``: inside
an ``<iframe sandbox="">`` (no script, an opaque origin, no forms, no navigation of the
notebook) whose document forbids network loads, never as raw HTML or JavaScript. Plain text
a terminal IPython prints is ``screened`` (no clipboard write or status query gets through).

The client classes reach this module lazily from their ``_repr_html_`` (``kcoral.notebook``);
no function here is registered with IPython's HTML formatter.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kcoral import Job, KCoralError, ProtocolError, ReturnedFile, ReturnedFolder, TransportError
from kcoral.protocol.strict_json import finite_float
from kcoral.results import plural
from kcoral.run.terminal_filter import screened
from kcoral_jupyter.images import tensor_picture
from kcoral_jupyter.tensor_stats import stats_facts, tensor_stats

PREVIEW_CHARS = 2000
#: A returned image file larger than this is not put inside the notebook: its base64 is 4/3
#: of the file in the saved notebook and in every HTML export, and a browser stalls on a
#: data URI of tens of MB (a 60 MiB PNG made an 84 MB notebook output).
MAX_INLINE_IMAGE_BYTES = 4 << 20
#: The bytes of a returned ``bytes`` value shown after its size.
BYTES_PREVIEW = 64
PREVIEW_LINES = 40
MAX_TABLE_ROWS = 100
MAX_TREE_ENTRIES = 200

_STATUS_COLOURS = {
    "COMPLETED": "#1a7f37",
    "FAILED": "#cf222e",
    "CANCELLED": "#6e7781",
    "TIMED_OUT": "#bc4c00",
    "ERROR": "#cf222e",
    "RUNNING": "#0969da",
    "QUEUED": "#8250df",
}
_BOX = (  # a long unbroken value (bytes, a path) wraps: it drew a results table past the box
    "font-family:var(--jp-code-font-family,monospace);font-size:12px;overflow-wrap:anywhere;"
    "border:1px solid #d0d7de;border-radius:6px;padding:8px;margin:4px 0;max-width:900px"
)
_PRE = (
    "margin:2px 0;padding:6px;background:#f6f8fa;border-radius:4px;max-height:320px;"
    "overflow:auto;white-space:pre-wrap"
)


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def status_badge(status: str) -> str:
    colour = _STATUS_COLOURS.get(status, "#57606a")
    return (
        f'<span class="kcoral-status" style="background:{colour};color:white;'
        f'border-radius:10px;padding:1px 8px;font-weight:600">{escape(status)}</span>'
    )


def format_ms(value: object) -> str:
    """A duration in milliseconds as the KCoral panel writes one (``formatDuration`` in
    labextension/src/format.ts): ``12 ms``, ``5.3 s``, ``2 min 5 s``; ``–`` for what is not
    a finite number (a server's integer too large for a float included). A cell said
    ``total 5346 ms`` where the panel said ``5.3 s`` for the same job."""
    value = finite_float(value)
    if value is None:
        return "–"
    if value < 1000:
        return f"{math.floor(value + 0.5)} ms"  # JavaScript's Math.round: halves go up
    if value < 60000:
        return f"{value / 1000:.1f} s"
    minutes, seconds = divmod(math.floor(value / 1000 + 0.5), 60)
    return f"{minutes} min {seconds} s"


def timing_bar(
    queue_ms: float,
    lease_wait_ms: float,
    lease_held_ms: float,
    elapsed_ms: float,
    *,
    leased: bool = True,
) -> str:
    """A stacked bar: queue, lease wait, lease held, and the rest of ``elapsed_ms``; without
    ``leased`` (a program that held no GPU) the lease pieces are left out, not shown as 0."""
    rest = max(0.0, elapsed_ms - lease_wait_ms - lease_held_ms)
    pieces = [("queue", queue_ms, "#8c959f")]
    if leased:
        pieces += [
            ("lease wait", lease_wait_ms, "#bf8700"),
            ("lease held", lease_held_ms, "#1a7f37"),
        ]
    pieces.append(("rest", rest, "#0969da"))
    total = sum(max(0.0, value) for _, value, _ in pieces)
    segments = []
    for name, value, colour in pieces:
        if total > 0 and value > 0:
            share = 100.0 * value / total
            segments.append(
                f'<div title="{escape(name)} {escape(format_ms(value))}" '
                f'style="width:{share:.2f}%;background:{colour};min-width:1px"></div>'
            )
    legend = " · ".join(
        f'<span style="color:{colour}">■</span> {escape(name)} {escape(format_ms(value))}'
        for name, value, colour in pieces
    )
    return (
        '<div class="kcoral-timing">'
        '<div style="display:flex;height:8px;border-radius:3px;overflow:hidden;'
        f'background:#eaeef2;margin:4px 0">{"".join(segments)}</div>'
        f'<div style="color:#57606a">{legend} · total {escape(format_ms(total))}</div></div>'
    )


# ------------------------------------------------------------- server-authored displays

#: The iframe document may load nothing from the network (no beacons, no requests to other
#: loopback services); inline styles and data: images still render.
FRAME_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src data:"
MIN_FRAME_HEIGHT = 60
MAX_FRAME_HEIGHT = 480


def sandboxed_html(markup: str, fallback: str) -> str:
    """``markup`` as the escaped ``srcdoc`` of an iframe that runs no script; ``fallback``
    text inside it is what JupyterLab shows of a notebook it did not run (its sanitizer drops
    the iframe, keeping that text: the output was blank); a browser never shows it. ``sandbox=""``
    grants nothing: no scripts, an opaque origin (no access to the notebook, its cookies or
    its kernel), no forms, popups or top-level navigation."""
    document = f'<meta http-equiv="Content-Security-Policy" content="{FRAME_POLICY}">{markup}'
    lower = markup.lower()
    rows = lower.count("<tr") or lower.count("<br") + markup.count("\n") + 1
    height = min(MAX_FRAME_HEIGHT, max(MIN_FRAME_HEIGHT, 32 + 26 * rows))
    return (
        f'<iframe class="kcoral-server-html" sandbox="" srcdoc="{escape(document)}" '
        'referrerpolicy="no-referrer" title="HTML from the KCoral server (sandboxed)" '
        f'style="width:100%;max-width:900px;height:{height}px;border:1px solid #d0d7de;'
        f'border-radius:6px"><pre>{escape(fallback)}</pre></iframe>'
    )


def server_display(bundle: Mapping[str, object]) -> dict[str, str]:
    """A display bundle the server authored, made safe to show in the notebook.

    ``text/plain`` stays text, ``text/html`` becomes a ``sandboxed_html`` iframe. Every other
    MIME type (and any value that is not a string) is dropped: JavaScript would run as is,
    and SVG, Markdown (raw HTML passes through), LaTeX and widget views all have front ends
    that execute or inline markup. Our own wrapper never sends them.
    """
    shown: dict[str, str] = {}
    plain = bundle.get("text/plain")
    shown["text/plain"] = screened(plain) if isinstance(plain, str) else "<display from the server>"
    markup = bundle.get("text/html")
    if isinstance(markup, str):
        shown["text/html"] = sandboxed_html(markup, shown["text/plain"])
    return shown


# ---------------------------------------------------------------------------- tensors


def _as_numpy(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray):
        return value
    module = type(value).__module__.split(".")[0]
    if module == "torch" and hasattr(value, "detach"):
        try:
            tensor = value.detach().cpu()
            if str(tensor.dtype) in ("torch.bfloat16",) or "float8" in str(tensor.dtype):
                tensor = tensor.float()
            return tensor.numpy()
        except Exception:
            return None
    return None


def tensor_html(value: Any, name: str | None = None) -> str:
    """Shape/dtype/min/max/mean, a preview, and a picture for 1-D and 2-D tensors."""
    array = _as_numpy(value)
    if array is None:
        return f"<pre>{escape(repr(value))}</pre>"
    stats = tensor_stats(array)
    facts = [escape(fact) for fact in stats_facts(stats)]
    with np.printoptions(threshold=50, edgeitems=3, precision=4, linewidth=100):
        preview = np.array2string(np.asarray(array, dtype=_printable(array)))
    picture = ""
    try:  # <img> data URIs: JupyterLab's sanitizer of a notebook it did not run drops <svg>
        drawn = tensor_picture(array, stats["min"], stats["max"]) if "min" in stats else None
    except (TypeError, ValueError):
        drawn = None
    if drawn is not None:
        encoded = base64.b64encode(drawn.data).decode()
        picture = (
            f'<img class="{drawn.css_class}" src="data:{drawn.mime};base64,{encoded}" '
            f'style="{drawn.style}" alt="{drawn.kind} of {escape(name or "tensor")}"/>'
        ) + (f'<div style="color:#57606a">{escape(drawn.note)}</div>' if drawn.note else "")
    title = f"<b>{escape(name)}</b> " if name else ""
    return (
        f'<div class="kcoral-tensor">{title}<span>{" · ".join(facts)}</span>'
        f'<pre style="{_PRE}">{escape(preview)}</pre>{picture}</div>'
    )


def _printable(array: np.ndarray) -> Any:
    # ml_dtypes arrays print fine but slowly; print them as float32.
    return np.float32 if array.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else None


# ----------------------------------------------------------------------- files, folders


#: What ``returned_file_html`` calls each type ``sniff_image`` finds.
_IMAGE_NAMES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/svg+xml": "SVG"}


def sniff_image(data: bytes) -> str | None:
    """The image MIME type of ``data`` (PNG, JPEG, SVG) or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    head = data[:512].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "image/svg+xml"
    return None


def text_preview(data: bytes) -> str | None:
    """The start of ``data`` if it is UTF-8 text (no NUL bytes), else None."""
    sample = data[: PREVIEW_CHARS * 4]
    if b"\x00" in sample:
        return None
    try:
        text = sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(sample) - 4:  # a cut multi-byte character at the end is fine
            return None
        text = sample[: exc.start].decode("utf-8")
    lines = text[:PREVIEW_CHARS].splitlines()[:PREVIEW_LINES]
    return "\n".join(lines)


def format_size(size: int) -> str:
    power = 0 if size < 1024 else min(3, (size.bit_length() - 1) // 10)  # 1024**power
    unit = ("bytes", "KiB", "MiB", "GiB")[power]
    return plural(size, "byte") if power == 0 else f"{size / 1024**power:.1f} {unit}"


def returned_file_html(returned: Any, name: str | None = None) -> str:
    """An image inline, a text preview, or the size and how to save it."""
    data: bytes = returned.read_bytes()
    label = escape(name) if name else "file"
    header = f"<b>{label}</b> · {escape(format_size(len(data)))}"
    kind = sniff_image(data)
    if kind is not None and len(data) > MAX_INLINE_IMAGE_BYTES:
        limit = format_size(MAX_INLINE_IMAGE_BYTES)
        body = _save_hint(f"{_IMAGE_NAMES[kind]} image over {limit}, not shown", name)
    elif kind is not None:
        encoded = base64.b64encode(data).decode("ascii")
        body = (
            f'<img class="kcoral-image" src="data:{kind};base64,{encoded}" '
            f'style="max-width:480px;display:block" alt="{label}"/>'
        )
    else:
        preview = text_preview(data)
        if preview is not None:
            # Whole unless text was left out (a last newline or \r\n ends are no text).
            text = data.decode("utf-8", "replace") if len(data) <= PREVIEW_CHARS * 4 else ""
            more = "" if "\n".join(text.splitlines()) == preview else " (preview)"
            body = f'<pre style="{_PRE}">{escape(preview)}</pre>{escape(more)}'
        else:
            body = _save_hint("binary file", name)
    return f'<div class="kcoral-file" style="{_BOX}">{header}{body}</div>'


def _save_hint(what: str, name: str | None) -> str:
    """``what`` the file is, and the ``.save`` call that writes it where the kernel runs."""
    target = escape(repr(name.rsplit("/", 1)[-1])) if name else "'output.bin'"
    return (
        f'<div style="color:#57606a">{escape(what)}; save it with '
        f"<code>.save({target})</code></div>"
    )


def returned_folder_html(folder: Any, name: str | None = None) -> str:
    """The folder as a tree of directories and files with sizes."""
    files: Mapping[str, Any] = folder.files
    entries = sorted([(path, None) for path in folder.directories] + list(files.items()))
    lines = []
    for path, item in entries[:MAX_TREE_ENTRIES]:
        depth = path.count("/")
        leaf = path.rsplit("/", 1)[-1]
        if item is None:
            lines.append(f"{'  ' * depth}{escape(leaf)}/")
        else:
            size = format_size(len(item.read_bytes()))
            lines.append(f"{'  ' * depth}{escape(leaf)}  <span style='color:#57606a'>{size}</span>")
    if len(entries) > MAX_TREE_ENTRIES:
        lines.append(f"… {len(entries) - MAX_TREE_ENTRIES} more entries")
    total = sum(len(item.read_bytes()) for item in files.values())
    header = (
        f"<b>{escape(name) if name else 'folder'}/</b> · {plural(len(files), 'file')} · "
        f"{plural(len(folder.directories), 'directory', 'directories')} · "
        f"{escape(format_size(total))}"
    )
    tree = "\n".join(lines) if lines else "(empty)"
    return (
        f'<div class="kcoral-folder" style="{_BOX}">{header}<pre style="{_PRE}">{tree}</pre></div>'
    )


# ------------------------------------------------------------------------- values


def value_html(value: Any, name: str | None = None) -> str:
    """Any decoded result value."""
    if isinstance(value, ReturnedFile):
        return returned_file_html(value, name)
    if isinstance(value, ReturnedFolder):
        return returned_folder_html(value, name)
    if _as_numpy(value) is not None:
        return tensor_html(value, name)
    if isinstance(value, bytes):
        cut = f" … (the first {BYTES_PREVIEW} shown)" if len(value) > BYTES_PREVIEW else ""
        shown = escape(value[:BYTES_PREVIEW])
        return f"<code>{escape(format_size(len(value)))}</code> {shown}{escape(cut)}"
    text = repr(value)
    if len(text) > PREVIEW_CHARS:
        text = text[:PREVIEW_CHARS] + " …"
    return f"<code>{escape(text)}</code>"


_WHOLE = "white-space:nowrap"  # a name and a type read whole, not 'nda rra y'


def results_table(results: Mapping[str, Any]) -> str:
    rows = []
    for index, (key, value) in enumerate(results.items()):
        if index >= MAX_TABLE_ROWS:
            rows.append(f"<tr><td colspan=3>… {len(results) - index} more</td></tr>")
            break
        rows.append(
            "<tr>"
            f'<td style="vertical-align:top;padding:2px 6px;{_WHOLE}"><b>{escape(key)}</b></td>'
            f'<td style="vertical-align:top;padding:2px 6px;color:#57606a;{_WHOLE}">'
            f"{escape(type(value).__name__)}</td>"
            f'<td style="padding:2px 6px;text-align:left">{value_html(value, key)}</td>'
            "</tr>"
        )
    return f'<table class="kcoral-results" style="border-collapse:collapse">{"".join(rows)}</table>'


def _stream_html(label: str, text: str, truncated: bool) -> str:
    if not text and not truncated:
        return ""
    note = " <i>(truncated by the output limit)</i>" if truncated else ""
    return f"<div><b>{label}</b>{note}<pre style='{_PRE}'>{escape(text)}</pre></div>"


def error_html(error: Mapping[str, Any]) -> str:
    where = (
        f"instruction {escape(error.get('instruction_index'))} "
        f"({escape(error.get('instruction_op'))} {escape(error.get('instruction_id'))})"
    )
    traceback = str(error.get("traceback") or "")
    details = (
        f"<details open><summary>remote traceback</summary><pre style='{_PRE}'>"
        f"{escape(traceback)}</pre></details>"
        if traceback
        else ""
    )
    return (
        '<div class="kcoral-error" style="color:#cf222e">'
        f"<b>{escape(error.get('kind'))}</b>: {escape(error.get('message'))} · {where}</div>"
        f"{details}"
    )


def program_result_html(result: Any, *, server: str | None = None) -> str:
    """Badge, timing bar, output streams, error, results table."""
    head = [status_badge(result.status), f"request <code>{escape(result.request_id)}</code>"]
    if server:
        head.append(f"on {escape(server)}")
    if result.gpu_ids:
        head.append(f"GPUs {escape(list(result.gpu_ids))}")
    parts = [
        f'<div class="kcoral-result" style="{_BOX}">',
        " · ".join(head),
        timing_bar(
            result.queue_ms,
            result.lease_wait_ms,
            result.lease_held_ms,
            result.elapsed_ms,
            # A CPU server has no GPU lease (both exactly 0, no GPU ids): its 0.0 ms pieces
            # would say nothing true. A GPU program holds its lease for a measurable time.
            leased=bool(result.gpu_ids or result.lease_wait_ms or result.lease_held_ms),
        ),
        _stream_html("stdout", result.stdout, result.stdout_truncated),
        _stream_html("stderr", result.stderr, result.stderr_truncated),
    ]
    if result.error:
        parts.append(error_html(result.error))
    if result.results:
        parts.append(results_table(result.results))
    parts.append("</div>")
    return "".join(parts)


def job_html(job: Job) -> str:
    """A job handle: id, status (asked once), and how to get the result."""
    job_id = job.id
    try:
        state = job.status()
    except (KCoralError, ProtocolError, TransportError) as exc:
        # an expired job or an unreachable server still displays
        state = {"status": "unknown", "error": f"{type(exc).__name__}: {exc}"}
    status = str(state.get("status", "unknown"))
    facts = [
        f"{escape(key)} {escape(state[key])}"
        for key in ("worker_id", "gpu_ids", "queue_position", "elapsed_ms", "error")
        if state.get(key) not in (None, [], "")
    ]
    return (
        f'<div class="kcoral-job" style="{_BOX}">{status_badge(status)} job '
        f"<code>{escape(job_id)}</code> {' · '.join(facts)}"
        '<div style="color:#57606a">.result() waits for the outcome · .cancel() stops it · '
        f"%kcoral attach {escape(job_id)} follows it</div></div>"
    )


# ----------------------------------------------------------------- the magics' screens


def status_line_bundle(text: str, *, status: str | None, warning: bool) -> dict[str, str]:
    """A cell's status line: the status said once (the badge in HTML, the first word in plain
    text); a warning in amber after a warning sign."""
    badge = status_badge(status) + " " if status else ""
    word = f"{status} · " if status else ""
    sign = "\u26a0 " if warning else ""
    colour = "#9a6700;font-weight:600" if warning else "#57606a"
    return {
        "text/plain": f"kcoral: {word}{sign}{text}",
        "text/html": (
            '<div class="kcoral-line" style="font-family:var(--jp-code-font-family,'
            f'monospace);font-size:12px;color:{colour}">{badge}kcoral: {sign}'
            f"{escape(text)}</div>"
        ),
    }


def rows_bundle(rows: list[tuple[str, Any]]) -> dict[str, str]:
    """``name: value`` rows (``%kcoral status``, ``%kcoral session status``), every value as
    text."""
    table = "".join(
        f"<tr><td style='padding:1px 8px'><b>{escape(k)}</b></td>"
        f"<td style='padding:1px 8px;text-align:left'>{escape(v)}</td></tr>"
        for k, v in rows
    )
    return {
        "text/plain": screened("\n".join(f"{k}: {v}" for k, v in rows)),
        "text/html": f"<table class='kcoral-status-table'>{table}</table>",
    }


def table_bundle(columns: tuple[str, ...], rows: list[list[str]], text: str) -> dict[str, str]:
    """A table (``%kcoral jobs``, the fleet of ``%kcoral status``); ``text`` is its
    plain-text form."""
    head = "".join(f"<th>{escape(title)}</th>" for title in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return {"text/plain": screened(text), "text/html": f"<table><tr>{head}</tr>{body}</table>"}


#: Said for a number not known
UNKNOWN = "\u2014"
#: The fleet table's columns (``%kcoral status`` through a router, ROUTER §6 fleet_status).
FLEET_COLUMNS = ("fleet", "nodes", "free seats", "queue", "est. wait")


def wait_text(seconds: object) -> str:
    """An estimated wait in few characters: ``—`` when not known, ``0 s``, ``12 s``,
    ``3.5 min``, ``2.0 h``."""
    seconds = finite_float(seconds)
    if seconds is None:
        return UNKNOWN
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 1 or seconds == 0 else "<1 s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def fleet_rows(fleet_status: Mapping[str, Any]) -> list[list[str]]:
    """The rows of the fleet table: each kind (``gpu=h100 sm_90a x8``, the default kind
    marked), then each label (``pool=big``), with its nodes, free seats of all, queue and
    estimated wait."""
    rows: list[list[str]] = []
    # The nodes that are not serving, by kind (ROUTER §6 not_ready): beside a kind's ready
    # count, or a row of their own where none of that kind is ready.
    out = {_kind_name(k): k.get("states") for k in _mappings(fleet_status.get("not_ready"))}
    for kind in _mappings(fleet_status.get("kinds")):
        name = _kind_name(kind)
        numbers = _fleet_numbers(kind)
        numbers[0] = _nodes_text(numbers[0], out.pop(name, None))
        rows.append([name, *numbers])
    for name, states in out.items():
        rows.append([name, _nodes_text("0", states), *[UNKNOWN] * 3])
    for label in fleet_status.get("labels") or []:
        if isinstance(label, Mapping):
            rows.append([f"{label.get('key')}={label.get('value')}", *_fleet_numbers(label)])
    return rows


def _mappings(rows: object) -> list[Mapping[str, Any]]:
    return [row for row in rows if isinstance(row, Mapping)] if isinstance(rows, list) else []


def _kind_name(kind: Mapping[str, Any]) -> str:
    """``gpu=h100 sm_90a x8 (default)``."""
    name = f"gpu={kind.get('gpu') or '?'}"
    if kind.get("arch"):
        name += f" {kind['arch']}"
    if isinstance(kind.get("gpus"), int) and kind["gpus"] > 0:
        name += f" x{kind['gpus']}"
    return name + (" (default)" if kind.get("default") else "")


#: The node states a router names (ROUTER §6); any other a server sends reads ``other``.
NODE_STATES = ("starting", "recovering", "incompatible", "unhealthy", "draining", "left")


def _nodes_text(ready: str, states: object) -> str:
    """``1/2 ready · 1 draining`` where some nodes of a kind are not serving, else ``1``."""
    counts: dict[str, int] = {}
    for state, count in states.items() if isinstance(states, Mapping) else ():
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            said = state if state in NODE_STATES else "other"
            counts[said] = counts.get(said, 0) + count
    if not counts or not ready.isdigit():
        return ready
    out = " · ".join(f"{count} {state}" for state, count in counts.items())
    return f"{ready}/{int(ready) + sum(counts.values())} ready · {out}"


def _fleet_numbers(row: Mapping[str, Any]) -> list[str]:
    """Nodes, free seats, queue and wait of a row; ``—`` for what it does not say (a
    router's ``fleet`` without ``fleet_status`` counts nodes only)."""

    def number(key: str) -> str:
        value = row.get(key)
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else UNKNOWN

    free, seats = number("free_seats"), number("seats")
    return [
        number("nodes"),
        UNKNOWN if UNKNOWN in (free, seats) else f"{free} of {seats}",
        number("queued"),
        wait_text(row.get("estimated_wait_seconds")),
    ]


def submitted_job_bundle(job_id: str, server: str, name: str | None) -> dict[str, str]:
    """What ``%%kcoral --noblock`` shows: the job, where it went, how to follow it."""
    bound = f" as {name}" if name else ""
    return {
        "text/plain": (
            f"kcoral: submitted job {job_id} to {server}{bound}; %kcoral attach {job_id} follows it"
        ),
        "text/html": (
            f"<div style='font-family:monospace;font-size:12px'>kcoral: submitted job "
            f"<code>{escape(job_id)}</code> to {escape(server)}"
            f"{' as ' + escape(name) if name else ''}; "
            f"<code>%kcoral attach {escape(job_id)}</code> follows it</div>"
        ),
    }
