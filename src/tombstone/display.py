"""Text as a terminal shows it: control and bidirectional characters escaped.

Subjects, store names, artifact ids and error messages can come from anyone (a data subject's own
name, a record an application stored, a receipt an auditor was handed). Printed raw, an ESC sequence can
rewrite what the terminal shows (clear a line, fake an ``OK``), and a right-to-left override can make
``user-1‮txt.exe`` read as something else. Everything the CLI prints goes through :func:`printable`, which
writes such characters as ``\\uXXXX`` escapes: readable, and inside a JSON string the same character still.
"""

from __future__ import annotations

import re
import unicodedata

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""The bidirectional formatting characters (marks, embeddings, overrides, isolates)."""
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "\u2028\u2029\ud800-\udfff]")
"""C0 controls but tab and newline, DEL, C1 controls, bidi formatting, line/paragraph separators, lone
surrogates."""


def printable(text: str) -> str:
    """``text`` with every character that could change how a terminal shows the rest escaped as ``\\uXXXX``
    (tab and newline kept)."""
    if not isinstance(text, str):
        text = str(text)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def normal_subject(subject: str) -> str:
    """A subject reference as it is keyed: Unicode NFC, so that two spellings of one name (``é`` as one code
    point, or ``e`` and a combining accent) are one subject. ValueError for a string that is not Unicode
    (a lone surrogate)."""
    try:
        subject.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("a subject reference must be valid Unicode (it holds a lone UTF-16 surrogate)") from exc
    return unicodedata.normalize("NFC", subject)


__all__ = ["normal_subject", "printable"]
