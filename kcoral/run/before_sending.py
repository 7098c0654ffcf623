"""What ``kcoral run`` can tell of the tool's command from the ``--send`` inputs alone,
before anything is sent (CLIENT_API §11): a script or executable that cannot run there, and
a folder that sends nothing. The tool's directory holds only the inputs, so each of these
failed on the worker after the upload, in a message naming paths the user never saw."""

from __future__ import annotations

import os
from collections.abc import Sequence

from kcoral.local_folder import FileBlob
from kcoral.run.arguments import RunOptions
from kcoral.run.inputs import sent_as
from kcoral.run.tools import check_python_args


def empty_folders(send: Sequence[str], files: Sequence[tuple[str, FileBlob, bool]]) -> list[str]:
    """A warning for each ``--send`` folder that sends no file: empty folders are not sent,
    so the tool found no such folder at all, without a word here."""
    warnings = []
    for path in send:
        name = os.path.basename(os.path.abspath(path))
        if os.path.isdir(path) and not any(sent.startswith(f"{name}/") for sent, _, _ in files):
            warnings.append(
                f"warning: --send {path!r} holds no file to send (empty folders are not "
                f"sent): the tool finds no {name}/"
            )
    return warnings


def unsent_script(options: RunOptions, sent: Sequence[str]) -> str | None:
    """Why ``python SCRIPT`` cannot find a relative script, in the words the user typed, or
    None. The tool runs in a fresh remote directory holding only the ``--send`` inputs, so a
    relative script that none of them provides can only fail there, and the remote message
    would name a workspace path the user never saw. An absolute path may exist on the
    server and is left to it."""
    if options.tool.name != "python":
        return None
    script = check_python_args(options.args)
    if script is None or os.path.isabs(script):
        return None
    if os.path.normpath(script) in sent:
        return None
    # An input keeps only its last name: `--send w/bench -- w/bench/main.py` sent the script
    # as bench/main.py, and the advice to add --send w/bench/main.py (sent as main.py) only
    # repeated itself.
    if not os.path.exists(script):
        # `--send bench -- main.py`: the script arrives inside the folder's own name
        inside = sorted(path for path in sent if path.endswith("/" + os.path.normpath(script)))
        if inside:
            return (
                f"python: {script}: no --send input arrives as {script}, but {inside[0]} "
                f"does: name it {inside[0]} after '--'"
            )
        return f"python: {script}: no such file here, and no --send input provides it"
    remote = sent_as(script, options.send)
    if remote is not None and remote in sent:
        return (
            f"python: {script} is sent as {remote} (inputs keep only their own name): "
            f"name it {remote} after '--'"
        )
    name = os.path.basename(os.path.normpath(script))
    arrives = "" if name == os.path.normpath(script) else f", which arrives as {name}"
    return f"python: {script} was not sent (the tool runs remotely): add --send {script}{arrives}"


def unrunnable_executable(
    options: RunOptions, files: Sequence[tuple[str, FileBlob, bool]]
) -> str | None:
    """Why the tool cannot run a sent executable it runs directly (``shell ./tool``, the APP
    of ``ncu``, ``run-iket`` and ``compute-sanitizer``), or None: only the executable bit
    travels, and one sent without it failed on the worker, after the upload, with ``./tool:
    Permission denied``, naming neither the bit nor where to set it."""
    name = _executable_run(options.tool.name, options.args) or ""
    if "/" not in name or os.path.isabs(name):
        return None  # a bare name is looked up on the remote PATH
    remote = os.path.normpath(name)
    if any(path == remote and not executable for path, _blob, executable in files):
        return (
            f"{options.tool.name}: {name} cannot run: it is sent without its executable bit; "
            "chmod +x it here"
        )
    return None


def _executable_run(tool: str, args: Sequence[str]) -> str | None:
    """The word of the tool's command line that names what it executes, or None. The
    profilers' APP follows their second '--'; compute-sanitizer takes no '--', and its
    options' values cannot be told from APP, so only an APP that comes first is known."""
    if tool in ("ncu", "run-iket") and "--" in args:
        after = list(args).index("--") + 1
        return args[after] if after < len(args) else None
    if tool == "shell" or (tool == "compute-sanitizer" and not args[0].startswith("-")):
        return args[0]
    return None
