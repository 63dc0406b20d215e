"""Exports' temporary directories and who owns them.

Exports build into temporary directories (`<final>.tmp-*`) renamed into place when complete. A killed
export (SIGKILL, OOM, power loss) cannot clean up, and its directory can hold a GB of weights, so
the name records the owner: `<prefix><pid>.<host tag>-<random>` (`owned_tmpdir`). The next export
removes those whose owner process is gone (same host, `os.kill(pid, 0)` fails: `remove_stale_tmpdirs`),
never one of a live process. `fix_modes` gives a finished directory the usual modes before it is
renamed into place. Users: export/onnx_export.py and export/builder.py (the export cache),
export/bundle_writer.py (a bundle's temporary and replaced directories).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from edgespec.export.progress import log

KEY_RE = r"[0-9a-f]{24}"                 # export_key / builder.build_key: the cache's entries
LEGACY_STALE_S = 24 * 3600               # unowned temp dirs (made before owners were recorded): a day old


def host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def owned_tmpdir(parent: Path, prefix: str) -> Path:
    """tempfile.mkdtemp in `parent`, named `<prefix><pid>.<host tag>-<random>`."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.{host_tag()}-", dir=parent))


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (another user's counts as alive)."""
    if not 0 < pid < 2**31:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                      # EPERM: it exists, owned by someone else
        return True
    return True


def _newest_mtime(d: Path) -> float:
    times = [d.lstat().st_mtime]
    for f in d.iterdir():
        try:
            times.append(f.lstat().st_mtime)
        except OSError:
            pass
    return max(times)


def is_stale(path: Path, owner: str) -> bool:
    """`owner` is the part of a temp name after its prefix: `<pid>.<host>-<random>` is stale when that
    process is gone (this host only); a legacy mkdtemp suffix (8 characters, no owner) when nothing in
    it changed for LEGACY_STALE_S."""
    m = re.fullmatch(r"(\d+)\.([0-9a-f]{8})-\w+", owner)
    if m:
        return m.group(2) == host_tag() and not pid_alive(int(m.group(1)))
    if re.fullmatch(r"\w{8}", owner):
        try:
            return time.time() - _newest_mtime(path) > LEGACY_STALE_S
        except OSError:
            return False
    return False


def remove_stale_tmpdirs(parent: Path, prefix_re: str, progress: bool = False, suffix: str = "") -> list[Path]:
    """Remove the directories `parent/<prefix><owner>` (prefix_re: a regex) that `is_stale`; with
    `suffix`, the files `parent/<prefix><owner><suffix>` instead (a killed builder's log). Returns them."""
    removed: list[Path] = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:                      # no such directory yet, unreadable: nothing to clean
        return removed
    for d in entries:
        m = re.match(prefix_re, d.name)
        if not m or not d.name.endswith(suffix) or d.is_symlink() or not (d.is_file() if suffix else d.is_dir()):
            continue
        if not is_stale(d, d.name[m.end():len(d.name) - len(suffix)]):
            continue
        if suffix:
            d.unlink(missing_ok=True)
        else:
            shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed.append(d)
            log(progress, f"removed {d}, left by an interrupted export")
    return removed


def fix_modes(d: Path) -> None:
    """Give a directory made by mkdtemp (0700) and the files in it the usual umask-derived modes
    (the TorchScript exporter writes its data file 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(d, 0o777 & ~umask)
    for f in d.iterdir():
        if f.is_file():
            os.chmod(f, 0o666 & ~umask)
