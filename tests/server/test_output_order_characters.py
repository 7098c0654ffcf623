"""The worker's runs end at byte sizes of the capture files; the answer's ``output_order``
counts characters of the texts it returns (EXTENSIONS §16), decoded as the answer decodes
them (UTF-8 with replacement, the first ``output_limit_bytes``). ``runs_in_characters``
converts one into the other."""

from __future__ import annotations

from kcoral_server.processes.output_order import runs_in_characters

from kcoral.protocol.output_order import interleave


def test_multi_byte_characters_count_once() -> None:
    stdout, stderr = "é\n".encode(), "日本\n".encode()  # 3 bytes, 7 bytes
    runs = runs_in_characters([(1, 3), (2, 7)], stdout, stderr)
    assert runs == [(1, 2), (2, 3)]


def test_an_invalid_byte_counts_as_the_replacement_character_it_reads_as() -> None:
    stdout, stderr = b"a\xffb\n", b"warn\n"
    runs = runs_in_characters([(1, 2), (2, 5), (1, 4)], stdout, stderr)
    text = stdout.decode("utf-8", errors="replace")
    assert interleave(text, "warn\n", tuple(runs)) == [
        ("stdout", "a\ufffd"),
        ("stderr", "warn\n"),
        ("stdout", "b\n"),
    ]


def test_a_run_ending_inside_a_character_ends_before_it() -> None:
    stdout = "xé".encode()  # x, then two bytes
    runs = runs_in_characters([(1, 2), (2, 1), (1, 3)], stdout, b"!")
    assert interleave("xé", "!", tuple(runs)) == [
        ("stdout", "x"),
        ("stderr", "!"),
        ("stdout", "é"),
    ]


def test_runs_past_the_returned_bytes_stop_at_them() -> None:
    # the answer returns the first bytes only (the output limit): runs never point past them
    runs = runs_in_characters([(1, 2), (2, 5000), (1, 9000)], b"ab", b"cd")
    assert runs == [(1, 2), (2, 2)]
