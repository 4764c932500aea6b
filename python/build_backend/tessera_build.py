"""A PEP 517 build backend for python/ that needs only the standard library.

It builds a pure-Python wheel of the packages listed in PACKAGES, with the metadata of
pyproject.toml's [project] table and Tessera's version from project(VERSION) in the
top-level CMakeLists.txt (or from PKG-INFO in an sdist). No package index is needed to
`pip install ./python`.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import tomllib
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
PACKAGES = ["tessera_paramsvc"]


def _project():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _version():
    pkg_info = os.path.join(HERE, "PKG-INFO")
    if os.path.exists(pkg_info):  # An sdist.
        with open(pkg_info) as f:
            m = re.search(r"^Version: (\S+)$", f.read(), re.M)
        if m:
            return m.group(1)
    cmake = os.path.join(HERE, "..", "CMakeLists.txt")
    with open(cmake) as f:
        m = re.search(r"project\(\s*Tessera\s+VERSION\s+([0-9.]+)", f.read())
    if not m:
        raise RuntimeError("no project(Tessera VERSION ...) in " + cmake)
    return m.group(1)


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + _version(),
             "Summary: " + p.get("description", ""),
             "License: " + p.get("license", {}).get("text", ""),
             "Requires-Python: " + p.get("requires-python", "")]
    for extra, reqs in p.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (r, extra) for r in reqs]
    return "\n".join(lines) + "\n"


def _dist_name():
    return _project()["name"].replace("-", "_")


def _package_files():
    for pkg in PACKAGES:
        root = os.path.join(HERE, pkg)
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if name.endswith(".py"):
                    full = os.path.join(dirpath, name)
                    yield full, os.path.relpath(full, HERE)


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = "%s-%s.dist-info" % (_dist_name(), _version())
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "w") as f:
        f.write(_metadata())
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    info = "%s-%s.dist-info" % (_dist_name(), version)
    wheel_name = "%s-%s-py3-none-any.whl" % (_dist_name(), version)
    entries = []
    for full, arcname in _package_files():
        with open(full, "rb") as f:
            entries.append((arcname, f.read()))
    entries.append((info + "/METADATA", _metadata().encode()))
    entries.append((info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: tessera_build\n"
                                     b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = [_record_line(name, data) for name, data in entries] + [info + "/RECORD,,"]
    entries.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (_dist_name(), _version())
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "build_backend/tessera_build.py"] + \
                   [arc for _, arc in _package_files()]:
            t.add(os.path.join(HERE, rel), arcname=base + "/" + rel)
        data = _metadata().encode()
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return name
