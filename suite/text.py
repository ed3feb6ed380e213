"""Text from data (file names, captions, reasons quoting them) shown on a terminal or written to a log: its control
characters are made visible, so a file named ``\\x1b]0;title\\x07`` or ``\\x1b[2J`` cannot retitle a window, clear
a screen or forge a line. One rule, used by every terminal and log sink of the suite."""

from __future__ import annotations

import re

#: C0 controls but tab, DEL, C1 controls, the bidirectional overrides that reorder what a reader sees, and lone
#: surrogates (a file name's undecodable byte, as Python reads a path that is not UTF-8: it cannot be written as UTF-8).
_INVISIBLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_INVISIBLE_BUT_NEWLINE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def utf8_text(text: str) -> str:
    """``text`` as it can be written in UTF-8: a lone surrogate (the undecodable byte of a path that is not UTF-8,
    ``\\udcff``) written as its escape, everything else as it is. For every sink that must be UTF-8 (MLflow, a
    report, an exported table)."""
    return _SURROGATE.sub(_escape, text)


def visible(text: object, keep_newlines: bool = False) -> str:
    """``text`` with every control character written as its escape (``\\x1b``, ``\\n``, ``\\u202e``); newlines kept
    with ``keep_newlines`` (a traceback, a multi-line block of the suite's own)."""
    pattern = _INVISIBLE_BUT_NEWLINE if keep_newlines else _INVISIBLE
    return pattern.sub(_escape, str(text))


#: Characters Markdown or the HTML inside it give meaning to: backslash-escaped (HTML's as entities).
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]{}|~#!])")
_HTML_SPECIAL = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def markdown_literal(text: object) -> str:
    """``text`` as literal Markdown text: nothing in it can become markup, a link, an image or HTML (a file named
    ``<img src=x onerror=...>`` is shown as its name), on one line, its control characters made visible."""
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\1", visible(text))
    return "".join(_HTML_SPECIAL.get(char, char) for char in escaped)


def markdown_fence(code: str) -> str:
    """A fence for a Markdown code block holding ``code``: longer than any run of backticks in it, so that the
    code cannot close the block."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    return "`" * max(3, longest + 1)


def html_text(text: object, keep_newlines: bool = False) -> str:
    """``text`` as HTML text or an attribute value: control characters and bidirectional overrides made visible
    (a raw ESC or U+202E would reach the reader's browser: U+202E reverses the line), then ``&<>"'`` escaped."""
    import html

    return html.escape(visible(text, keep_newlines=keep_newlines))


def plot_text(text: object) -> str:
    """``text`` as literal matplotlib text (a legend, a title): ``$`` would start mathtext (a folder named
    ``a$x^{2$`` stops the figure with a parse error), so it is escaped; control characters made visible."""
    return visible(text).replace("$", r"\$")
