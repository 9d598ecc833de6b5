"""Fetching dataset files: mirrors tried in order, MD5-verified, archives unpacked safely.

Every step is atomic so an interrupted download never looks finished: a file is downloaded to a
hidden temp file beside its final name and renamed only once its checksum matches; an archive is
unpacked into a hidden temp folder whose entries are renamed into place afterwards; the dataset's
`.complete` marker is written last.

A mirror (`base_url`, or the CFLPIPE_DATASET_MIRROR environment variable) replaces the folder of
every URL and keeps its file name, for users behind a proxy mirror and for tests. Anything urllib
opens works as a mirror, including file:// folders.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import stat
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence
from urllib.parse import urlsplit

from cflpipe.errors import DataError

MIRROR_ENV = "CFLPIPE_DATASET_MIRROR"
MARKER = ".complete"
TIMEOUT_S = 60
CHUNK = 1 << 20
# Leftovers of a crashed run are removed once untouched this long; a live download writes to its
# temp file continuously, so it is never this old.
STALE_S = 3600
_PART_SUFFIX = ".part"
_EXTRACT_SUFFIX = ".extract"
# Some hosts refuse urllib's default agent.
_HEADERS = {"User-Agent": "cflpipe-dataset-download"}


@dataclass(frozen=True)
class Resource:
    filename: str
    urls: tuple[str, ...]
    md5: str
    extract: Literal["tar", "zip"] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "urls", tuple(self.urls))
        if self.extract not in (None, "tar", "zip"):
            raise ValueError(f"extract must be 'tar', 'zip' or None, got {self.extract!r}")


def mirror_base(base_url: str | None = None) -> str | None:
    return base_url or os.environ.get(MIRROR_ENV) or None


def resource_urls(resource: Resource, base_url: str | None = None) -> list[str]:
    """The URLs to try, in order: the official mirrors, or each of them rehomed on the mirror."""
    base = mirror_base(base_url)
    if base is None:
        return list(resource.urls)
    rehomed = [base.rstrip("/") + "/" + urlsplit(url).path.rsplit("/", 1)[-1] for url in resource.urls]
    return list(dict.fromkeys(rehomed))


def md5_file(path: str | Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


class _TransferError(Exception):
    """A mirror could not deliver the file; the next mirror is tried."""


def fetch(resource: Resource, dest_dir: str | Path, progress: bool = True,
          base_url: str | None = None) -> Path:
    """`dest_dir/<filename>` with the expected MD5, downloaded only if not already there."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / resource.filename
    if target.is_file() and md5_file(target) == resource.md5:
        return target
    urls = resource_urls(resource, base_url)
    failures: list[str] = []
    mismatch = None
    for url in urls:
        try:
            tmp = _download(url, dest_dir, resource.filename, progress)
        except _TransferError as exc:
            failures.append(f"{url} ({exc})")
            continue
        actual = md5_file(tmp)
        if actual == resource.md5:
            os.replace(tmp, target)
            return target
        tmp.unlink(missing_ok=True)
        # Another mirror may still hold the right file; the mismatch is reported if none does.
        mismatch = mismatch or (
            f"checksum mismatch for {resource.filename} from {url}: expected {resource.md5}, got {actual}"
        )
    if mismatch:
        raise DataError(mismatch)
    raise DataError(
        f"could not download {resource.filename}: {'; '.join(failures)}; "
        f"download {urls[0]} and place it at {target}, then re-run"
    )


