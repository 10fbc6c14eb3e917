"""Thrift's compact protocol, read into plain values and written back: what
the Parquet attacks need to rewrite a footer or a page header with figures
pyarrow would never write (a row group claiming 2^22 rows, a page claiming
2·10^9 bytes), however many bytes the new varints take.

A struct is a list of ``[field id, type, value]`` in the order read, so a
struct written back unchanged is the bytes read; a list is ``(element
type, [values])``. Only what Parquet's metadata uses is read: no maps of
structs keyed by structs, no sets of doubles (both read as the others).
"""

from __future__ import annotations

import struct
from typing import Any

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)

Struct = list[list[Any]]


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _write_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        if value < 0x80:
            out.append(value)
            return bytes(out)
        out.append(value & 0x7F | 0x80)
        value >>= 7


def _write_int(value: int) -> bytes:
    return _write_varint((value << 1) ^ (value >> 63))


def _read_value(buf: bytes, at: int, kind: int) -> tuple[Any, int]:
    if kind in (TRUE, FALSE):
        return kind == TRUE, at
    if kind == BYTE:
        return buf[at], at + 1
    if kind in (I16, I32, I64):
        raw, at = _varint(buf, at)
        return _zigzag(raw), at
    if kind == DOUBLE:
        return struct.unpack_from("<d", buf, at)[0], at + 8
    if kind == BINARY:
        length, at = _varint(buf, at)
        return bytes(buf[at : at + length]), at + length
    if kind in (LIST, SET):
        header = buf[at]
        at += 1
        count, element = header >> 4, header & 0x0F
        if count == 15:
            count, at = _varint(buf, at)
        values = []
        for _ in range(count):
            if element in (TRUE, FALSE):
                # A list's booleans are a byte each, 1 for true.
                values.append(buf[at] == TRUE)
                at += 1
            else:
                value, at = _read_value(buf, at, element)
                values.append(value)
        return (element, values), at
    if kind == MAP:
        count, at = _varint(buf, at)
        if count == 0:
            return (0, 0, []), at
        key_kind, value_kind = buf[at] >> 4, buf[at] & 0x0F
        at += 1
        pairs = []
        for _ in range(count):
            key, at = _read_value(buf, at, key_kind)
            value, at = _read_value(buf, at, value_kind)
            pairs.append((key, value))
        return (key_kind, value_kind, pairs), at
    if kind == STRUCT:
        return read_struct(buf, at)
    raise ValueError(f"compact type {kind} at byte {at}")


def read_struct(buf: bytes, at: int = 0) -> tuple[Struct, int]:
    """The struct starting at ``at``, and the offset just past it."""
    fields: Struct = []
    last = 0
    while True:
        header = buf[at]
        at += 1
        kind = header & 0x0F
        if kind == STOP:
            return fields, at
        delta = header >> 4
        if delta:
            field = last + delta
        else:
            raw, at = _varint(buf, at)
            field = _zigzag(raw)
        value, at = _read_value(buf, at, kind)
        fields.append([field, kind, value])
        last = field


def _write_value(kind: int, value: Any) -> bytes:
    if kind in (TRUE, FALSE):
        return b""
    if kind == BYTE:
        return bytes([value & 0xFF])
    if kind in (I16, I32, I64):
        return _write_int(value)
    if kind == DOUBLE:
        return struct.pack("<d", value)
    if kind == BINARY:
        return _write_varint(len(value)) + bytes(value)
    if kind in (LIST, SET):
        element, values = value
        head = (
            bytes([len(values) << 4 | element])
            if len(values) < 15
            else bytes([0xF0 | element]) + _write_varint(len(values))
        )
        if element in (TRUE, FALSE):
            return head + bytes(TRUE if v else FALSE for v in values)
        return head + b"".join(_write_value(element, v) for v in values)
    if kind == MAP:
        key_kind, value_kind, pairs = value
        if not pairs:
            return b"\x00"
        body = b"".join(_write_value(key_kind, k) + _write_value(value_kind, v) for k, v in pairs)
        return _write_varint(len(pairs)) + bytes([key_kind << 4 | value_kind]) + body
    if kind == STRUCT:
        return write_struct(value)
    raise ValueError(f"compact type {kind}")


def write_struct(fields: Struct) -> bytes:
    out = bytearray()
    last = 0
    for field, kind, value in fields:
        if kind in (TRUE, FALSE):
            kind = TRUE if value else FALSE
        delta = field - last
        if 0 < delta <= 15:
            out.append(delta << 4 | kind)
        else:
            out.append(kind)
            out += _write_int(field)
        out += _write_value(kind, value)
        last = field
    out.append(STOP)
    return bytes(out)


def field(fields: Struct, number: int) -> Any:
    """The value of field ``number`` (KeyError when absent)."""
    for entry in fields:
        if entry[0] == number:
            return entry[2]
    raise KeyError(number)


def set_field(fields: Struct, number: int, value: Any) -> None:
    for entry in fields:
        if entry[0] == number:
            entry[2] = value
            return
    raise KeyError(number)
