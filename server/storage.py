"""Files in the storage folder the API and the workers share: uploads are streamed into a temporary file there (its
sha256 computed while writing, stopped as soon as the size limit is passed) and then moved to their content
address, models/<sha256[:2]>/<sha256>.onnx, or for an archive (a model with external data) unpacked into the folder
models/<sha256[:2]>/<sha256>/; artifacts are the workers' storage/artifacts/<id>.tar."""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import shutil
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from server.schemas import ApiError, Invalid, TooLarge
from server.settings import Settings

MODELS, ARTIFACTS, TMP = "models", "artifacts", "tmp"
FIELD_LIMIT = 64 << 10  # bytes of one form field that is not the file
MAX_FIELDS = 16
FRAMING_ALLOWANCE = 1 << 20  # what a multipart body may hold besides the file: boundaries, headers, fields


class UploadTooLarge(TooLarge):
    code = "upload_too_large"


class BadUpload(Invalid):
    code = "bad_upload"


@dataclass(frozen=True)
class StoredFile:
    path: Path  # a temporary file in storage/tmp until `keep` moves it to its content address
    sha256: str
    size: int


@dataclass
class Upload:
    file: StoredFile
    filename: str | None
    fields: dict[str, str]


def tmp_dir(settings: Settings) -> Path:
    # in the storage folder, not /tmp: the same file system as models/, so keeping a file is an atomic rename
    path = settings.storage / TMP
    path.mkdir(parents=True, exist_ok=True)
    return path


def scratch_path(settings: Settings, suffix: str = "") -> Path:
    """A fresh path for a temporary file (the caller deletes it)."""
    return tmp_dir(settings) / f"{secrets.token_hex(8)}{suffix}"


def model_path(settings: Settings, sha256: str) -> Path:
    return settings.storage / MODELS / sha256[:2] / f"{sha256}.onnx"


def resolve(settings: Settings, stored: str) -> Path:
    """A path as a row stores it: absolute, or relative to the storage folder."""
    return settings.storage / stored  # an absolute `stored` replaces the folder


def check_length(headers: Mapping[str, str], limit: int) -> None:
    """Refuse a body whose declared length is over the limit before reading any of it."""
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > limit + FRAMING_ALLOWANCE:
        raise _too_large(limit)


def _too_large(limit: int) -> UploadTooLarge:
    return UploadTooLarge(f"the upload is larger than this server's limit of {limit} bytes (TILEFARM_MAX_UPLOAD_BYTES)")


class _Writer:
    """Writes chunks to a new temporary file, hashing them, and raises as soon as more than `limit` bytes came."""

    def __init__(self, folder: Path, limit: int):
        self.path = folder / f"upload-{secrets.token_hex(8)}.part"
        self.file = self.path.open("xb")
        self.hash = hashlib.sha256()
        self.size, self.limit = 0, limit

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise _too_large(self.limit)
        # a synchronous write from the event loop: chunks are small (~64 KiB) and the disk is local
        try:
            self.file.write(data)
        except OSError as e:
            if is_full(e):  # the caller discards the file
                raise full(self.path) from None
            raise
        self.hash.update(data)

    def finish(self) -> StoredFile:
        try:
            self.file.close()  # flushes the last buffered bytes
        except OSError as e:
            self.discard()
            if is_full(e):
                raise full(self.path) from None
            raise
        return StoredFile(self.path, self.hash.hexdigest(), self.size)

    def discard(self) -> None:
        try:
            self.file.close()
        except OSError:  # the buffered rest could not be written (a full disk): it is being thrown away anyway
            pass
        self.path.unlink(missing_ok=True)


async def save_stream(settings: Settings, chunks: AsyncIterable[bytes], limit: int) -> StoredFile:
    """A raw request body into a temporary file; nothing is left behind if it fails or passes `limit`."""
    writer = _Writer(tmp_dir(settings), limit)
    try:
        async for chunk in chunks:
            writer.write(chunk)
    except BaseException:
        writer.discard()
        raise
    return writer.finish()


