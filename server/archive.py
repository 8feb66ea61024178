"""Model uploads with external data: an .onnx keeps big tensors in data files beside it (`location` in the model), so
such a model comes as an archive (.zip, .tar, .tar.gz) holding it and those files. The archive is checked (one .onnx,
member names that stay inside it, no links, every referenced file present, its unpacked size under the upload limit)
and unpacked into a folder of storage, where the model is read, as the workers later read it, with its data beside
it. A plain .onnx upload that references external data is refused naming the files."""

from __future__ import annotations

import re
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

import onnx

from compiler.base.errors import InvalidModel
from compiler.model import onnx_import
from server.schemas import Invalid
from server.storage import BadUpload, UploadTooLarge

CHUNK = 1 << 20
TAR_HEADER = 512  # counted for every tar member: a tar.gz of empty members still unpacks to its headers
IGNORED = re.compile(r"(^|/)(__MACOSX/|\._)")  # the resource forks macOS's archivers add beside each file
# members that make a zip a PyTorch file: torch.save's and TorchScript's pickle, a torch.export program's (.pt2) files
PYTORCH_MEMBERS = re.compile(r"(^|/)(data\.pkl|archive_format|models/model\.json)$")
PYTORCH_REFUSED = (
    "the service takes ONNX models only and never unpickles an upload: export the model to ONNX "
    "(torch.onnx.export), or compile the PyTorch file on your own machine (tilefarm compile model.pt2)"
)


class MissingExternalData(Invalid):
    code = "missing_external_data"


@dataclass(frozen=True)
class Unpacked:
    folder: Path  # a new folder holding `model` and the data files it names, at their locations relative to it
    model: str  # the .onnx's file name in `folder`
    member: str  # its name in the archive, for messages


def is_archive(path: Path) -> bool:
    """A zip or a tar (plain or gzip-compressed), by the first bytes: no ONNX file an exporter writes starts so."""
    with path.open("rb") as f:
        head = f.read(TAR_HEADER)
    return head.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x1f\x8b")) or head[257:262] == b"ustar"


def stem(filename: str) -> str:
    """An upload's file name without its folder and its .onnx or archive suffix: `resnet.tar.gz` -> `resnet`."""
    name = PurePosixPath(filename.replace("\\", "/")).name
    return PurePosixPath(re.sub(r"\.(zip|tar|tgz|tar\.gz)$", "", name, flags=re.IGNORECASE)).stem


# ---------------------------------------------------------------------------------------------- reading models


def external_files(proto: onnx.ModelProto) -> list[str]:
    """The `location` of every tensor the model keeps outside itself (the frontend's reading), each once."""
    return sorted(set(onnx_import.external_files(proto).values()))


def _parse(path: Path, name: str) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError, or the C++ parser's errors
        with path.open("rb") as f:
            pickled = f.read(1) == b"\x80"  # a pickle's PROTO opcode: torch.save's .pt/.pth of old
        if pickled:
            raise InvalidModel(f"{name} is a Python pickle (a PyTorch file?), not ONNX: {PYTORCH_REFUSED}") from None
        raise InvalidModel(f"{name} is not an ONNX model (protobuf parse failed: {type(e).__name__})") from None


def read_upload(path: Path, name: str) -> onnx.ModelProto:
    """A plain .onnx upload: refused (MissingExternalData) if it keeps tensors in files a single upload cannot carry."""
    proto = _parse(path, name)
    files = external_files(proto)
    if files:
        raise MissingExternalData(
            f"{name} keeps tensors in external data files that were not uploaded: {', '.join(files)}; upload a .zip, "
            ".tar or .tar.gz archive holding the model and those files"
        )
    return proto


def read_model(path: Path, name: str) -> onnx.ModelProto:
    """A stored or unpacked model with its external data read from beside it; errors call it `name`, not by the
    server's path."""
    proto = _parse(path, name)
    if external_files(proto):
        try:
            onnx.load_external_data_for_model(proto, str(path.parent))
        except Exception as e:
            detail = str(e).replace(str(path.parent), "").strip() or type(e).__name__
            raise InvalidModel(f"{name}: its external data cannot be read ({detail})") from None
    return proto


# ---------------------------------------------------------------------------------------------- archives


def _safe_name(raw: str) -> str:
    """The member's name made relative and '/'-separated; BadUpload if it is absolute or climbs out with '..'."""
    if "\\" in raw or "\x00" in raw or raw.startswith("/") or re.match(r"[A-Za-z]:", raw):
        raise BadUpload(f"the archive member {raw!r} has an absolute or non-portable path")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadUpload(f"the archive member {raw!r} climbs out of the archive with '..'")
    return "/".join(parts)


def _too_large(limit: int) -> UploadTooLarge:
    return UploadTooLarge(
        f"the archive unpacks to more than this server's limit of {limit} bytes (TILEFARM_MAX_UPLOAD_BYTES)"
    )


