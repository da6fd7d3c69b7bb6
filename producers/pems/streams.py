"""Bytes of a file, told by content: the compression sniffed (gzip, bz2, xz, zip with one
member, or plain), a gzip file inflated piece by piece (checked as ``gzip.decompress``
checks it), the pieces cut into chunks of whole lines, and a read-ahead thread that
decompresses the next chunk while the previous one is parsed.

A compressed file that cannot be read is a one-line ``ValueError`` naming the file and the
format, never a traceback.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import queue
import threading
import zipfile
import zlib
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar


def _sniff(head: bytes) -> str:
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:3] == b"BZh":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:4] == b"PK\x03\x04":
        return "zip"
    return "plain"


def read_bytes(path: str | Path) -> bytes:
    """The (decompressed) bytes of a file, the compression told by content: gzip (1f8b),
    bz2 (``BZh``), xz (fd377a585a00), zip (``PK\\x03\\x04``, exactly one data member) or plain.

    A compressed file that cannot be read raises a one-line ``ValueError`` naming the file
    and the format.
    """
    p = Path(path)
    with p.open("rb") as fh:
        head = fh.read(6)
    fmt = _sniff(head)
    if fmt == "plain":
        return p.read_bytes()
    try:
        if fmt == "gzip":
            return gzip.decompress(p.read_bytes())
        if fmt == "bz2":
            return bz2.decompress(p.read_bytes())
        if fmt == "xz":
            return lzma.decompress(p.read_bytes())
        with zipfile.ZipFile(p) as zf:
            members = [i for i in zf.infolist() if not i.is_dir()]
            if len(members) != 1:
                names = ", ".join(i.filename for i in members[:5]) or "none"
                raise ValueError(f"{p}: a zip file must hold exactly one data member, it holds "
                                 f"{len(members)} ({names})")
            return zf.read(members[0])
    except ValueError as exc:
        if str(exc).startswith(str(p)):
            raise
        raise ValueError(_one_line(f"{p}: unreadable {fmt} file ({type(exc).__name__}: {exc})")) from None
    except (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, NotImplementedError,
            RuntimeError) as exc:
        raise ValueError(_one_line(f"{p}: unreadable {fmt} file ({type(exc).__name__}: {exc})")) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def text_io(path: str | Path) -> io.StringIO:
    return io.StringIO(read_bytes(path).decode("utf-8", errors="replace"), newline="")


CHUNK_BYTES = 1 << 21  # decompressed bytes per parsed chunk (rounded down to whole lines)
READ_BYTES = 1 << 18  # bytes per read from the file
PAD = bytes(32)  # zero bytes after each chunk: fixed-width reads at a field stay inside the buffer
_GZIP_EOF = "Compressed file ended before the end-of-stream marker was reached"


def pieces(path: str | Path) -> Iterator[bytes]:
    """The decompressed bytes of a file in pieces of at most :data:`CHUNK_BYTES`, exactly
    what :func:`read_bytes` returns, with its errors. Plain and gzip files are streamed; bz2,
    xz and zip come from :func:`read_bytes` in one go."""
    p = Path(path)
    with p.open("rb") as fh:
        fmt = _sniff(fh.read(6))
        fh.seek(0)
        if fmt == "plain":
            while piece := fh.read(CHUNK_BYTES):
                yield piece
            return
        if fmt == "gzip":
            try:
                yield from _gunzip(fh)
            except (OSError, EOFError, zlib.error) as exc:
                raise ValueError(_one_line(f"{p}: unreadable gzip file ({type(exc).__name__}: {exc})")) from None
            return
    yield read_bytes(p)


def _gzip_header_size(buf: bytes, final: bool) -> int | None:
    """Length of the gzip member header at the start of ``buf`` (checked as ``gzip.decompress``
    checks it); None when ``buf`` may end inside the header and more input follows."""
    if len(buf) < 2 and not final:
        return None
    if buf[:2] != b"\x1f\x8b":
        raise gzip.BadGzipFile(f"Not a gzipped file ({buf[:2]!r})")
    size: int | None = 10
    if len(buf) >= 10:
        if buf[2] != 8:
            raise gzip.BadGzipFile("Unknown compression method")
        flag = buf[3]
        if flag & gzip.FEXTRA:
            size = 12 + int.from_bytes(buf[10:12], "little") if len(buf) >= 12 else None
        for bit in (gzip.FNAME, gzip.FCOMMENT):
            if size is not None and flag & bit:
                end = buf.find(b"\x00", size)
                size = end + 1 if end >= 0 else None
        if size is not None and flag & gzip.FHCRC:
            size += 2
    if size is not None and size <= len(buf):
        return size
    if final:
        raise EOFError(_GZIP_EOF)
    return None


def _gunzip(fh: BinaryIO) -> Iterator[bytes]:
    """The members of a gzip file one after the other, checked like ``gzip.decompress``
    (header, CRC32 and length of every member, only zero padding between members), in
    pieces of at most :data:`CHUNK_BYTES`. zlib releases the GIL while it inflates."""
    buf = fh.read(READ_BYTES)
    member = 0
    while True:
        if member:  # after a member: zero padding, then the end of the file or another member
            buf = buf.lstrip(b"\x00")
            while not buf:
                more = fh.read(READ_BYTES)
                if not more:
                    return
                buf = more.lstrip(b"\x00")
        while (size := _gzip_header_size(buf, final=False)) is None:
            more = fh.read(READ_BYTES)
            if not more:
                _gzip_header_size(buf, final=True)  # raises
            buf += more
        member += 1
        buf = buf[size:]
        inflate = zlib.decompressobj(wbits=-zlib.MAX_WBITS)
        crc = length = 0
        full = False
        while not inflate.eof:
            if not buf and not full:  # (a full piece may leave output pending without input)
                buf = fh.read(READ_BYTES)
                if not buf:
                    raise EOFError(_GZIP_EOF)
            out = inflate.decompress(buf, CHUNK_BYTES)
            buf = inflate.unconsumed_tail
            full = len(out) == CHUNK_BYTES
            if out:
                crc = zlib.crc32(out, crc)
                length += len(out)
                yield out
        buf = inflate.unused_data
        while len(buf) < 8:
            more = fh.read(READ_BYTES)
            if not more:
                raise EOFError(_GZIP_EOF)
            buf += more
        if int.from_bytes(buf[:4], "little") != crc:
            raise gzip.BadGzipFile("CRC check failed")
        if int.from_bytes(buf[4:8], "little") != length & 0xFFFFFFFF:
            raise gzip.BadGzipFile("Incorrect length of data produced")
        buf = buf[8:]


Chunk = tuple[bytes, int, int]  # (buffer, start, stop): whole lines, at least len(PAD) bytes after stop


def line_chunks(pieces: Iterable[bytes]) -> Iterator[Chunk]:
    """Whole lines of the pieces, in file order: ``buffer[start:stop]`` ends with ``\n`` and
    at least :data:`PAD` bytes follow it in ``buffer`` (reads of a fixed width past a field
    stay inside). The lines of a piece are a view of it, not copied; the lines that straddle
    two pieces (or close the file) are joined into a small chunk of their own, and a last
    line without ``\n`` gets one. ``\r\n`` line ends become ``\n`` (the row logic never saw
    that ``\r`` either)."""
    carry: list[memoryview] = []  # the start of a line that the next piece ends
    for piece in pieces:
        if b"\r" in piece:
            piece = piece.replace(b"\r\n", b"\n")
        view = memoryview(piece)
        for a in range(0, len(piece), CHUNK_BYTES):  # (a piece of bz2 / xz / zip is the whole file)
            b = min(a + CHUNK_BYTES, len(piece))
            first = piece.find(b"\n", a, b) + 1
            if first == 0:  # no line ends here: a longer line
                carry.append(view[a:b])
                continue
            if carry:
                yield _joined([*carry, view[a:first]])
                carry, a = [], first
            stop = max(a, piece.rfind(b"\n", a, min(b, max(0, len(piece) - len(PAD)))) + 1)
            if stop > a:
                yield piece, a, stop
            carry = [view[stop:b]]
    tail = b"".join(carry)
    if tail:
        yield _joined([memoryview(tail if tail.endswith(b"\n") else tail + b"\n")])


def _joined(parts: list[memoryview]) -> Chunk:
    chunk = b"".join([*parts, memoryview(PAD)])
    if b"\r" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n")
    return chunk, 0, len(chunk) - len(PAD)


_T = TypeVar("_T")


def ahead(items: Iterator[_T], depth: int = 3) -> Generator[_T, None, None]:
    """``items``, produced in a background thread up to ``depth`` ahead of the consumer: the
    file is read and decompressed (zlib, bz2 and lzma release the GIL) while the previous
    chunk is parsed. An exception in the thread is raised here; closing stops the thread."""
    box: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: int, value: Any) -> bool:
        while not stop.is_set():
            try:
                box.put((kind, value), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put(0, item):
                    return
            put(1, None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the consumer, raised there
            put(2, exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=run, name="pems-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = box.get()
            if kind == 1:
                return
            if kind == 2:
                raise value
            yield value
    finally:
        stop.set()
        worker.join()
