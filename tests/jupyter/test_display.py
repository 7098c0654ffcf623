"""Rich HTML of results, files, folders and tensors; the tiny PNG writer."""

from __future__ import annotations

import base64
import re
import tracemalloc

import numpy as np
import pytest
from kcoral_jupyter import display as rich
from kcoral_jupyter.images import MAX_PLOT_POINTS, heatmap_png, line_svg, plot_points, png_bytes
from kcoral_jupyter.tensor_stats import STATS_CHUNK_ELEMENTS, tensor_stats
from png_reader import decode_png

from kcoral import Client, ProgramResult, ReturnedFile, ReturnedFolder
from kcoral.connection.transport import MockTransport, Request, Response
from kcoral.errors import TransportError


def result(**changes) -> ProgramResult:
    fields = dict(
        status="COMPLETED",
        request_id="0b5c1f7e-3a0d-4c53-9d0e-6f1a2b3c4d5e",
        queue_ms=1.0,
        elapsed_ms=10.0,
        lease_wait_ms=2.0,
        lease_held_ms=5.0,
        results={},
        stdout="",
        stderr="",
        stdout_truncated=False,
        stderr_truncated=False,
    )
    fields.update(changes)
    return ProgramResult(**fields)


def test_the_png_writer_round_trips_pixels() -> None:
    pixels = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    np.testing.assert_array_equal(decode_png(png_bytes(pixels)), pixels)


def test_a_heatmap_maps_low_to_dark_and_high_to_bright_and_enlarges_tiny_matrices() -> None:
    image = decode_png(heatmap_png(np.array([[0.0, 1.0]])))
    assert image.shape[0] >= 48  # a 1x2 matrix is blown up so it can be seen
    assert image[0, 0].sum() < image[0, -1].sum()


def test_a_heatmap_of_a_large_matrix_stays_small() -> None:
    image = decode_png(heatmap_png(np.random.default_rng(0).random((2000, 1000))))
    assert max(image.shape[:2]) <= 256


def test_a_line_plot_is_an_svg_polyline_and_skips_non_finite_points() -> None:
    svg = line_svg(np.array([0.0, 1.0, np.nan, 4.0]))
    assert svg.startswith("<svg") and "<polyline" in svg
    assert svg.count(",") == 3  # three finite points


def each_runs_least_and_greatest(values: np.ndarray) -> list[float]:
    """The points a long line plot draws, one run at a time in float64 (NaN: none finite)."""
    run = -(-values.size // (MAX_PLOT_POINTS // 2))
    points: list[float] = []
    for start in range(0, values.size, run):
        piece = values[start : start + run].astype(np.float64)
        finite = np.flatnonzero(np.isfinite(piece))
        if finite.size == 0:
            points += [np.nan, np.nan]
            continue
        low = finite[piece[finite].argmin()]
        high = finite[piece[finite].argmax()]
        points += [piece[min(low, high)], piece[max(low, high)]]
    return points


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int64, np.uint8, bool])
def test_a_long_line_plot_draws_each_runs_least_and_greatest_finite_value(dtype) -> None:
    values = (np.random.default_rng(3).standard_normal(1_000_003) * 300).astype(dtype)
    if values.dtype.kind == "f":  # a NaN and infinities among finite values, a run of none
        values[[5, 700_001]], values[[9, 400_000]], values[12] = np.nan, np.inf, -np.inf
        values[2000:4000] = np.nan
    if values.dtype == np.int64:  # apart in int64, one value in float64
        values[800_000:800_002] = [2**62 + 1, 2**62]
    for vector in (values, values[::-3]):  # a strided view too
        expected = each_runs_least_and_greatest(vector)
        assert np.array_equal(plot_points(vector), expected, equal_nan=True)


def test_a_result_shows_badge_timing_bar_streams_and_a_results_table() -> None:
    html = rich.program_result_html(result(stdout="<b>hi</b>", results={"answer": 42}))
    assert "COMPLETED" in html and "kcoral-timing" in html
    assert "&lt;b&gt;hi&lt;/b&gt;" in html  # output is escaped
    assert "answer" in html and "42" in html
    assert "lease wait 2 ms" in html and "rest 3 ms" in html


