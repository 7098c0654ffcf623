"""The committed prebuilt JupyterLab extension is complete and installed by `pip install .`."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "jupyter_ext" / "labextension"
SHARE = "share/jupyter/labextensions/kcoral-jupyterlab"


def _data_files() -> dict[str, list[str]]:
    """The wheel's shared-data (pyproject.toml) as install folder -> glob patterns of the files
    it receives: a mapped folder's files keep their place below the install folder."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shared = config["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    found: dict[str, list[str]] = {}
    for source, target in shared.items():
        if not (ROOT / source).is_dir():
            found.setdefault(str(Path(target).parent), []).append(source)
            continue
        for folder in [ROOT / source, *(p for p in (ROOT / source).rglob("*") if p.is_dir())]:
            relative = folder.relative_to(ROOT / source)
            found.setdefault(str(Path(target, relative)), []).append(
                str(Path(source, relative, "*"))
            )
    return found


def test_every_built_file_is_installed_under_share_jupyter_labextensions() -> None:
    installed: dict[str, str] = {}
    for target, patterns in _data_files().items():
        for pattern in patterns:
            for source in glob.glob(str(ROOT / pattern)):
                installed[str(Path(source).relative_to(ROOT))] = target
    built = [p for p in BUILT.rglob("*") if p.is_file()]
    assert built
    for path in built:
        relative = path.relative_to(BUILT)
        expected = str(Path(SHARE, *relative.parts[:-1])) if relative.parent.parts else SHARE
        assert installed.get(str(path.relative_to(ROOT))) == expected, relative


def test_the_built_extension_names_its_entry_point_and_its_python_package() -> None:
    package = json.loads((BUILT / "package.json").read_text())
    assert package["name"] == "kcoral-jupyterlab"
    assert (BUILT / package["jupyterlab"]["_build"]["load"]).is_file()
    install = json.loads((BUILT / "install.json").read_text())
    assert install["packageManager"] == "python" and install["packageName"] == "kcoral"


def test_the_built_settings_schema_is_the_source_schema() -> None:
    source = json.loads((ROOT / "labextension" / "schema" / "plugin.json").read_text())
    built = json.loads((BUILT / "schemas" / "kcoral-jupyterlab" / "plugin.json").read_text())
    assert built == source
    assert set(source["properties"]) == {"pollInterval", "statusServer"}


def test_the_sources_version_matches_the_build_and_the_lock_file_is_committed() -> None:
    source = json.loads((ROOT / "labextension" / "package.json").read_text())
    built = json.loads((BUILT / "package.json").read_text())
    assert source["version"] == built["version"]
    assert source["jupyterlab"]["outputDir"] == "../jupyter_ext/labextension"
    assert (ROOT / "labextension" / "package-lock.json").is_file()
