"""ReturnedFile / ReturnedFolder (CLIENT_API.md §7): construction and every save rule."""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kcoral import ProgramResult, ReturnedFile, ReturnedFolder


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def leftovers(directory):
    return [name for name in os.listdir(directory) if name.startswith(".kcoral-")]


def test_a_returned_file_needs_bytes():
    assert ReturnedFile(b"x").read_bytes() == b"x"
    for bad in (bytearray(b"x"), "x", memoryview(b"x")):
        with pytest.raises(TypeError):
            ReturnedFile(bad)  # type: ignore[arg-type]


def test_save_writes_a_new_file_with_mode_0600(tmp_path):
    target = tmp_path / "out.bin"
    assert ReturnedFile(b"data").save(str(target)) == target
    assert target.read_bytes() == b"data" and mode(target) == 0o600
    assert leftovers(tmp_path) == []


def test_save_refuses_an_existing_destination_without_overwrite(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        ReturnedFile(b"new").save(target)
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_overwrite_replaces_only_a_regular_file(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    target.chmod(0o644)
    ReturnedFile(b"new").save(target, overwrite=True)
    assert target.read_bytes() == b"new" and mode(target) == 0o600
    (tmp_path / "dir").mkdir()
    os.symlink(target, tmp_path / "link")
    for name in ("dir", "link"):
        with pytest.raises(ValueError):
            ReturnedFile(b"x").save(tmp_path / name, overwrite=True)
    assert os.path.islink(tmp_path / "link") and target.read_bytes() == b"new"
    assert leftovers(tmp_path) == []
    ReturnedFile(b"fresh").save(tmp_path / "new.bin", overwrite=True)
    assert (tmp_path / "new.bin").read_bytes() == b"fresh"


def test_save_refuses_a_symlinked_destination_without_overwrite(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    with pytest.raises(FileExistsError):
        ReturnedFile(b"x").save(tmp_path / "dangling")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("bad", ["", ".", "/", "a/..", "../x", "a/../b", "dir/", "dir/."])
def test_save_refuses_destinations_without_a_final_name_or_with_dotdot(tmp_path, bad, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError):
        ReturnedFile(b"x").save(bad)


def test_save_never_follows_a_symlinked_parent(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "alias")
    with pytest.raises((OSError, ValueError)):
        ReturnedFile(b"x").save(tmp_path / "alias" / "f")
    with pytest.raises((OSError, ValueError)):
        ReturnedFolder({"f": ReturnedFile(b"x")}).save(tmp_path / "alias" / "d")
    assert os.listdir(real) == []


def test_save_needs_an_existing_parent(tmp_path):
    with pytest.raises(FileNotFoundError):
        ReturnedFile(b"x").save(tmp_path / "missing" / "f")


def test_a_relative_destination_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ReturnedFile(b"x").save("plain.txt")
    assert (tmp_path / "plain.txt").read_bytes() == b"x"


def folder():
    return ReturnedFolder(
        {"a.txt": ReturnedFile(b"A"), "d/e/f.bin": ReturnedFile(b"F")},
        ["d", "d/e", "empty"],
    )


def test_a_folder_saves_files_and_empty_directories_with_private_modes(tmp_path):
    target = tmp_path / "out"
    assert folder().save(target) == target
    assert (target / "a.txt").read_bytes() == b"A"
    assert (target / "d/e/f.bin").read_bytes() == b"F"
    assert (target / "empty").is_dir()
    assert [mode(target / p) for p in ("", "d", "d/e", "empty")] == [0o700] * 4
    assert [mode(target / p) for p in ("a.txt", "d/e/f.bin")] == [0o600] * 2


def test_a_folder_destination_with_a_trailing_slash_names_that_folder(tmp_path, monkeypatch):
    # "results/" was refused as "has no final file name", though it names the folder
    monkeypatch.chdir(tmp_path)
    assert folder().save("results/") == Path("results")
    assert (tmp_path / "results" / "d" / "e" / "f.bin").read_bytes() == b"F"
    folder().save(f"{tmp_path}/absolute//")
    assert (tmp_path / "absolute" / "a.txt").read_bytes() == b"A"
    with pytest.raises(ValueError, match="no final file name"):
        folder().save("/")
    with pytest.raises(ValueError, match="no final file name"):
        ReturnedFile(b"x").save("file/")  # a file's destination still needs its name


def test_a_folder_refuses_an_existing_destination(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match=f"{str(tmp_path / 'out')!r} already exists"):
        folder().save(tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


def test_a_save_into_a_missing_folder_names_the_folder_written_not_its_last_part(tmp_path):
    # The system's error named the component it failed at: "No such file or directory: 'b'".
    missing = tmp_path / "a" / "b"
    for save in (ReturnedFile(b"x").save, folder().save):
        with pytest.raises(FileNotFoundError) as refused:
            save(missing / "result")
        assert refused.value.filename == str(missing), refused.value


def test_a_failing_folder_save_removes_what_it_created(tmp_path, monkeypatch):
    real_open = os.open
    calls = []

    def failing_open(path, flags, *args, **kwargs):
        if path == "f.bin":
            calls.append(path)
            raise OSError(28, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)
    with pytest.raises(OSError):
        folder().save(tmp_path / "out")
    assert calls and os.listdir(tmp_path) == []


DEEP_SAVE_PAST_A_FILE_SIZE_LIMIT = """
import os, resource, signal
from kcoral import ReturnedFile, ReturnedFolder
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
directories = ["/".join(["a"] * n) for n in range(1, 1101)]
folder = ReturnedFolder({directories[-1] + "/big": ReturnedFile(b"x" * 4096)}, directories)
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))
try:
    folder.save("out")
except OSError as exc:
    print("OSError", exc.errno)
"""


@pytest.mark.slow
def test_a_failing_save_of_a_1100_level_folder_raises_its_error_and_removes_the_tree(tmp_path):
    # shutil.rmtree recursed per level: RecursionError hid the EFBIG and the tree stayed.
    run = subprocess.run(
        [sys.executable, "-c", DEEP_SAVE_PAST_A_FILE_SIZE_LIMIT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout == f"OSError {errno.EFBIG}\n", run.stderr[-2000:]
    assert os.listdir(tmp_path) == []


def test_a_failing_file_save_leaves_the_destination_untouched(tmp_path, monkeypatch):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def failing_rename(*args, **kwargs):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(OSError):
        ReturnedFile(b"new").save(target, overwrite=True)
    assert target.read_bytes() == b"old" and leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("files", "directories"),
    [
        ({"b": b"", "a": b""}, []),
        ({"./a": b""}, []),
        ({"a//b": b""}, ["a"]),
        ({"/a": b""}, []),
        ({"a/../b": b""}, ["a"]),
        ({"d/a": b""}, []),
        ({"d": b""}, ["d"]),
        ({}, ["b", "a"]),
        ({}, ["a", "a"]),
        ({}, ["a/b"]),
        ({"": b""}, []),
    ],
)
def test_invalid_folder_manifests_are_refused(files, directories):
    with pytest.raises(ValueError):
        ReturnedFolder({k: ReturnedFile(v) for k, v in files.items()}, directories)


def test_folder_values_must_be_returned_files():
    with pytest.raises(TypeError):
        ReturnedFolder({"a": b"x"})  # type: ignore[dict-item]


def test_folder_members_are_read_only():
    made = folder()
    assert list(made.files) == ["a.txt", "d/e/f.bin"] and made.directories == ("d", "d/e", "empty")
    with pytest.raises(TypeError):
        made.files["x"] = ReturnedFile(b"")  # type: ignore[index]
    with pytest.raises(AttributeError):
        made.files = {}  # type: ignore[misc]


def test_program_result_fields_order_accessors_and_repr():
    result = ProgramResult(
        "FAILED",
        "rid",
        1.0,
        2.0,
        0.0,
        0.0,
        {"k": 1},
        "x" * 10_000,
        "",
        True,
        False,
        {"kind": "runtime", "message": "boom"},
    )
    assert not result.completed and result["k"] == 1 and result.gpu_ids == ()
    with pytest.raises(KeyError):
        result["missing"]
    text = repr(result)
    assert "rid" in text and "runtime" in text and "10000 chars, truncated" in text
    assert len(text) < 300


def test_a_symlinked_parent_is_named_as_a_link_in_the_error(tmp_path, monkeypatch):
    # O_NOFOLLOW's own error said "Not a directory: 'alias'" of a link to a directory.
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    monkeypatch.chdir(tmp_path)
    expected = "'alias' is a symbolic link: save follows no link in the destination's directories"
    with pytest.raises(NotADirectoryError, match=re.escape(expected)):
        ReturnedFile(b"x").save("alias/f")
    with pytest.raises(NotADirectoryError, match=re.escape(f"'{tmp_path}/alias' is a symbolic")):
        ReturnedFolder({"f": ReturnedFile(b"x")}).save(tmp_path / "alias" / "d")
    assert os.listdir(tmp_path / "real") == []


class CountedDescriptors:
    """Counts ``os.open`` calls and the most descriptors held at once while it is patched in."""

    def __init__(self, monkeypatch, fail_on=None):
        self.opens = self.held = self.most_held = 0
        real_open, real_dup, real_close = os.open, os.dup, os.close

        def held(fd):
            self.held += 1
            self.most_held = max(self.most_held, self.held)
            return fd

        def counted_open(path, flags, *args, **kwargs):
            if path == fail_on:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.opens += 1
            return held(real_open(path, flags, *args, **kwargs))

        def counted_close(fd):
            real_close(fd)
            self.held -= 1

        monkeypatch.setattr(os, "open", counted_open)
        monkeypatch.setattr(os, "dup", lambda fd: held(real_dup(fd)))
        monkeypatch.setattr(os, "close", counted_close)


def deep_folder(depth):
    """``depth`` nested directories with a file at every level (a file below the last)."""
    directories = ["/".join(["d"] * n) for n in range(1, depth + 1)]
    files = {f"{d}/f" if d else "f": ReturnedFile(b"x") for d in ["", *directories]}
    return ReturnedFolder(dict(sorted(files.items())), directories)


def test_saving_a_deep_folder_opens_each_entry_a_bounded_number_of_times(tmp_path, monkeypatch):
    # Each entry opened its directory again from the root: quadratic, 11 s for 2000 levels.
    folder = deep_folder(500)
    entries = len(folder.files) + len(folder.directories)
    counted = CountedDescriptors(monkeypatch)
    folder.save(tmp_path / "out")
    assert counted.opens <= 2 * entries
    assert counted.most_held <= 500 // 32 + 32 + 4  # kept levels, not one per level
    monkeypatch.undo()
    assert (tmp_path / "out" / ("d/" * 500 + "f")).read_bytes() == b"x"
    assert mode(tmp_path / "out" / ("d/" * 500)) == 0o700


def test_a_failing_deep_save_removes_its_tree_in_a_bounded_number_of_opens(tmp_path, monkeypatch):
    folder = deep_folder(500)
    entries = len(folder.files) + len(folder.directories)
    counted = CountedDescriptors(monkeypatch, fail_on="f")  # the first file, the deepest one
    with pytest.raises(OSError, match="No space left"):
        folder.save(tmp_path / "out")
    assert counted.opens <= 3 * entries
    assert counted.held == 0
    assert os.listdir(tmp_path) == []


# A returned folder holding a 64 MiB file, saved, and the memory the save took beyond what
# the process held (the peak, VmHWM, reset just before it).
_SAVE_COST = """
import sys
from kcoral.results import ReturnedFile, ReturnedFolder

def kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))

folder = ReturnedFolder({"big.bin": ReturnedFile(b"x" * (64 << 20))})
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the peak is what the process holds now
held = kib("VmRSS:")
folder.save(sys.argv[1])
print((kib("VmHWM:") - held) * 1024)
"""


def test_saving_a_returned_file_writes_its_bytes_without_a_copy(tmp_path: Path) -> None:
    # kcoral run --fetch of a 200 MiB output peaked at 441 MiB: 41 of the interpreter, 200
    # of the answer's buffer and 200 of the decoded file's bytes, which the decoder copies
    # before the buffer goes; the save, which writes them, must add nothing beside them
    out = tmp_path / "out"
    answer = subprocess.run(
        [sys.executable, "-c", _SAVE_COST, str(out)], capture_output=True, text=True, timeout=60
    )
    assert answer.returncode == 0, answer.stderr
    assert (out / "big.bin").stat().st_size == 64 << 20
    grown = int(answer.stdout)
    assert grown < 16 << 20, f"saving a 64 MiB file took {grown >> 20} MiB more"
