"""Where archived objects live: a Store over a local directory (stdlib) or any fsspec URL."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from typing import IO, Any, NamedTuple, TypeVar

from ..errors import CorruptionError, WaljError
from ..log.fs import DEFAULT_FS, DIR_MODE, FILE_MODE, open_regular, write_all

T = TypeVar("T")


class ArchiveError(WaljError):
    """The archive could not be reached or used: no fsspec (install walj[s3]), a bad URL,
    missing credentials, an unreachable endpoint, or a copy that did not read back intact."""


class Entry(NamedTuple):
    """One name under a prefix: its size, and whether it is a plain object (not a "directory"
    or anything else a reader must refuse)."""

    size: int
    regular: bool


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for `scheme://...`: the readers send it to the archive, anything else is a local
    directory."""
    return isinstance(path, str) and "://" in path


class Store:
    """Objects under one root. Keys are '/'-joined paths below the root; a store never
    deletes, and writes only through `put_new` (a new object) and `put` (over an object that
    the caller proved holds nothing the new one lacks, see _append)."""

    url: str

    def key(self, *parts: str) -> str:
        raise NotImplementedError

    def list(self, key: str) -> dict[str, Entry]:
        """The names directly under `key` ({} when there is nothing there)."""
        raise NotImplementedError

    def open_read(self, key: str, size: int | None = None) -> IO[bytes]:
        """A seekable binary reader of the object (`size`: as listed, which spares a backend
        the request that would ask for it)."""
        raise NotImplementedError

    def read_range(self, key: str, start: int, end: int) -> bytes:
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        """Store the object whole, or leave the old one (or none) in its place: a reader
        never sees a prefix of `data` where the backend allows it (see docs/ARCHIVE.md)."""
        raise NotImplementedError

    def put_new(self, key: str, data: bytes) -> bool:
        """Store the object only if no object of that name exists (False, nothing written,
        when one does), as atomically as the backend allows: a ship racing another never
        writes over the object the other one just verified."""
        raise NotImplementedError


