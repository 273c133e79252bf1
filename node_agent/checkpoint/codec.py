"""Payload codecs, compression and record checksums.

Payloads are bytes. ``JsonCodec`` turns JSON-shaped state into canonical bytes
(sorted keys, compact) so equal states give equal bytes. Compression is zstd,
applied per record when it pays. Every stored record carries a CRC-32C over its
identifying fields and its stored bytes — the same defence against torn or
rotten records as LevelDB's and etcd's WAL record checksums, and the same
polynomial: CRC-32C (Castagnoli), computed in hardware by ``google-crc32c``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import google_crc32c
import zstandard

from lazarus.storage.errors import InvalidArgument

ENCODING_RAW = 0
ENCODING_ZSTD = 1

_local = threading.local()


class JsonCodec:
    """Encode JSON-shaped state as canonical UTF-8 bytes and back.

    Example:
        >>> JsonCodec.decode(JsonCodec.encode({"b": 1, "a": [1, 2]}))
        {'a': [1, 2], 'b': 1}
    """

    @staticmethod
    def encode(value: Any) -> bytes:
        """Return ``value`` as canonical JSON bytes.

        Raises:
            InvalidArgument: ``value`` is not JSON-serialisable, or holds NaN or
                infinity (field ``state``; INVALID_ARGUMENT).
        """
        try:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument("state", f"is not JSON-serialisable: {exc}") from exc
        return text.encode("utf-8")

    @staticmethod
    def decode(data: bytes) -> Any:
        """Return the value encoded in ``data``.

        Raises:
            InvalidArgument: ``data`` is not UTF-8 JSON (field ``payload``).
        """
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidArgument("payload", f"is not JSON: {exc}") from exc


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "compressor", None)
    if c is None:
        c = _local.compressor = zstandard.ZstdCompressor(level=3, write_content_size=True)
    return c


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d


def encode_payload(payload: bytes, compress: bool, min_bytes: int) -> tuple[int, bytes]:
    """Return ``(encoding, stored_bytes)`` for ``payload``.

    zstd is used when ``compress`` is set, the payload has at least
    ``min_bytes`` bytes, and compressing actually shrinks it.
    """
    if compress and len(payload) >= min_bytes:
        packed = _compressor().compress(payload)
        if len(packed) < len(payload):
            return ENCODING_ZSTD, packed
    return ENCODING_RAW, payload


def decode_payload(encoding: int, stored: bytes) -> bytes:
    """Return the payload from its stored form.

    Raises:
        ValueError: unknown encoding or undecodable bytes (the caller reports the
            record as corrupted).
    """
    if encoding == ENCODING_RAW:
        return stored
    if encoding == ENCODING_ZSTD:
        try:
            return _decompressor().decompress(stored)
        except zstandard.ZstdError as exc:
            raise ValueError(f"zstd: {exc}") from exc
    raise ValueError(f"unknown payload encoding {encoding}")


def record_checksum(header: tuple[object, ...], stored: bytes) -> int:
    """CRC-32C over a record's identifying fields and its stored payload bytes.

    Args:
        header: the record's fields in a fixed order (str / int / bool values).
        stored: the payload as stored (after compression).

    Returns:
        An unsigned 32-bit checksum.
    """
    head = "\x1f".join(str(int(v)) if isinstance(v, bool) else str(v) for v in header)
    crc = google_crc32c.value(head.encode("utf-8", "surrogatepass"))
    return int(google_crc32c.extend(crc, stored))
