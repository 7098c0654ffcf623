"""Tiny pictures of tensors without matplotlib: a PNG heatmap and an SVG line plot.

The PNG writer is the format's minimum (8-bit RGB, one zlib-compressed IDAT); the SVG is one
polyline. Both are small enough to live inside a saved notebook.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

# A few anchor colours of a perceptually ordered dark-blue -> yellow map (viridis-like).
_ANCHORS = np.array(
    [
        [68, 1, 84],
        [59, 82, 139],
        [33, 145, 140],
        [94, 201, 98],
        [253, 231, 37],
    ],
    dtype=np.float64,
)

MAX_IMAGE_SIDE = 256
MIN_IMAGE_SIDE = 96
MAX_PLOT_POINTS = 512


def png_bytes(rgb: np.ndarray) -> bytes:
    """Encode an ``(h, w, 3)`` uint8 array as PNG."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError("png_bytes expects an (h, w, 3) uint8 array")
    height, width = rgb.shape[:2]
    # Each scanline starts with filter type 0 (none).
    raw = np.concatenate(
        [np.zeros((height, 1), dtype=np.uint8), rgb.reshape(height, width * 3)], axis=1
    ).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def colormap(values: np.ndarray) -> np.ndarray:
    """Map finite values to RGB (non-finite values are drawn grey)."""
    data = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(data)
    low = float(data[finite].min()) if finite.any() else 0.0
    high = float(data[finite].max()) if finite.any() else 1.0
    scaled = np.zeros_like(data) if high <= low else (data - low) / (high - low)
    scaled = np.where(finite, scaled, 0.0) * (len(_ANCHORS) - 1)
    index = np.clip(np.floor(scaled).astype(np.int64), 0, len(_ANCHORS) - 2)
    fraction = (scaled - index)[..., None]
    rgb = _ANCHORS[index] * (1 - fraction) + _ANCHORS[index + 1] * fraction
    rgb[~finite] = (160, 160, 160)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)


def heatmap_png(matrix: np.ndarray) -> bytes:
    """A 2-D array as a heatmap PNG (strided down when large, enlarged when tiny)."""
    data = np.asarray(matrix)
    if data.ndim != 2 or data.size == 0:
        raise ValueError("heatmap_png expects a non-empty 2-D array")
    return _enlarged_png(colormap(_strided(data).astype(np.float64)))


def image_png(pixels: np.ndarray) -> bytes:
    """An ``(h, w, 3)`` or ``(h, w, 1)`` image tensor as PNG: uint8 as it is, floats in
    [0, 1] scaled to 0..255, one channel as grey (strided down when large, enlarged when
    tiny)."""
    data = _strided(np.asarray(pixels))
    if data.dtype != np.uint8:  # a NaN or inf pixel is drawn grey, as the heatmap draws one
        values = data.astype(np.float64)
        values[~np.isfinite(values)] = 160 / 255
        data = np.clip(np.rint(values * 255), 0, 255).astype(np.uint8)
    return _enlarged_png(np.repeat(data, 3, axis=2) if data.shape[2] == 1 else data)


@dataclass(frozen=True)
class Picture:
    """What a notebook draws of a tensor: an ``<img>`` of ``mime`` ``data``."""

    kind: str  # said in its alt text: 'heatmap of x'
    css_class: str
    mime: str
    data: bytes
    style: str
    note: str = ""  # said under it: what it leaves out


_PIXELS = "image-rendering:pixelated;max-width:256px;border:1px solid #ddd"


def tensor_picture(array: np.ndarray, low: float, high: float) -> Picture | None:
    """The picture of a non-empty tensor whose finite values lie in [``low``, ``high``]: an
    ``(h, w, 3)``/``(h, w, 1)`` tensor of uint8, or of floats in [0, 1], as the image it
    holds (it showed as a column of numbers); a 2-D one as a heatmap; a 1-D one as a line
    plot; else None."""
    if array.ndim == 3 and array.shape[2] in (1, 3) and array.size:
        if array.dtype == np.uint8 or (array.dtype.kind == "f" and 0 <= low and high <= 1):
            drawn = image_png(array)
            return Picture(
                "image", "kcoral-image", "image/png", drawn, _PIXELS, stride_note(array.shape)
            )
    if array.ndim == 2 and array.size:
        # heatmap_png strides the array down to its picture before converting it
        drawn = heatmap_png(array)
        return Picture(
            "heatmap", "kcoral-heatmap", "image/png", drawn, _PIXELS, stride_note(array.shape)
        )
    if array.ndim == 1 and array.size > 1:
        svg = line_svg(plot_points(array)).encode()
        return Picture("line plot", "kcoral-plot", "image/svg+xml", svg, "")
    return None


