"""Split a material (plain text or Markdown) into ordered blocks (reference §3.1, §5).

The document is parsed with ``markdown-it-py`` (CommonMark plus tables) and
cut along its own structure; every top-level construct becomes one block:

* heading → ``heading`` (the heading text, without ``#`` markers);
* paragraph, table, raw HTML → ``paragraph`` (the source text);
* bullet or ordered list → ``list`` (the list's source lines, dedented; a list
  larger than the block limit is cut between its top-level items);
* fenced or indented code → ``code`` (the code, without fences; cut between
  lines when too large);
* blockquote → ``quote`` (the quoted text without ``>`` markers).

Plain text without Markdown syntax is a sequence of paragraphs separated by
blank lines. Thematic breaks (``---``) produce no block. A document whose
structure yields no block at all (only thematic breaks, empty headings or link
definitions: ``---``, ``#``, ``[a]: b``) is kept as it is, one paragraph of its
text: any content that is not blank is a material (reference §3.1), as the API's
document states it (a pattern: not only whitespace).

No block is longer than :data:`MAX_BLOCK_CHARS` characters (code points, not
bytes). A longer paragraph or quote is cut at sentence boundaries — ``.``,
``!``, ``?``, ``;`` followed by whitespace, and the CJK full stops
``。！？；…`` anywhere, each with any closing quotes or brackets — and
sentences are packed greedily; a single sentence longer than the limit is cut
at the last whitespace before the limit, or at the limit itself (CJK text has
no spaces; Python strings index code points, so no character is ever split).

Content is at most :data:`MAX_CONTENT_BYTES` bytes of UTF-8 (1 MiB); more →
``PAYLOAD_TOO_LARGE``. Content that is empty or blank → ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Any, Final, Literal

from markdown_it import MarkdownIt

from airuntime_common.errors import AppError, ErrorCode, invalid_argument

BlockKind = Literal["heading", "paragraph", "list", "code", "quote"]

#: Largest block, in characters (code points).
MAX_BLOCK_CHARS: Final = 2000
#: Largest material content, in UTF-8 bytes (reference §3.1: ≤ 1 MiB).
MAX_CONTENT_BYTES: Final = 1024 * 1024

_SENTENCE_END = re.compile(
    r"""
    (?:
        [。！？；…]+ [”’」』）)\]"']*        # CJK terminators need no space after them
      | [.!?;]+ [”’」』）)\]"']* (?=\s)      # Latin terminators end a sentence before whitespace
    )
    \s*
    """,
    re.VERBOSE,
)
_QUOTE_MARK = re.compile(r"^[ ]{0,3}>[ ]?", re.MULTILINE)
_LIST_ITEM_START = re.compile(r"^(?:[-+*]|\d{1,9}[.)])(?:\s|$)")


@dataclass(frozen=True)
class SplitBlock:
    """One block of a split document.

    Attributes:
        kind: ``heading | paragraph | list | code | quote``.
        text: the block's text, stripped, 1..MAX_BLOCK_CHARS characters.
    """

    kind: BlockKind
    text: str


def _parser() -> MarkdownIt:
    """Block-level CommonMark + tables; inline parsing is skipped (only block text is kept)."""
    md = MarkdownIt("commonmark").enable("table")
    md.core.ruler.disable(["inline", "text_join"])
    return md


def check_content(content: str) -> None:
    """Refuse content over 1 MiB or with no text.

    Raises:
        AppError: ``PAYLOAD_TOO_LARGE`` above :data:`MAX_CONTENT_BYTES` UTF-8 bytes;
        ``INVALID_ARGUMENT`` when the content is empty or whitespace only.
    """
    size = len(content.encode("utf-8", errors="surrogatepass"))
    if size > MAX_CONTENT_BYTES:
        raise AppError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"content is {size} bytes; at most {MAX_CONTENT_BYTES} bytes are accepted",
            {"field": "content", "bytes": size, "maxBytes": MAX_CONTENT_BYTES},
        )
    if not content.strip():
        raise invalid_argument("content must not be empty", field="content")


def split_document(content: str, *, max_chars: int = MAX_BLOCK_CHARS) -> list[SplitBlock]:
    """Split plain text or Markdown into ordered blocks (see the module docstring).

    Args:
        content: the material's text, ≤ 1 MiB of UTF-8.
        max_chars: the largest block, in characters.

    Returns:
        The blocks in document order; never empty.

    Raises:
        AppError: ``PAYLOAD_TOO_LARGE`` / ``INVALID_ARGUMENT`` as :func:`check_content`.
    """
    check_content(content)
    text = content.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    lines = text.split("\n")
    tokens = _parser().parse(text)
    blocks: list[SplitBlock] = []

    def source(tok: Any) -> str:
        start, end = tok.map
        return "\n".join(lines[start:end])

    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.level != 0:
            i += 1
            continue
        kind = tok.type
        if kind == "heading_open":
            inline = tokens[i + 1]
            _emit(blocks, "heading", inline.content, max_chars)
            i = _skip_to_close(tokens, i)
        elif kind == "paragraph_open":
            inline = tokens[i + 1]
            _emit(blocks, "paragraph", inline.content, max_chars)
            i = _skip_to_close(tokens, i)
        elif kind in ("bullet_list_open", "ordered_list_open"):
            _emit_list(blocks, textwrap.dedent(source(tok)), max_chars)
            i = _skip_to_close(tokens, i)
        elif kind == "blockquote_open":
            quoted = _QUOTE_MARK.sub("", source(tok))
            _emit(blocks, "quote", quoted, max_chars)
            i = _skip_to_close(tokens, i)
        elif kind in ("fence", "code_block"):
            _emit_code(blocks, tok.content, max_chars)
            i += 1
        elif kind == "table_open":
            _emit(blocks, "paragraph", source(tok), max_chars)
            i = _skip_to_close(tokens, i)
        elif kind == "html_block":
            _emit(blocks, "paragraph", tok.content, max_chars)
            i += 1
        else:  # hr and anything unknown
            i += 1
    if not blocks:  # Markdown punctuation alone: the text as it is
        _emit(blocks, "paragraph", text, max_chars)
    if not blocks:
        raise invalid_argument("content has no text", field="content")
    return blocks


def _skip_to_close(tokens: list[Any], i: int) -> int:
    """Index after the token closing the container opened at ``tokens[i]``."""
    depth = 0
    for j in range(i, len(tokens)):
        depth += tokens[j].nesting
        if depth == 0:
            return j + 1
    return len(tokens)


def _emit(blocks: list[SplitBlock], kind: BlockKind, text: str, max_chars: int) -> None:
    for piece in split_long_text(text.strip(), max_chars):
        blocks.append(SplitBlock(kind, piece))


def _emit_code(blocks: list[SplitBlock], code: str, max_chars: int) -> None:
    code = code.rstrip("\n")
    if not code.strip():
        return
    for chunk in _pack(code.split("\n"), "\n", max_chars):
        if len(chunk) <= max_chars:
            blocks.append(SplitBlock("code", chunk))
        else:  # one line longer than a block
            for piece in _hard_split(chunk, max_chars):
                blocks.append(SplitBlock("code", piece))


def _emit_list(blocks: list[SplitBlock], source: str, max_chars: int) -> None:
    source = source.strip("\n")
    if len(source) <= max_chars:
        if source.strip():
            blocks.append(SplitBlock("list", source.strip()))
        return
    items: list[str] = []
    for line in source.split("\n"):
        if _LIST_ITEM_START.match(line) or not items:
            items.append(line)
        else:
            items[-1] += "\n" + line
    for chunk in _pack([it.rstrip() for it in items], "\n", max_chars):
        _emit(blocks, "list", chunk, max_chars)


def split_long_text(text: str, max_chars: int = MAX_BLOCK_CHARS) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_chars`` characters at sentence ends.

    Args:
        text: any text (Latin, CJK or mixed).
        max_chars: the largest piece, in characters.

    Returns:
        Stripped, non-empty pieces whose concatenation keeps every sentence in order.
    """
    text = text.strip()
    if not text:
        return []
    if len(text) <= max_chars:
        return [text]
    sentences: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        if m.end() > start:
            sentences.append(text[start : m.end()])
            start = m.end()
    if start < len(text):
        sentences.append(text[start:])
    pieces: list[str] = []
    current = ""
    for sentence in sentences:
        if len(current) + len(sentence) <= max_chars:
            current += sentence
            continue
        if current.strip():
            pieces.append(current.strip())
        current = ""
        if len(sentence) <= max_chars:
            current = sentence
        else:
            parts = _hard_split(sentence, max_chars)
            pieces.extend(p for p in parts[:-1] if p)
            current = parts[-1] if parts else ""
    if current.strip():
        pieces.append(current.strip())
    return pieces


def _hard_split(text: str, max_chars: int) -> list[str]:
    """Cut a sentence longer than ``max_chars`` at the last whitespace, else at the limit."""
    out: list[str] = []
    rest = text
    while len(rest) > max_chars:
        cut = rest.rfind(" ", max_chars // 2, max_chars + 1)
        if cut <= 0:
            cut = max_chars
        head, rest = rest[:cut].strip(), rest[cut:].lstrip()
        if head:
            out.append(head)
    if rest.strip():
        out.append(rest.strip())
    return out


def _pack(parts: list[str], sep: str, max_chars: int) -> list[str]:
    """Greedily join ``parts`` with ``sep`` into chunks of at most ``max_chars`` (a part
    longer than the limit stays a chunk of its own, for the caller to cut)."""
    chunks: list[str] = []
    current: str | None = None
    for part in parts:
        if current is None:
            current = part
        elif len(current) + len(sep) + len(part) <= max_chars:
            current += sep + part
        else:
            chunks.append(current)
            current = part
    if current is not None:
        chunks.append(current)
    return [c for c in chunks if c.strip()]
