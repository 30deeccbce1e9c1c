"""Protocol buffers' text format, as Caffe's .prototxt files are written, read into a tree that
keeps where each field stands (file, line, column), so that whatever the importer cannot express
is reported at its place in the file.

A message is a list of ``Field``s in file order; ``Message.get``/``all`` read them by name. Values
are a ``Message`` (``name { ... }`` or ``name: { ... }``), a string (quoted, with C escapes, and
adjacent quoted strings joined), a number (int or float, as written), or an identifier (an enum
value, or true/false). ``name: [a, b]`` is the list form of a repeated field, one Field each.
The file is bounded in size by the caller; nesting, and the number of fields where the caller
gives a bound, are bounded here, so that parsing stops at the first field past the bound.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from ...errors import Location, Problem, SpecError

MAX_DEPTH = 64
MAX_INT_DIGITS = 20              # 2**64 has 20 digits (and 16 hex digits fit)

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|0[xX][0-9a-fA-F]+|\d+)[fF]?
               |[-+]?(?:inf|infinity|nan)\b)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[{}<>\[\]:,;])
""", re.X | re.I)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f",
            "v": "\v", "?": "?"}


class Ident(str):
    """An unquoted word: an enum value, true or false."""


@dataclass
class Field:
    name: str
    value: Any                   # Message, str, Ident, int or float
    loc: Location


@dataclass
class Message:
    fields: list[Field] = field(default_factory=list)
    loc: Location | None = None

    def all(self, name: str) -> list[Field]:
        return [f for f in self.fields if f.name == name]

    def get(self, name: str) -> Field | None:
        """The last field of that name (protobuf: the last value of a singular field wins)."""
        found = self.all(name)
        return found[-1] if found else None

    def value(self, name: str, default=None):
        f = self.get(name)
        return default if f is None else f.value

    def values(self, name: str) -> list:
        return [f.value for f in self.all(name)]


@dataclass
class _Token:
    kind: str
    text: str
    loc: Location


def _tokens(text: str, file: str) -> Iterator[_Token]:
    line, line_start, pos = 1, 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SpecError(Problem(f"unexpected character {text[pos]!r}", Location(file, line, pos - line_start + 1)))
        kind = m.lastgroup
        if kind != "space":
            yield _Token(kind, m.group(), Location(file, line, pos - line_start + 1))
        newlines = m.group().count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + m.group().rindex("\n") + 1
        pos = m.end()
    yield _Token("end", "", Location(file, line, pos - line_start + 1))


def _unquote(token: _Token) -> str:
    body, out, i = token.text[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1:]).group()
            out.append(chr(int(digits, 8)))
            i += 1 + len(digits)
        elif nxt in "xX":
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2:])
            if digits is None:
                raise SpecError(Problem("a \\x escape without hex digits", token.loc))
            out.append(chr(int(digits.group(), 16)))
            i += 2 + len(digits.group())
        else:
            raise SpecError(Problem(f"unknown escape \\{nxt} in a string", token.loc))
    return "".join(out)


def _number(token: _Token):
    text, low = token.text, token.text.lower().lstrip("+-")
    if low in ("inf", "infinity", "nan"):
        return float(text)                     # (their f is no float suffix)
    if not low.startswith("0x"):
        text = text.rstrip("fF")
    digits = len(text.lstrip("+-")) - (2 if low.startswith("0x") else 0)
    if re.fullmatch(r"[-+]?(0[xX][0-9a-fA-F]+|\d+)", text) and digits > MAX_INT_DIGITS:
        # no protobuf field holds it (64 bits at most), and Python would refuse to convert it
        raise SpecError(Problem(f"an integer of {digits:,} digits: no field holds more than 64 bits", token.loc))
    if low.startswith("0x"):
        return int(text, 16)
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    return float(text)


class _Parser:
    def __init__(self, text: str, file: str, max_fields: int | None = None):
        self.tokens = _tokens(text, file)
        self.file = file
        self.token = next(self.tokens)
        self.max_fields = max_fields
        self.fields = 0

    def count(self, loc: Location) -> None:
        self.fields += 1
        if self.max_fields is not None and self.fields > self.max_fields:
            raise SpecError(Problem(f"more than {self.max_fields:,} fields: larger than any net this reads", loc))

    def advance(self) -> _Token:
        token, self.token = self.token, next(self.tokens)
        return token

    def expect(self, text: str) -> _Token:
        if self.token.text != text:
            shown = self.token.text or "the end of the file"
            raise SpecError(Problem(f"expected '{text}', found {shown!r}", self.token.loc))
        return self.advance()

    def message(self, close: str | None, depth: int, loc: Location) -> Message:
        if depth > MAX_DEPTH:
            raise SpecError(Problem(f"messages nested more than {MAX_DEPTH} deep", loc))
        msg = Message(loc=loc)
        while True:
            token = self.token
            if close is None and token.kind == "end":
                return msg
            if close is not None and token.text == close:
                self.advance()
                return msg
            if token.kind == "end":
                raise SpecError(Problem(f"'{close}' expected before the end of the file (opened here)", loc))
            if token.kind != "ident":
                raise SpecError(Problem(f"expected a field name, found {token.text!r}", token.loc))
            name = self.advance().text
            self.count(token.loc)
            colon = self.token.text == ":"
            if colon:
                self.advance()
            if self.token.text in ("{", "<"):
                opener = self.advance()
                msg.fields.append(Field(name, self.message("}" if opener.text == "{" else ">", depth + 1,
                                                           token.loc), token.loc))
            elif not colon:
                raise SpecError(Problem(f"expected ':' or '{{' after '{name}'", self.token.loc))
            elif self.token.text == "[":
                self.advance()
                while self.token.text != "]":
                    self.count(self.token.loc)
                    msg.fields.append(Field(name, self.scalar_or_message(depth), token.loc))
                    if self.token.text == ",":
                        self.advance()
                    elif self.token.text != "]":
                        raise SpecError(Problem(f"expected ',' or ']', found {self.token.text!r}", self.token.loc))
                self.advance()
            else:
                msg.fields.append(Field(name, self.scalar(), token.loc))
            if self.token.text in (",", ";"):
                self.advance()

    def scalar_or_message(self, depth: int):
        if self.token.text in ("{", "<"):
            opener = self.advance()
            return self.message("}" if opener.text == "{" else ">", depth + 1, opener.loc)
        return self.scalar()

    def scalar(self):
        token = self.token
        if token.kind == "string":
            parts = []
            while self.token.kind == "string":
                parts.append(_unquote(self.advance()))
            return "".join(parts)
        if token.kind == "number":
            self.advance()
            return _number(token)
        if token.kind == "ident":
            self.advance()
            return Ident(token.text)
        raise SpecError(Problem(f"expected a value, found {token.text or 'the end of the file'!r}", token.loc))


def parse(text: str, file: str, max_fields: int | None = None) -> Message:
    """The whole file as one message (SpecError at the first syntax error, with its place);
    more than ``max_fields`` fields in all is a SpecError at the first one past the bound."""
    return _Parser(text, file, max_fields).message(None, 0, Location(file, 1, 1))