class _Archive:
    """The regular files of a zip or tar archive by normalized name; refuses links, devices, unsafe names and more
    than `limit` bytes, as declared and then as unpacked (declared sizes may lie)."""

    def __init__(self, path: Path, limit: int):
        self.limit = self.left = limit
        self.members: set[str] = set()  # normalized names (relative, '/'-separated) of the regular files
        self._zip: zipfile.ZipFile | None = None
        self._tar: tarfile.TarFile | None = None
        try:
            if zipfile.is_zipfile(path):
                self._zip = zipfile.ZipFile(path)
                self._list_zip(self._zip)
            else:
                self._tar = tarfile.open(path, "r:*")
                self._list_tar(self._tar)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
            self.close()
            raise BadUpload(f"the archive cannot be read ({type(e).__name__}: {e})") from None
        except BaseException:
            self.close()
            raise

    def _add(self, raw: str, size: int, total: int) -> int:
        name = _safe_name(raw)
        if name in self.members:
            raise BadUpload(f"the archive lists {name!r} twice")
        if not IGNORED.search(name):
            self.members.add(name)
        if total + size > self.limit:
            raise _too_large(self.limit)
        return total + size

    def _list_zip(self, z: zipfile.ZipFile) -> None:
        total = 0
        for info in z.infolist():
            mode = info.external_attr >> 16  # unix mode bits, when a unix archiver wrote them
            if stat.S_ISLNK(mode) or (stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))):
                raise BadUpload(f"the archive member {info.filename!r} is a link or a special file")
            if info.is_dir():
                _safe_name(info.filename)
            else:
                total = self._add(info.filename, info.file_size, total)

    def _list_tar(self, t: tarfile.TarFile) -> None:
        total = 0
        for info in t:  # one header at a time: a bomb stops at the limit instead of being unpacked to be measured
            if info.isdir():
                _safe_name(info.name)
                total += TAR_HEADER
            elif info.isreg():
                total = self._add(info.name, info.size, total + TAR_HEADER)
            else:
                raise BadUpload(f"the archive member {info.name!r} is a link or a special file")

    @contextmanager
    def _open(self, name: str) -> Iterator[IO[bytes]]:
        if self._zip is not None:
            with self._zip.open(next(i for i in self._zip.infolist() if _safe_name(i.filename) == name)) as f:
                yield f
            return
        assert self._tar is not None
        info = next(i for i in self._tar.getmembers() if i.isreg() and _safe_name(i.name) == name)
        data = self._tar.extractfile(info)
        assert data is not None  # a regular file
        with data:
            yield data

    def extract(self, name: str, dest: Path) -> None:
        """Copy member `name` to the new file `dest`, its bytes counted against the limit."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._open(name) as src, dest.open("xb") as out:
            while chunk := src.read(CHUNK):
                self.left -= len(chunk)
                if self.left < 0:
                    raise _too_large(self.limit)
                out.write(chunk)

    def close(self) -> None:
        for f in (self._zip, self._tar):
            if f is not None:
                f.close()


def unpack(path: Path, folder: Path, limit: int) -> Unpacked:
    """Check the archive at `path` and unpack its model and the data files it references into the new `folder` (the
    model at its top, each data file at its location relative to the model); nothing is left in `folder` on error."""
    archive = _Archive(path, limit)
    try:
        models = sorted(n for n in archive.members if n.lower().endswith(".onnx"))
        if not models:
            if any(PYTORCH_MEMBERS.search(n) for n in archive.members):
                raise BadUpload(f"the upload is a PyTorch file (.pt2, .pt, .pth), not an ONNX model: {PYTORCH_REFUSED}")
            listing = ", ".join(sorted(archive.members)[:20]) or "nothing"
            raise BadUpload(f"the archive holds no .onnx model (it holds {listing})")
        if len(models) > 1:
            raise BadUpload(f"the archive holds several .onnx models ({', '.join(models)}); upload one per archive")
        member = models[0]
        model_dir = PurePosixPath(member).parent
        folder.mkdir(parents=True)
        model = PurePosixPath(member).name
        archive.extract(member, folder / model)
        proto = _parse(folder / model, member)
        # location -> its member name: locations are relative to the model's folder
        wanted = {rel: str(model_dir / rel) for rel in (_location(loc, member) for loc in external_files(proto))}
        if model in wanted:
            raise BadUpload(f"{member} names itself as its external data file")
        missing = [name for name in wanted.values() if name not in archive.members]
        if missing:
            raise MissingExternalData(
                f"{member} keeps tensors in external data files missing from the archive: {', '.join(missing)}"
            )
        for rel, name in wanted.items():
            archive.extract(name, folder / rel)
        return Unpacked(folder, model, member)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        archive.close()


def _location(location: str, member: str) -> str:
    """An external data `location`, normalized; BadUpload if it would read outside the model's folder."""
    parts = [p for p in location.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or location.startswith(("/", "\\")) or ".." in parts or re.match(r"[A-Za-z]:", location):
        raise BadUpload(f"{member} names the external data file {location!r}, which is outside the model's folder")
    return "/".join(parts)
