"""Reading a model's answer body with a byte cap (reference §9.4, case P3).

A provider (or a proxy in front of it) can send any amount: a runaway answer of
hundreds of megabytes, or a small gzip body that inflates a thousandfold. The
body is read chunk by chunk off the wire and decoded here, never by the HTTP
client (whose decoders inflate a whole chunk at once), so at most ``limit`` decoded bytes are
ever held, plus one network chunk (64 KiB). Past the cap :class:`BodyTooLarge` is
raised at once; the caller stops reading and closes the connection instead of
returning it to the pool.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

#: Default of ``MODEL_MAX_RESPONSE_BYTES`` (bytes): 8 MiB, some thousand times the
#: largest answer the prompts ask for (≈ 6,144 output tokens).
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024

#: ``Content-Encoding`` values decoded here (``gzip``/``deflate`` share zlib; the
#: header is detected). The provider is asked for ``identity``; the others are for
#: proxies that compress regardless.
DECODED_ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})

#: Most bytes one inflate step produces: the body and one step are all that is held.
INFLATE_STEP = 64 * 1024


class BodyTooLarge(Exception):
    """The body passed its cap; no more of it is read.

    Attributes:
        limit: the cap (bytes).
        announced: the ``Content-Length`` that was over the cap before any byte was
            read, or None when the cap was hit while reading.
    """

    def __init__(self, limit: int, announced: int | None = None) -> None:
        super().__init__(f"answer body over {limit} bytes")
        self.limit = limit
        self.announced = announced


class UnsupportedEncoding(Exception):
    """A ``Content-Encoding`` this reader cannot decode within its cap (e.g. ``br``)."""


class BoundedBody:
    """Collects one body's decoded bytes, refusing any byte past ``limit``.

    Args:
        limit: most decoded bytes kept (bytes, ≥ 1).
        content_encoding: the response's ``Content-Encoding`` header ("" when absent).

    Raises:
        UnsupportedEncoding: an encoding outside :data:`DECODED_ENCODINGS`, or a chain
            of several (``gzip, gzip``).
    """

    def __init__(self, limit: int, content_encoding: str = "") -> None:
        encoding = content_encoding.strip().lower()
        if encoding not in DECODED_ENCODINGS:
            raise UnsupportedEncoding(f"Content-Encoding {encoding[:40]!r} is not supported")
        self.limit = limit
        # the chunks as they came, joined once at the end: a growing buffer would be
        # copied as it grows, holding up to twice the cap for a moment
        self._chunks: list[bytes] = []
        self._size = 0
        self._inflate = (
            # 32 + MAX_WBITS: a gzip or a zlib header, detected
            zlib.decompressobj(32 + zlib.MAX_WBITS) if encoding not in ("", "identity") else None
        )

    def __len__(self) -> int:
        return self._size

    @property
    def compressed(self) -> bool:
        """Whether the body is inflated here (its wire length says nothing of its size)."""
        return self._inflate is not None

    def _keep(self, data: bytes) -> None:
        if self._size + len(data) > self.limit:
            raise BodyTooLarge(self.limit)
        if data:
            self._chunks.append(data)
            self._size += len(data)

    def feed(self, raw: bytes) -> None:
        """Add one chunk as read off the wire.

        Raises:
            BodyTooLarge: the decoded body would pass ``limit`` (nothing of it kept).
            zlib.error: a compressed body that does not inflate.
        """
        if self._inflate is None:
            self._keep(raw)
            return
        data = raw
        while data:
            # inflate in small steps, never past one byte over the room left
            step = min(INFLATE_STEP, self.limit - self._size + 1)
            self._keep(self._inflate.decompress(data, step))
            data = self._inflate.unconsumed_tail

    def finish(self) -> bytes:
        """The whole decoded body (call once, after the last chunk).

        Raises:
            BodyTooLarge: the decoder's last bytes pass ``limit``.
            zlib.error: a compressed body cut short or corrupt.
        """
        if self._inflate is not None:
            while not self._inflate.eof:
                out = self._inflate.flush(min(INFLATE_STEP, self.limit - self._size + 1))
                if not out:
                    break
                self._keep(out)
            if not self._inflate.eof:
                raise zlib.error("compressed body ends early")
        body = b"".join(self._chunks)
        self._chunks = [body]
        return body


async def read_bounded(
    chunks: AsyncIterator[bytes],
    *,
    limit: int,
    content_encoding: str = "",
    content_length: str | None = None,
) -> bytes:
    """Read a whole body of at most ``limit`` decoded bytes.

    Args:
        chunks: the raw body as it comes off the wire (``aiohttp``'s ``resp.content.iter_any()``
            on a session that does not decompress).
        limit: most decoded bytes accepted (bytes).
        content_encoding: the ``Content-Encoding`` header ("" when absent).
        content_length: the ``Content-Length`` header, if any: an identity body
            announcing more than ``limit`` is refused before a byte is read.

    Returns:
        The decoded body.

    Raises:
        BodyTooLarge: past ``limit``; reading stopped there.
        UnsupportedEncoding: see :class:`BoundedBody`.
        zlib.error: a compressed body that does not inflate.
    """
    body = BoundedBody(limit, content_encoding)
    if content_length and content_length.strip().isdigit() and not body.compressed:
        announced = int(content_length)
        if announced > limit:
            raise BodyTooLarge(limit, announced)
    async for chunk in chunks:
        body.feed(chunk)
    return body.finish()


__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "BodyTooLarge",
    "BoundedBody",
    "UnsupportedEncoding",
    "read_bounded",
]