class LocalStore(Store):
    """A local directory, through the standard library alone (the forensic zipapp reads local
    archives): files are opened as the log opens them (never a symlink, a FIFO or a device),
    and `put` writes a temporary file, syncs it and renames it into place."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.url = root

    def key(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def list(self, key: str) -> dict[str, Entry]:
        try:
            names = os.listdir(key)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        found: dict[str, Entry] = {}
        for name in names:
            try:
                st = os.lstat(os.path.join(key, name))
            except FileNotFoundError:
                continue
            found[name] = Entry(st.st_size, stat.S_ISREG(st.st_mode))
        return found

    def open_read(self, key: str, size: int | None = None) -> IO[bytes]:
        return os.fdopen(open_regular(key, os.O_RDONLY), "rb", buffering=0)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        fd = open_regular(key, os.O_RDONLY)
        try:
            return os.pread(fd, max(0, end - start), start)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes) -> None:
        self._write(key, data, replace=True)

    def put_new(self, key: str, data: bytes) -> bool:
        return self._write(key, data, replace=False)

    def _write(self, key: str, data: bytes, *, replace: bool) -> bool:
        """Write a temporary file, sync it, then put it in place (a rename; for a new object
        a hard link, which fails if the name exists), then sync the directory."""
        directory = os.path.dirname(key)
        self._makedirs(directory)
        # Not named like a segment, so no reader lists it; removed if anything interrupts us.
        tmp = os.path.join(directory, f".{os.path.basename(key)}.part-{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     FILE_MODE)
        placed = True
        try:
            try:
                write_all(DEFAULT_FS, fd, data)
                DEFAULT_FS.sync(fd)
            finally:
                os.close(fd)
            if replace:
                os.replace(tmp, key)
            else:
                placed = _link_new(tmp, key)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        DEFAULT_FS.sync_dir(directory)
        return placed

    def _makedirs(self, directory: str) -> None:
        if os.path.isdir(directory):
            return
        parent = os.path.dirname(directory)
        if parent != directory:
            self._makedirs(parent)
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            pass
        DEFAULT_FS.sync_dir(parent)


def _link_new(tmp: str, key: str) -> bool:
    """Put `tmp` in place as `key` unless `key` exists (a hard link, then `tmp` unlinked). A
    file system without hard links gets a check then a rename, which a second ship could race
    (docs/ARCHIVE.md, Limits)."""
    try:
        os.link(tmp, key, follow_symlinks=False)
        placed = True
    except FileExistsError:
        placed = False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS,
                             errno.EXDEV):
            raise
        if os.path.lexists(key):
            os.unlink(tmp)
            return False
        os.replace(tmp, key)
        return True
    os.unlink(tmp)
    return placed


class FsspecStore(Store):
    """Any fsspec file system (s3://, gs://, ...). Credentials and endpoints come the fsspec
    way: `storage_options`, then fsspec's FSSPEC_<PROTOCOL>_<OPTION> variables, then the
    backend's own (AWS_ENDPOINT_URL_S3, AWS_PROFILE, ...)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        try:
            from fsspec.core import url_to_fs  # type: ignore[import-untyped,unused-ignore]
        except ImportError as exc:
            raise ImportError(f"reading or writing {url} needs fsspec and its backend: "
                              "pip install 'walj[s3]'") from exc
        self.url = url.rstrip("/")
        try:
            self.fs, root = url_to_fs(self.url, **(storage_options or {}))
        except ImportError as exc:
            raise ImportError(f"{url}: {exc}; for s3:// URLs: pip install 'walj[s3]'") from exc
        except (ValueError, TypeError) as exc:
            raise ArchiveError(f"{url}: not a usable archive URL: {exc}") from exc
        self.root = root.rstrip("/")

    def key(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (OSError, WaljError):
            raise
        except Exception as exc:  # botocore's credential and endpoint errors are no OSError
            raise ArchiveError(f"{what}: {type(exc).__name__}: {exc}") from exc

    def list(self, key: str) -> dict[str, Entry]:
        def ls() -> list[dict[str, Any]]:
            try:
                return list(self.fs.ls(key, detail=True, refresh=True))
            except FileNotFoundError:
                return []

        found: dict[str, Entry] = {}
        for info in self._call(f"listing {self.url}", ls):
            name = str(info.get("name", "")).rstrip("/").rsplit("/", 1)[-1]
            size = info.get("size") or 0
            if not name or not isinstance(size, int):
                continue
            found[name] = Entry(size, info.get("type") == "file")
        return found

    def open_read(self, key: str, size: int | None = None) -> IO[bytes]:
        # Read in order in 1 MiB chunks: a readahead of a few blocks, never the whole object.
        def opened() -> IO[bytes]:
            options: dict[str, Any] = {"block_size": 4 << 20, "cache_type": "readahead"}
            if size is not None and self._is_s3():
                options["size"] = size  # s3fs then needs no HEAD request per object
            return self.fs.open(key, "rb", **options)  # type: ignore[no-any-return]

        return self._call(f"opening {key}", opened)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return self._call(f"reading {key}", lambda: bytes(
            self.fs.cat_file(key, start=start, end=end)))

    def put(self, key: str, data: bytes) -> None:
        # One PUT: an object store shows it whole or not at all (s3fs turns more than 100 MiB
        # into a multipart upload, which is also invisible until it completes).
        self._call(f"writing {key}", lambda: self.fs.pipe_file(key, data))

    def put_new(self, key: str, data: bytes) -> bool:
        # S3 refuses a conditional PUT (If-None-Match: *) when the key exists; s3fs says so
        # with FileExistsError. Other backends get a check then a write, which a second ship
        # could race (docs/ARCHIVE.md, Limits).
        if self._is_s3():
            try:
                self._call(f"writing {key}", lambda: self.fs.pipe_file(key, data,
                                                                        mode="create"))
            except FileExistsError:
                return False
            return True
        if self._call(f"checking {key}", lambda: self.fs.exists(key)):
            return False
        self.put(key, data)
        return True

    def _is_s3(self) -> bool:
        """S3 takes an object's size on open, and a conditional PUT."""
        protocol = self.fs.protocol
        protocols = protocol if isinstance(protocol, (tuple, list)) else (protocol,)
        return bool({"s3", "s3a"} & set(protocols))


def open_store(url: str | os.PathLike[str],
               storage_options: dict[str, Any] | None = None) -> Store:
    """A plain path or file:// URL is a LocalStore (no extra needed); anything else goes
    through fsspec."""
    text = os.fspath(url)
    if text.startswith("file://"):
        local = text[len("file://"):]
        if local and not local.startswith("/"):
            raise ArchiveError(f"{text}: a file:// URL takes an absolute path (file:///...)")
        return LocalStore(local or "/")
    if not is_url(text):
        if not text:
            raise ArchiveError("an empty archive URL")
        return LocalStore(text)
    return FsspecStore(text, storage_options)


def refused(name: str, entry: Entry) -> CorruptionError | None:
    """The typed refusal of an object named like a segment that is not a plain object."""
    if entry.regular:
        return None
    return CorruptionError(f"{name} in the archive is not a plain object (a prefix or a "
                           "directory named like a segment): refused",
                           file=name, offset=0, kind="not_a_regular_file")
