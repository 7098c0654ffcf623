"""A count of one reads in the singular in a returned file's and folder's repr and in the
notebook's view of them: they read '1 bytes', '1 files' and '1 directories'."""

from __future__ import annotations

from kcoral_jupyter.display import format_size, returned_file_html, returned_folder_html

from kcoral import ReturnedFile, ReturnedFolder


def test_one_byte_one_file_and_one_directory_are_singular() -> None:
    one = ReturnedFile(b"x")
    folder = ReturnedFolder({"sub/a.txt": one}, ["sub"])
    assert repr(one) == "ReturnedFile(<1 byte>)"
    assert repr(folder) == "ReturnedFolder(<1 file, 1 directory>)"
    assert format_size(1) == "1 byte"
    assert "1 byte<" in returned_folder_html(folder, "out")  # a.txt's size
    assert "· 1 file · 1 directory · 1 byte" in returned_folder_html(folder, "out")
    assert "<b>one.txt</b> · 1 byte" in returned_file_html(one, "one.txt")


def test_other_counts_stay_plural_and_sizes_keep_their_units() -> None:
    assert repr(ReturnedFile(b"")) == "ReturnedFile(<0 bytes>)"
    assert repr(ReturnedFolder({})) == "ReturnedFolder(<0 files, 0 directories>)"
    assert [format_size(n) for n in (2, 1023, 1024, 1536, 1 << 20, 5 << 30, 5 << 40)] == [
        "2 bytes",
        "1023 bytes",
        "1.0 KiB",
        "1.5 KiB",
        "1.0 MiB",
        "5.0 GiB",
        "5120.0 GiB",
    ]