@dataclass
class _Multipart:
    """python-multipart callbacks: the part named `file_field` streams into a _Writer, other parts are fields."""

    folder: Path
    limit: int
    file_field: str
    fields: dict[str, str] = field(default_factory=dict)
    writer: _Writer | None = None
    filename: str | None = None
    ended: bool = False
    _header: list[bytes] = field(default_factory=lambda: [b"", b""])
    _headers: dict[bytes, bytes] = field(default_factory=dict)
    _name: str = ""
    _data: bytearray = field(default_factory=bytearray)
    _to_file: bool = False

    def callbacks(self) -> Any:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": lambda data, start, end: self._add_header(0, data[start:end]),
            "on_header_value": lambda data, start, end: self._add_header(1, data[start:end]),
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
            "on_end": self.on_end,
        }

    def _add_header(self, i: int, data: bytes) -> None:
        self._header[i] += data
        if len(self._header[i]) > FIELD_LIMIT:
            raise BadUpload("a multipart part header is too long")

    def on_part_begin(self) -> None:
        self._headers, self._data, self._to_file = {}, bytearray(), False

    def on_header_end(self) -> None:
        self._headers[self._header[0].lower()] = self._header[1]
        self._header = [b"", b""]

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        if b"name" not in options:
            raise BadUpload("a multipart part has no name in its Content-Disposition header")
        self._name = options[b"name"].decode("utf-8", "replace")
        if self._name == self.file_field:
            if self.writer is not None:
                raise BadUpload(f"send one {self.file_field!r} part, not several")
            filename = options.get(b"filename", b"").decode("utf-8", "replace")
            self.filename = filename or None
            self.writer, self._to_file = _Writer(self.folder, self.limit), True
        elif len(self.fields) >= MAX_FIELDS:
            raise BadUpload(f"too many form fields (at most {MAX_FIELDS})")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._to_file:
            assert self.writer is not None
            self.writer.write(data[start:end])
            return
        self._data += data[start:end]
        if len(self._data) > FIELD_LIMIT:
            raise BadUpload(f"form field {self._name!r} is longer than {FIELD_LIMIT} bytes")

    def on_part_end(self) -> None:
        if not self._to_file:
            try:
                self.fields[self._name] = self._data.decode()
            except UnicodeDecodeError:
                raise BadUpload(f"form field {self._name!r} is not UTF-8 text") from None

    def on_end(self) -> None:
        self.ended = True


async def receive_multipart(
    settings: Settings, content_type: str, chunks: AsyncIterable[bytes], limit: int, file_field: str = "file"
) -> Upload:
    """Stream a multipart/form-data body: the `file_field` part into a temporary file in the storage folder (at most
    `limit` bytes), the other parts as text fields. Nothing is left behind when it fails."""
    kind, options = parse_options_header(content_type)
    if kind != b"multipart/form-data" or b"boundary" not in options:
        raise BadUpload(f"send a multipart/form-data body with a {file_field!r} part (got {content_type or 'none'})")
    reader = _Multipart(tmp_dir(settings), limit, file_field)
    try:
        parser = MultipartParser(options[b"boundary"], reader.callbacks())
        async for chunk in chunks:
            parser.write(chunk)
        parser.finalize()
        if not reader.ended:
            raise BadUpload("the multipart body ended before its closing boundary")
        if reader.writer is None:
            raise BadUpload(f"the multipart body has no {file_field!r} part")
    except BaseException as e:
        if reader.writer is not None:
            reader.writer.discard()
        if isinstance(e, FormParserError):
            raise BadUpload(f"malformed multipart body: {e}") from None
        raise
    return Upload(reader.writer.finish(), reader.filename, reader.fields)


def keep(settings: Settings, stored: StoredFile) -> tuple[Path, bool]:
    """Move an upload to its content address; returns the path and whether this call created the file there
    (same bytes again: the file is there already and the upload is dropped)."""
    dest = model_path(settings, stored.sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        discard(stored)
        return dest, False
    os.replace(stored.path, dest)
    return dest, True


def keep_unpacked(settings: Settings, folder: Path, model: str, sha256: str) -> tuple[Path, bool]:
    """Move an unpacked archive (`folder`, holding the file `model` and its data files) to the content address of the
    archive's bytes; returns the model's path there and whether this call created it."""
    dest = settings.storage / MODELS / sha256[:2] / sha256
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(folder, dest)  # fails when dest is there: the same archive was kept before (or meanwhile)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(folder, ignore_errors=True)
        return dest / model, False
    return dest / model, True


def delete_model(settings: Settings, path: Path) -> None:
    """Delete a stored model: its file, or the folder an archive was unpacked into."""
    if path.parent.parent.parent == settings.storage / MODELS:  # models/<sha256[:2]>/<sha256>/<model>.onnx
        shutil.rmtree(path.parent, ignore_errors=True)
    else:
        delete(path)


def discard(stored: StoredFile) -> None:
    stored.path.unlink(missing_ok=True)


def delete(path: str | Path) -> None:
    Path(path).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- whole files
# A file appears under its final name only complete and on disk: written under a temporary name in the same folder,
# fsynced, renamed (atomic within a file system), the folder fsynced. A full disk (ENOSPC) or a crash leaves at most
# the temporary file, which nothing serves, and which is deleted on a failure we see.


class StorageFull(ApiError):
    """The storage folder's file system has no space left: what was being written is not kept."""

    status_code, code = 507, "storage_full"


def is_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def full(path: Path) -> StorageFull:
    return StorageFull(
        f"no space left in the storage folder for {path.name} ({path.parent}): free space there and "
        "try again; nothing was kept"
    )


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partial: Path, final: Path) -> None:
    """Give a fully written temporary file (in `final`'s folder) its final name, durably; the temporary file is
    deleted if that fails (a full disk raises StorageFull)."""
    try:
        with partial.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(partial, final)
        _fsync_folder(final.parent)
    except BaseException as e:
        partial.unlink(missing_ok=True)
        if is_full(e):
            raise full(final) from None
        raise


def write_whole(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that the file is never seen partly written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
    try:
        with partial.open("xb") as f:
            f.write(data)
    except BaseException as e:
        partial.unlink(missing_ok=True)
        if is_full(e):
            raise full(path) from None
        raise
    publish(partial, path)