def _download(url: str, dest_dir: Path, filename: str, progress: bool) -> Path:
    from tqdm import tqdm

    from cflpipe.store import share_like_new  # pyarrow: imported only when writing

    fd, tmp_name = tempfile.mkstemp(prefix=f".{filename}.", suffix=_PART_SUFFIX, dir=dest_dir)
    share_like_new(fd)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            request = urllib.request.Request(url, headers=_HEADERS)
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                total = getattr(response, "length", None)  # file:// responses have none
                received = 0
                with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=filename,
                          file=sys.stderr, disable=not progress, leave=False) as bar:
                    while block := response.read(CHUNK):
                        out.write(block)
                        received += len(block)
                        bar.update(len(block))
            if total is not None and received != total:
                raise _TransferError(f"connection closed after {received} of {total} bytes")
            out.flush()
            os.fsync(out.fileno())
        return tmp
    except urllib.error.HTTPError as exc:
        tmp.unlink(missing_ok=True)
        raise _TransferError(f"HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        tmp.unlink(missing_ok=True)
        raise _TransferError(_one_line(exc.reason)) from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:
        # ValueError: a malformed URL; OSError covers timeouts and resets mid-transfer.
        tmp.unlink(missing_ok=True)
        raise _TransferError(_one_line(exc)) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _one_line(reason: object) -> str:
    text = " ".join(str(reason).split()) or type(reason).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _check_member_name(archive: Path, name: str) -> None:
    # Backslashes count as separators too, so a Windows-made archive cannot slip `..\` past us.
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise DataError(f"refusing to extract {archive}: member {name!r} has an absolute path")
    if ".." in parts:
        raise DataError(f"refusing to extract {archive}: member {name!r} points outside the folder")


def _extract_tar(archive: Path, into: Path) -> None:
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                _check_member_name(archive, member.name)
                if not (member.isfile() or member.isdir()):
                    raise DataError(f"refusing to extract {archive}: member {member.name!r} "
                                    f"is a link or device")
            # The checks above already refuse what the 'data' filter would; it stays as a backstop.
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DataError(f"{archive} is not a readable tar archive: {_one_line(exc)}") from exc


def _extract_zip(archive: Path, into: Path) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            for info in infos:
                _check_member_name(archive, info.filename)
                # Unix-made zips keep the file type in the high bits; unzip honours symlinks there.
                kind = stat.S_IFMT(info.external_attr >> 16) if info.create_system == 3 else 0
                if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                    raise DataError(f"refusing to extract {archive}: member {info.filename!r} "
                                    f"is a link or device")
            zf.extractall(into, members=infos)
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
        raise DataError(f"{archive} is not a readable zip archive: {_one_line(exc)}") from exc


def extract_archive(archive: str | Path, kind: Literal["tar", "zip"], dest_dir: str | Path) -> list[str]:
    """Unpack `archive` into `dest_dir`, replacing entries of the same name; returns the names of
    the top-level entries. Nothing is moved into `dest_dir` unless the whole archive unpacked."""
    archive, dest_dir = Path(archive), Path(dest_dir)
    scratch = Path(tempfile.mkdtemp(prefix=f".{archive.name}.", suffix=_EXTRACT_SUFFIX, dir=dest_dir))
    try:
        if kind == "tar":
            _extract_tar(archive, scratch)
        elif kind == "zip":
            _extract_zip(archive, scratch)
        else:
            raise ValueError(f"unknown archive kind {kind!r}")
        names = sorted(entry.name for entry in scratch.iterdir())
        for name in names:
            if name in (archive.name, MARKER):
                raise DataError(f"refusing to extract {archive}: member {name!r} would replace "
                                f"the download itself")
        for name in names:
            final = dest_dir / name
            if final.is_dir() and not final.is_symlink():
                shutil.rmtree(final)
            elif final.exists() or final.is_symlink():
                final.unlink()
            os.replace(scratch / name, final)
        return names
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _remove_stale_temps(folder: Path) -> None:
    now = time.time()
    for entry in folder.iterdir():
        if not entry.name.startswith(".") or not entry.name.endswith((_PART_SUFFIX, _EXTRACT_SUFFIX)):
            continue
        try:
            if now - entry.lstat().st_mtime < STALE_S:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except FileNotFoundError:
            pass


def _read_marker(marker: Path) -> dict:
    try:
        return json.loads(marker.read_text())
    except (OSError, ValueError):
        return {}


def download_dataset(name: str, data_dir: str | Path, resources: Sequence[Resource], progress: bool = True,
                     base_url: str | None = None) -> Path:
    """Fetch, verify and unpack the resources of dataset `name` (`remote.resources_for(name)`)
    into `data_dir/<name>/`, then write its `.complete` marker. Files already present with the
    right MD5 are not downloaded again, and archives already unpacked (per the marker) are not
    unpacked again. Returns the dataset folder."""
    folder = Path(data_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(folder)
    marker = folder / MARKER
    previous = {entry.get("filename"): entry for entry in _read_marker(marker).get("resources", [])}
    # A marker must never outlive what it vouches for, so it goes before anything changes.
    marker.unlink(missing_ok=True)
    record = []
    for resource in resources:
        path = fetch(resource, folder, progress=progress, base_url=base_url)
        entry = {"filename": resource.filename, "md5": resource.md5}
        if resource.extract:
            done = previous.get(resource.filename, {})
            unpacked = done.get("extracted")
            if not (done.get("md5") == resource.md5 and unpacked
                    and all((folder / n).exists() for n in unpacked)):
                unpacked = extract_archive(path, resource.extract, folder)
            entry["extracted"] = unpacked
        record.append(entry)
    # cflpipe.store pulls in pandas; importing it only here keeps `import cflpipe.data` light.
    from cflpipe.store import write_json

    write_json(marker, {"dataset": name, "resources": record})
    return folder


def is_complete(name: str, data_dir: str | Path) -> bool:
    return (Path(data_dir) / name / MARKER).is_file()


def describe_resources(name: str, data_dir: str | Path, resources: Sequence[Resource],
                       base_url: str | None = None) -> list[str]:
    """One line per file of dataset `name`'s resources for `cflpipe download NAME --list`: where to
    get it, where it goes, its MD5 — what a user needs to fetch the files by hand on another
    machine."""
    folder = Path(data_dir) / name
    lines = []
    for resource in resources:
        urls = " or ".join(resource_urls(resource, base_url))
        unpack = f" (a {resource.extract} archive, unpacked there)" if resource.extract else ""
        lines.append(f"{urls} -> {folder / resource.filename}  md5 {resource.md5}{unpack}")
    return lines