def test_a_cpu_result_shows_no_gpu_lease_in_its_timing_bar() -> None:
    # A CPU server holds no GPU lease: "lease wait 0.0 ms · lease held 0.0 ms" said nothing
    # true (issue 29.5).
    html = rich.program_result_html(result(lease_wait_ms=0.0, lease_held_ms=0.0))
    assert "lease" not in html and "queue 1 ms" in html and "rest 10 ms" in html
    on_gpu = rich.program_result_html(result(lease_wait_ms=0.0, lease_held_ms=0.0, gpu_ids=(0,)))
    assert "lease wait 0 ms" in on_gpu


def test_a_failed_result_shows_the_error_and_traceback() -> None:
    error = {
        "kind": "runtime",
        "message": "ZeroDivisionError: division by zero",
        "instruction_index": 3,
        "instruction_op": "run",
        "instruction_id": "bad",
        "traceback": "Traceback ...\nZeroDivisionError: division by zero\n",
    }
    html = rich.program_result_html(result(status="FAILED", error=error))
    assert "FAILED" in html and "instruction 3" in html and "Traceback ..." in html


def test_tensors_show_stats_a_preview_and_a_picture() -> None:
    html = rich.tensor_html(np.arange(12, dtype=np.float32).reshape(3, 4), "m")
    assert "shape (3, 4)" in html and "dtype float32" in html
    assert "min 0" in html and "max 11" in html and "mean 5.5" in html
    png = re.search(r'src="data:image/png;base64,([^"]+)"', html).group(1)
    assert decode_png(base64.b64decode(png)).shape[2] == 3
    plot = re.search(r'src="data:image/svg\+xml;base64,([^"]+)"', rich.tensor_html(np.arange(5.0)))
    assert "<polyline" in base64.b64decode(plot.group(1)).decode()


@pytest.mark.parametrize(
    "values",
    [
        np.array([123456789, 987654321], np.int32),
        np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max]),
        np.arange(3_000_001, dtype=np.int64) * 1_000_003,  # in pieces
    ],
    ids=["int32", "int64 extremes", "large int64"],
)
def test_an_integer_tensor_shows_its_exact_min_and_max(values) -> None:
    # through float64 they read 'min 1.23457e+08 · max 9.87654e+08'
    html = rich.tensor_html(values, "ids")
    assert f"min {values.min()} · max {values.max()} · mean" in html
    assert tensor_stats(np.array([True, False]))["max"] == 1


def test_a_bfloat16_tensor_renders() -> None:
    import ml_dtypes

    html = rich.tensor_html(np.ones((2, 2), dtype=ml_dtypes.bfloat16))
    assert "bfloat16" in html and "mean 1" in html


def peak_traced_bytes(function, *args) -> tuple[object, int]:
    """``function(*args)`` and the peak of memory allocated meanwhile (NumPy's included)."""
    tracemalloc.start()
    try:
        return function(*args), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "tensor",
    [
        np.arange(2048 * 4096, dtype=np.uint32).astype(np.uint8).reshape(2048, 4096),
        np.arange(8 << 20, dtype=np.uint32).astype(np.uint8),  # 1-D: the line plot
        np.where(np.arange(1 << 21) % 7 == 0, np.nan, 1.5).astype(np.float32).reshape(1024, -1),
    ],
    ids=["uint8 2-D", "uint8 1-D", "float32 with NaN"],
)
def test_showing_a_large_tensor_needs_less_extra_memory_than_the_tensor(tensor) -> None:
    """8 MiB shown: no whole float64 copy (8 bytes an element), only a sample and pieces."""
    html, peak = peak_traced_bytes(rich.tensor_html, tensor, "t")
    assert f"shape {tensor.shape}" in html and "mean" in html
    assert peak < tensor.nbytes, f"{peak} bytes allocated to show {tensor.nbytes}"


def test_a_large_tensor_gets_the_statistics_of_its_finite_values() -> None:
    values = np.linspace(-3.0, 5.0, 3_000_001, dtype=np.float32)
    values[::1000] = np.nan
    values[1] = np.inf
    finite = values[np.isfinite(values)].astype(np.float64)
    stats = tensor_stats(values)
    assert values.size > STATS_CHUNK_ELEMENTS
    assert stats["min"] == float(finite.min()) and stats["max"] == float(finite.max())
    assert stats["mean"] == pytest.approx(float(finite.mean()), rel=1e-12)
    assert "min" not in tensor_stats(np.full(3_000_001, np.nan))


