"""A Python the job user can run, with the service's own packages.

The service's virtual environment is used as it is when the job user can run its interpreter
and read its packages. When it cannot, because the base interpreter or the environment lives in
a directory only its owner may enter (pyenv under ``/root``, mode 700; a checkout in ``/root``),
the service makes, once per interpreter and set of packages, an environment of its own under
``<temp dir>/rlrun-python``: the base interpreter with its standard library and headers, and a
virtual environment with the service's ``site-packages``, as hard links (no copy). Nothing else of
the private directories becomes reachable; no mode outside the service's own directories changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from service.cluster.job_user import READ, SEARCH, JobUser

VERSION = f"python{sys.version_info[0]}.{sys.version_info[1]}"
# What a linked environment holds; a new layout makes new environments, never reuses old ones.
LAYOUT = 2


@dataclass(frozen=True)
class JobPython:
    bin_dir: Path  # its python3 comes first on the nodes' PATH
    library_path: str | None = None  # LD_LIBRARY_PATH, for a base interpreter's libpython

    @property
    def executable(self) -> Path:
        return self.bin_dir / "python3"


def _site_packages() -> Path:
    return Path(sys.prefix) / "lib" / VERSION / "site-packages"


def blocker(user: JobUser) -> Path | None:
    """What stops ``user`` running the service's own interpreter with its packages, if any."""
    base = Path(sys.base_prefix)
    for path, want in (
        (Path(sys.executable), READ | SEARCH),
        (base / "lib" / VERSION / "os.py", READ),
        (_site_packages(), READ | SEARCH),
    ):
        if (blocked := user.blocker(path, want)) is not None:
            return blocked
    return None


def for_user(user: JobUser | None, root: Path | None = None) -> JobPython:
    """The interpreter the nodes run as ``user``: the service's own when it can, else a linked
    one (made once)."""
    own = JobPython(Path(sys.executable).parent)
    if user is None or blocker(user) is None:
        return own
    root = root or Path(tempfile.gettempdir()) / "rlrun-python"
    real = Path(sys.executable).resolve()
    # Another interpreter, other packages, or another user's reach: another environment.
    reach = user.blocker(_site_packages(), READ | SEARCH) is None
    stamps = f"{real.stat().st_mtime_ns} {_site_packages().stat().st_mtime_ns} {user.uid} {reach}"
    key = hashlib.sha256(
        f"{LAYOUT} {sys.base_prefix} {sys.prefix} {sys.version} {stamps}".encode()
    ).hexdigest()[:16]
    home = _shared_dir(root) / key
    if not (home / "done").exists():
        _make(home, real, user)  # earlier ones stay: a running service may still use them
    linked = JobPython(home / "venv" / "bin", str(home / "base" / "lib"))
    if (blocked := user.blocker(linked.executable, READ | SEARCH)) is not None:
        raise PermissionError(f"the job user {user.name} cannot reach {blocked}")
    return linked


def _shared_dir(root: Path) -> Path:
    """``root``, the service's and readable by all; refused if anyone else could write there."""
    root.mkdir(mode=0o755, exist_ok=True)
    st = root.lstat()
    if root.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{root} is not the service's own directory; remove it")
    return root


def _make(home: Path, real: Path, user: JobUser) -> None:
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=home.parent))
    try:
        base = Path(sys.base_prefix)
        (building / "base" / "bin").mkdir(parents=True)
        (building / "base" / "lib").mkdir()
        _link(real, building / "base" / "bin" / real.name)
        for lib in (base / "lib").glob("libpython*"):
            if lib.is_file():
                _link(lib, building / "base" / "lib" / lib.name)
        _link_tree(base / "lib" / VERSION, building / "base" / "lib" / VERSION)
        # Python.h and the rest: a job that compiles (torch's inductor under vLLM's CPU engine)
        # finds them under sys.base_prefix, as it would with the base interpreter.
        if (base / "include").is_dir():
            _link_tree(base / "include", building / "base" / "include", keep=True)
        venv = building / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "lib" / VERSION).mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text(
            f"home = {home / 'base' / 'bin'}\ninclude-system-site-packages = false\n"
            f"version = {sys.version.split()[0]}\n"
        )
        os.symlink(home / "base" / "bin" / real.name, venv / "bin" / real.name)
        for name in ("python", "python3"):
            os.symlink(real.name, venv / "bin" / name)
        packages = venv / "lib" / VERSION / "site-packages"
        if user.blocker(_site_packages(), READ | SEARCH) is None:
            os.symlink(_site_packages(), packages)
        else:
            _link_tree(_site_packages(), packages, keep=True)
        (building / "done").touch()
        for path in (building, *building.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        try:
            building.rename(home)
        except OSError:  # made meanwhile by another start
            if not (home / "done").exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy
        shutil.copy2(src, dst)


def _link_tree(src: Path, dst: Path, keep: bool = False) -> None:
    """``src`` as hard links under ``dst``, without its ``site-packages`` (the venv has its own)
    unless ``keep``."""
    for here, dirs, files in os.walk(src):
        rel = Path(here).relative_to(src)
        if rel == Path(".") and not keep:
            dirs[:] = [d for d in dirs if d != "site-packages"]
        out = dst / rel
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            path = Path(here) / name
            if path.is_symlink():
                os.symlink(os.readlink(path), out / name)
            else:
                _link(path, out / name)
