"""The head of an error body as the classifier reads it: decoded, and bounded.

httpx asks for compressed responses, so an upstream's error body may arrive
gzip-, deflate-, brotli- or zstd-encoded. The classifier must read what the
caller will read, so the head is decoded here — pure, no I/O — along the
``Content-Encoding`` chain, with every layer bounded to `limit` decoded bytes:
a small compressed head that would inflate to gigabytes costs no more than a
plain one. Only the classifier sees the decoded bytes; the caller's body is the
raw one, decoded by its own client as usual.

``br`` is decoded with the ``brotli`` package (1.2 or later, which can bound
its output) and ``zstd`` with ``zstandard``, when they are installed — the
packages httpx itself decodes them with. A head in an encoding that cannot be
decoded here, or that does not decode, is read as it came.
"""

from __future__ import annotations

import importlib
import io
import zlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Undecodable", "decoded_body", "decoded_head"]

# Layers of Content-Encoding undone at most; more is no honest upstream.
_MAX_LAYERS = 4


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:  # pragma: no cover - depends on the installed extras
        return None


_brotli = _optional("brotli")
_zstd = _optional("zstandard")


def decoded_head(chunks: Sequence[bytes], content_encoding: str | None, limit: int) -> bytes:
    """At most `limit` bytes of the decoded body whose first raw `chunks` were read.

    `content_encoding` is the response's ``Content-Encoding`` header (None if
    absent). The raw head is cut to `limit` bytes before decoding, and each
    decoded layer to `limit` bytes.

    >>> import gzip
    >>> decoded_head([gzip.compress(b"quota")], "gzip", 16)
    b'quota'
    """
    raw = b"".join(chunks)[:limit]
    codings = _codings(content_encoding)
    if codings is None:
        return raw
    data = raw
    for coding in reversed(codings):  # the last applied is the first undone
        decode = _DECODERS.get(coding)
        if decode is None:
            return raw
        try:
            data = decode(data, limit)[:limit]
        except Exception:  # corrupt or mislabelled: the client will say so; read it as it came
            return raw
    return data


def _codings(content_encoding: str | None) -> list[str] | None:
    """The layers of a ``Content-Encoding``, as applied; None past the layers undone here."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    return codings if len(codings) <= _MAX_LAYERS else None


class Undecodable(ValueError):
    """A whole body that does not decode along its ``Content-Encoding`` (corrupt or cut)."""


def decoded_body(body: bytes, content_encoding: str | None, limit: int) -> bytes | None:
    """The whole of `body` decoded along `content_encoding`, or None when it cannot be told.

    None when a layer is in an encoding not decodable here, or decodes to
    more than `limit` bytes (a bomb costs no more than `limit`); raises
    `Undecodable` when a layer is corrupt or ends before its own end (a body
    cut short that the connection ended cleanly).

    >>> import gzip
    >>> decoded_body(gzip.compress(b"{}"), "gzip", 16)
    b'{}'
    """
    if not content_encoding:
        return body
    codings = _codings(content_encoding)
    if codings is None:
        return None
    data = body
    for coding in reversed(codings):
        decode = _WHOLE.get(coding)
        if decode is None:
            return None
        try:
            decoded = decode(data, limit + 1)
        except Undecodable:
            raise
        except Exception as exc:
            raise Undecodable(f"the {coding} encoding does not decode") from exc
        if decoded is None or len(decoded) > limit:
            return None
        data = decoded
    return data


def _zlib_whole(wbits: int) -> Callable[[bytes, int], bytes | None]:
    def decode(data: bytes, limit: int) -> bytes | None:
        decompressor = zlib.decompressobj(wbits)
        out = decompressor.decompress(data, limit)
        if len(out) >= limit:
            return None
        if not decompressor.eof:
            raise Undecodable("the encoded body ends before its end")
        return out

    return decode


def _deflate_whole(data: bytes, limit: int) -> bytes | None:
    try:
        return _zlib_whole(zlib.MAX_WBITS)(data, limit)
    except zlib.error:
        return _zlib_whole(-zlib.MAX_WBITS)(data, limit)


def _br_whole(data: bytes, limit: int) -> bytes | None:
    decompressor = _brotli.Decompressor()
    out: bytes = decompressor.process(data, output_buffer_limit=limit)
    if len(out) >= limit:
        return None
    if not decompressor.is_finished():
        raise Undecodable("the br encoding ends before its end")
    return out


def _zstd_whole(data: bytes, limit: int) -> bytes | None:
    out = _zstd_decode(data, limit)
    return None if len(out) >= limit else out


def _gzip(data: bytes, limit: int) -> bytes:
    return zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(data, limit)


def _deflate(data: bytes, limit: int) -> bytes:
    # RFC 9110's deflate is zlib-wrapped; some servers send it raw (httpx accepts both).
    try:
        return zlib.decompressobj().decompress(data, limit)
    except zlib.error:
        return zlib.decompressobj(-zlib.MAX_WBITS).decompress(data, limit)


def _br(data: bytes, limit: int) -> bytes:
    out: bytes = _brotli.Decompressor().process(data, output_buffer_limit=limit)
    return out


def _zstd_decode(data: bytes, limit: int) -> bytes:
    reader = _zstd.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    out = b""
    try:
        while len(out) < limit:
            piece: bytes = reader.read(limit - len(out))
            if not piece:
                break
            out += piece
    except _zstd.ZstdError:
        if not out:  # the head ends mid-frame: what came before it still counts
            raise
    return out


def _brotli_bounded() -> bool:
    """brotli 1.2+ can stop its output at a limit; older versions (and brotlicffi) cannot."""
    if _brotli is None:
        return False
    try:
        _brotli.Decompressor().process(b"", output_buffer_limit=1)
    except TypeError:
        return False
    except Exception:  # noqa: S110  # an empty input may be an error; the keyword was accepted
        pass
    return True


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip,
    "x-gzip": _gzip,
    "deflate": _deflate,
}
if _brotli_bounded():
    _DECODERS["br"] = _br
if _zstd is not None:
    _DECODERS["zstd"] = _zstd_decode

_WHOLE: dict[str, Callable[[bytes, int], bytes | None]] = {
    "gzip": _zlib_whole(zlib.MAX_WBITS | 16),
    "x-gzip": _zlib_whole(zlib.MAX_WBITS | 16),
    "deflate": _deflate_whole,
}
if _brotli_bounded():
    _WHOLE["br"] = _br_whole
if _zstd is not None:
    _WHOLE["zstd"] = _zstd_whole