def test_image_files_are_inline_text_files_previewed_and_binary_files_get_a_save_hint() -> None:
    png = png_bytes(np.zeros((2, 2, 3), np.uint8))
    assert "data:image/png;base64," in rich.returned_file_html(ReturnedFile(png), "a.png")
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>x</script></svg>'
    svg_html = rich.returned_file_html(ReturnedFile(svg))
    assert "data:image/svg+xml;base64," in svg_html and "<script>" not in svg_html
    text = rich.returned_file_html(ReturnedFile(b"line <1>\nline 2\n"), "notes.txt")
    assert "line &lt;1&gt;" in text
    binary = rich.returned_file_html(ReturnedFile(b"\x00\x01\x02"), "dir/blob.bin")
    assert ".save(&#x27;blob.bin&#x27;)" in binary and "3 bytes" in binary


def test_a_folder_is_shown_as_a_tree() -> None:
    folder = ReturnedFolder(
        {"a/b.txt": ReturnedFile(b"xy"), "c.txt": ReturnedFile(b"")}, ["a", "empty"]
    )
    html = rich.returned_folder_html(folder, "out")
    assert "2 files" in html and "2 directories" in html
    assert "a/" in html and "  b.txt" in html and "empty/" in html


def test_a_job_shows_its_status_and_survives_an_unreachable_server() -> None:
    def running(request: Request) -> Response:
        body = b'{"job_id": "1234", "status": "RUNNING", "worker_id": "cpu/w0"}'
        return Response(200, {"Content-Type": "application/json"}, body)

    def down(request: Request) -> Response:
        raise TransportError("down")

    def job(handler: object, job_id: str) -> object:
        return Client("http://s", transport=MockTransport(handler)).job(job_id)

    assert "RUNNING" in rich.job_html(job(running, "1234"))
    assert "cpu/w0" in rich.job_html(job(running, "1234"))
    assert "unknown" in rich.job_html(job(down, "5678"))


def test_server_html_shows_only_in_a_sandboxed_iframe_and_other_types_are_dropped() -> None:
    shown = rich.server_display(
        {
            "text/html": "<table><tr><td>1</td></tr></table><script>x()</script>",
            "text/javascript": "x()",
        }
    )
    assert set(shown) == {"text/plain", "text/html"}
    frame = shown["text/html"]
    assert frame.startswith('<iframe class="kcoral-server-html" sandbox="" srcdoc="')
    assert "<script" not in frame and "&lt;script&gt;x()&lt;/script&gt;" in frame
    assert "default-src &#x27;none&#x27;" in frame  # the document may load nothing
    assert rich.server_display({"text/plain": 3}) == {"text/plain": "<display from the server>"}


def test_the_fleet_table_says_each_kind_and_label_in_few_characters() -> None:
    fleet_status = {
        "kinds": [
            {"gpu": "h100", "arch": "sm_90a", "gpus": 8, "default": True, "nodes": 2,
             "seats": 16, "free_seats": 0, "queued": 5, "estimated_wait_seconds": 192.0},
            {"gpu": None, "arch": None, "gpus": 0, "default": False, "nodes": 1},  # fleet only
        ],
        "labels": [{"key": "pool", "value": "big", "nodes": 2, "seats": 16, "free_seats": 0,
                    "queued": 5, "estimated_wait_seconds": None}],
    }  # fmt: skip
    assert rich.fleet_rows(fleet_status) == [
        ["gpu=h100 sm_90a x8 (default)", "2", "0 of 16", "5", "3.2 min"],
        ["gpu=?", "1", "\u2014", "\u2014", "\u2014"],
        ["pool=big", "2", "0 of 16", "5", "\u2014"],
    ]
    assert [rich.wait_text(s) for s in (0.0, 0.4, 12.2, 7200.0, None, True)] == [
        "0 s", "<1 s", "12 s", "2.0 h", "\u2014", "\u2014"
    ]  # fmt: skip
