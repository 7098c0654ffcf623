"""File and folder round trips (PROTOCOL §5.1, §5.4, §7.5; CLIENT_API §3.3, §7)."""

from __future__ import annotations

import os
import stat

import pytest
from e2e_support import execute_program

import kcoral

MAKER = (
    "import os\n"
    "def make():\n"
    "    os.makedirs('out/sub/deep', exist_ok=True)\n"
    "    os.makedirs('out/empty')\n"
    "    open('out/a.txt', 'w').write('alpha')\n"
    "    open('out/.hidden', 'wb').write(b'h')\n"
    "    open('out/sub/deep/z.bin', 'wb').write(bytes(range(256)))\n"
    "    os.chdir('out/sub')  # returns still resolve against the original workspace\n"
    "    return os.getcwd()\n"
)


def folder_program() -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(kind="module", source=MAKER, id="m")
    program.run(fn=program.get_function(module=module, name="make", id="make"), id="made")
    program.return_folder(key="folder", path="out")
    program.return_file(key="file", path="./out//a.txt")
    program.return_folder(key="empty", path="out/empty")
    return program


def test_a_folder_return_lists_files_and_every_directory_and_saves_locally(client, tmp_path):
    result = client.execute(folder_program())
    assert result.completed, result.error
    folder = result["folder"]
    assert isinstance(folder, kcoral.ReturnedFolder)
    assert list(folder.files) == [".hidden", "a.txt", "sub/deep/z.bin"]
    assert folder.directories == ("empty", "sub", "sub/deep")
    assert folder.files["sub/deep/z.bin"].read_bytes() == bytes(range(256))
    assert result["file"].read_bytes() == b"alpha"
    assert result["empty"] == kcoral.ReturnedFolder({}, [])

    saved = folder.save(tmp_path / "copy")
    assert (saved / "a.txt").read_text() == "alpha"
    assert (saved / "empty").is_dir() and not any((saved / "empty").iterdir())
    assert stat.S_IMODE((saved / "sub").stat().st_mode) == 0o700
    assert stat.S_IMODE((saved / "sub/deep/z.bin").stat().st_mode) == 0o600
    with pytest.raises((FileExistsError, ValueError)):
        folder.save(tmp_path / "copy")
    with pytest.raises((FileNotFoundError, ValueError, OSError)):
        folder.save(tmp_path / "missing-parent" / "copy")


def test_the_folder_wire_manifest_is_exact(e2e_server):
    raw = execute_program(e2e_server.url, folder_program())
    node = raw.body["results"]["folder"]
    assert set(node) == {"type", "files", "directories"}
    assert node["directories"] == ["empty", "sub", "sub/deep"]
    assert [f["part"] for f in node["files"].values()] == ["return:0", "return:1", "return:2"]
    assert node["files"]["a.txt"]["size"] == 5
    assert set(node["files"]["a.txt"]) == {"type", "size", "part", "sha256"}
    assert raw.body["results"]["file"]["part"] == "return:3"
    assert raw.body["results"]["empty"] == {"type": "folder", "files": {}, "directories": []}


def test_returned_file_save_follows_the_overwrite_and_path_rules(client, tmp_path):
    returned = client.execute(folder_program())["file"]
    target = tmp_path / "a.txt"
    assert returned.save(target) == target and target.read_bytes() == b"alpha"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        returned.save(target)
    target.write_bytes(b"old")
    returned.save(target, overwrite=True)
    assert target.read_bytes() == b"alpha"
    (tmp_path / "dir").mkdir()
    with pytest.raises(ValueError):
        returned.save(tmp_path / "dir", overwrite=True)
    for bad in (tmp_path / ".." / "x", "."):
        with pytest.raises(ValueError):
            returned.save(bad)
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises((OSError, ValueError)):
        returned.save(tmp_path / "link" / "x.txt")
    assert not (tmp_path / "real" / "x.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "dir", "link", "real"]


def test_a_folder_uploaded_to_dot_is_read_by_the_program_from_its_working_directory(
    client, tmp_path
):
    source = tmp_path / "project"
    (source / "pkg").mkdir(parents=True)
    (source / "config.txt").write_text("cfg")
    (source / "pkg" / "data.txt").write_text("data")
    program = kcoral.Program()
    program.upload_folder(source, path=".")
    reader = program.upload(kind="module", source="def read(p):\n    return open(p).read()\n")
    read = program.get_function(module=reader, name="read")
    for key, path in (("config", "config.txt"), ("data", "pkg/data.txt")):
        program.return_(key=key, value=program.run(fn=read, args=[path]))
    result = client.execute(program)
    assert result.completed, result.error
    assert (result["config"], result["data"]) == ("cfg", "data")


def test_upload_folder_places_every_regular_file_and_the_server_sees_the_tree(client, tmp_path):
    source = tmp_path / "project"
    (source / "pkg" / "nested").mkdir(parents=True)
    (source / "empty").mkdir()
    (source / "top.txt").write_text("top")
    (source / ".env").write_text("hidden")
    (source / "pkg" / "nested" / "data.bin").write_bytes(b"\x00\x01")
    program = kcoral.Program()
    program.upload_folder(source, path="inputs/project")
    ids = [i["id"] for i in program.instructions]
    assert [i["path"] for i in program.instructions] == [
        "inputs/project/.env",
        "inputs/project/pkg/nested/data.bin",
        "inputs/project/top.txt",
    ]
    assert ids == ["upload_0", "upload_1", "upload_2"]
    program.return_folder(key="tree", path="inputs")
    lister = program.upload(
        kind="module",
        source="import os\ndef mode(p):\n    return oct(os.stat(p).st_mode & 0o777)\n",
    )
    mode = program.get_function(module=lister, name="mode")
    program.return_(key="mode", value=program.run(fn=mode, args=[kcoral.Register("upload_2")]))
    program.return_(key="dirmode", value=program.run(fn=mode, args=["inputs/project/pkg"]))
    result = client.execute(program)
    assert result.completed, result.error
    tree = result["tree"]
    assert list(tree.files) == ["project/.env", "project/pkg/nested/data.bin", "project/top.txt"]
    assert tree.directories == ("project", "project/pkg", "project/pkg/nested")
    assert (result["mode"], result["dirmode"]) == ("0o600", "0o700")
    # Empty folders add nothing; symlinks are refused without changing the program.
    before = program.instructions
    os.symlink(source / "top.txt", source / "link.txt")
    with pytest.raises(ValueError):
        program.upload_folder(source, path="other")
    assert program.instructions == before


@pytest.mark.parametrize(
    ("runtime_path", "reason"),
    [
        ("missing.txt", "missing"),
        ("link", "symlink"),
        ("dir", "folder as file"),
        ("../x", "bad path"),
    ],
)
def test_file_return_failures_are_serialization_errors_without_a_result(
    client, runtime_path, reason
):
    source = (
        "import os\n"
        "def prepare():\n"
        "    os.mkdir('dir')\n"
        "    open('real', 'w').write('r')\n"
        "    os.symlink('real', 'link')\n"
        f"    return {runtime_path!r}\n"
    )
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    path = program.run(fn=program.get_function(module=module, name="prepare"), id="path")
    program.return_(key="before", value=path)
    program.return_file(key="f", path=path)
    result = client.execute(program)
    assert result.status == "FAILED", reason
    assert result.error["kind"] == "serialization"
    assert result.results == {"before": runtime_path}