def _steps(shape: tuple[int, ...]) -> tuple[int, int]:
    """The row and column steps that keep a picture's sides within ``MAX_IMAGE_SIDE``."""
    return max(1, -(-shape[0] // MAX_IMAGE_SIDE)), max(1, -(-shape[1] // MAX_IMAGE_SIDE))


def _strided(data: np.ndarray) -> np.ndarray:
    """Every n-th row and column of ``data`` (``_steps``)."""
    step_y, step_x = _steps(data.shape)
    return data[::step_y, ::step_x]


def stride_note(shape: tuple[int, ...]) -> str:
    """What a heatmap or image of ``shape`` leaves out, said under it: 'drawn from every 4th
    row and every 2nd column' ('' when nothing is left out). A value between those rows (a
    spike) is not in the picture, while the statistics beside it count it."""
    step_y, step_x = _steps(shape)
    if step_y == step_x == 1:
        return ""
    if step_y == step_x:
        return f"drawn from every {_nth(step_y)} row and column"
    rows = "every row" if step_y == 1 else f"every {_nth(step_y)} row"
    columns = "every column" if step_x == 1 else f"every {_nth(step_x)} column"
    return f"drawn from {rows} and {columns}"


def _nth(number: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st."""
    last = 0 if 11 <= number % 100 <= 13 else number % 10
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(last, "th")
    return f"{number}{suffix}"


def _enlarged_png(rgb: np.ndarray) -> bytes:
    """``rgb`` as PNG, each pixel repeated so that a tiny picture is ``MIN_IMAGE_SIDE``."""
    scale = max(1, MIN_IMAGE_SIDE // max(rgb.shape[0], rgb.shape[1]))
    if scale > 1:
        rgb = np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)
    return png_bytes(np.ascontiguousarray(rgb))


#: Elements of a long vector read at a time by ``plot_points``.
_ENVELOPE_CHUNK = 1 << 18


def plot_points(vector: np.ndarray) -> np.ndarray:
    """What ``line_svg`` draws of a 1-D array: every value of a short one; of a long one, the
    least and the greatest finite value of each of ``MAX_PLOT_POINTS // 2`` runs, in the
    order they come (every n-th value alone lost a spike between two of them, and the
    plot's labels said a smaller maximum than the statistics beside it). A run with no
    finite value gives NaN, which ``line_svg`` skips; read a piece at a time."""
    if vector.size <= MAX_PLOT_POINTS:
        return np.asarray(vector, np.float64)
    run = -(-vector.size // (MAX_PLOT_POINTS // 2))
    whole = vector.size // run * run
    blocks = [vector[:whole].reshape(-1, run)]
    if whole < vector.size:
        blocks.append(vector[whole:].reshape(1, -1))
    rows_at_once = max(1, _ENVELOPE_CHUNK // run)
    points = []
    for block in blocks:
        for start in range(0, block.shape[0], rows_at_once):
            points.append(_run_envelope(block[start : start + rows_at_once]))
    return np.concatenate(points)


def _run_envelope(rows: np.ndarray) -> np.ndarray:
    """The least and the greatest finite value of each row, in the order they come, as
    float64 (NaN for a row without a finite value). Numbers are compared in their own dtype
    (the same order as in float64) and only the two chosen of each row converted: a float64
    copy and a finiteness mask of every value doubled the time a 1M-element line plot took."""
    if rows.dtype.kind not in "biuf":
        rows = np.asarray(rows, np.float64)
    low, high = rows.argmin(axis=1), rows.argmax(axis=1)
    index = np.arange(rows.shape[0])
    if rows.dtype.kind == "f":
        # argmin/argmax pick a NaN or an infinity where a row holds one: only those rows
        # are searched again among their finite values
        again = ~(np.isfinite(rows[index, low]) & np.isfinite(rows[index, high]))
        if again.any():
            some = rows[again]
            finite = np.isfinite(some)
            low[again] = np.where(finite, some, np.inf).argmin(axis=1)
            high[again] = np.where(finite, some, -np.inf).argmax(axis=1)
    pair = np.stack([np.minimum(low, high), np.maximum(low, high)], axis=1)
    values = rows[index[:, None], pair].astype(np.float64)
    values[~np.isfinite(values)] = np.nan  # a row without a finite value
    return values.reshape(-1)


def line_svg(vector: np.ndarray, width: int = 320, height: int = 96) -> str:
    """A 1-D array as a small SVG line plot (non-finite points are skipped)."""
    data = np.asarray(vector, dtype=np.float64).reshape(-1)
    if data.size == 0:
        raise ValueError("line_svg expects a non-empty 1-D array")
    step = max(1, -(-data.size // MAX_PLOT_POINTS))
    xs = np.arange(0, data.size, step)
    ys = data[::step]
    finite = np.isfinite(ys)
    low = float(ys[finite].min()) if finite.any() else 0.0
    high = float(ys[finite].max()) if finite.any() else 1.0
    span = high - low or 1.0
    pad = 4
    span_x = max(1, data.size - 1)
    points = " ".join(
        f"{pad + (width - 2 * pad) * x / span_x:.1f},"
        f"{height - pad - (height - 2 * pad) * (y - low) / span:.1f}"
        for x, y, ok in zip(xs, ys, finite, strict=True)
        if ok
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" class="kcoral-plot">'
        f'<rect width="{width}" height="{height}" fill="#fafafa" stroke="#ddd"/>'
        f'<polyline fill="none" stroke="#3b528b" stroke-width="1.5" points="{points}"/>'
        f'<text x="{pad}" y="12" font-size="10" fill="#666">{high:.4g}</text>'
        f'<text x="{pad}" y="{height - 6}" font-size="10" fill="#666">{low:.4g}</text>'
        "</svg>"
    )
