"""The red team's Parquet files (issue 68's P rows), each read by a fresh
sidecar under ``--memory-limit 1Gi`` the three ways the review read them:
one rank, four ranks at once, and ``partition="pad"`` with batches of 4.
Each row gives the answer of each way, the process's peak RSS against the
limit, and whether an honest client was served during and after.

The files are made here: valid ones with pyarrow, the others from a valid
file with its page bodies, page headers or footer rewritten
(:mod:`._thrift`), so each claim is what the attack says whatever width its
varint needs. Run with the other attacks:

    python -m shardfeed_benchmarks.attacks --binary BIN --only parquet-p1 ...
"""

from __future__ import annotations

import functools
import io
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _thrift as thrift
from ._attack_kit import DATASET, Outcome, Probes, Setup, _healthy, _outcome, sidecar

LIMIT = 1 << 30
# Batches each reader takes before it leaves: the attacks bite on the first
# row group a reader opens, or earlier.
BATCHES = 4


@dataclass(frozen=True)
class Scale:
    """The sizes a file is made at: the review's (``FULL``), or small
    enough to be a fuzzer's seed (``SEED``), the same shapes."""

    bomb: int = 1_200 << 20
    page: int = 64 << 10
    dictionary_value: int = 512 << 10
    dictionary_rows: int = 5_000
    empty_rows: int = 1 << 22
    claiming_groups: int = 2_000
    labels: int = 1_000_000


FULL = Scale()
SEED = Scale(
    bomb=16 << 20,
    page=4 << 10,
    dictionary_value=16 << 10,
    dictionary_rows=200,
    empty_rows=1 << 14,
    claiming_groups=20,
    labels=2_000,
)

# ---- files -----------------------------------------------------------------


def _hub_table(images: list[bytes], labels: Any) -> Any:
    """The Hub's image layout: ``image`` a struct of bytes and path."""
    import pyarrow as pa

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    column = pa.array([{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(images)], image_type)
    return pa.table({"image": column, "label": labels})


def _write(table: Any, **options: Any) -> bytes:
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(table, out, **options)
    return out.getvalue()


def _footer(file: bytes) -> thrift.Struct:
    length = int.from_bytes(file[-8:-4], "little")
    fields, _ = thrift.read_struct(file, len(file) - 8 - length)
    return fields


def _with_footer(file: bytes, footer: thrift.Struct) -> bytes:
    length = int.from_bytes(file[-8:-4], "little")
    encoded = thrift.write_struct(footer)
    return file[: len(file) - 8 - length] + encoded + len(encoded).to_bytes(4, "little") + b"PAR1"


def _groups(footer: thrift.Struct) -> list[thrift.Struct]:
    return list(thrift.field(footer, 4)[1])


def _chunk(group: thrift.Struct, leaf: str) -> thrift.Struct:
    """A row group's column metadata for the leaf ``a.b``."""
    for column in thrift.field(group, 1)[1]:
        meta = thrift.field(column, 3)
        if b".".join(thrift.field(meta, 3)[1]).decode() == leaf:
            return meta  # type: ignore[no-any-return]
    raise KeyError(leaf)


def _page_at(file: bytes, meta: thrift.Struct) -> tuple[int, thrift.Struct, int]:
    """The first data page of a chunk: where its header starts, the header,
    where its body starts."""
    at = thrift.field(meta, 9)
    header, body = thrift.read_struct(file, at)
    return at, header, body


def with_page_bodies(
    file: bytes, leaf: str, body: Callable[[int], bytes], groups: int = 2
) -> bytes:
    """The first ``groups`` row groups' first ``leaf`` page with its body
    replaced by ``body(length)``; headers and footer as written."""
    patched = bytearray(file)
    for group in _groups(_footer(file))[:groups]:
        _, header, start = _page_at(file, _chunk(group, leaf))
        length = thrift.field(header, 3)
        replacement = body(length)
        assert len(replacement) == length
        patched[start : start + length] = replacement
    return bytes(patched)


def with_page_claim(file: bytes, leaf: str, claim: int) -> bytes:
    """Row group 0's first ``leaf`` page with its header saying ``claim``
    bytes decompressed: the bytes after it move, and every offset and size
    the footer gives past it with them."""
    footer = _footer(file)
    meta = _chunk(_groups(footer)[0], leaf)
    at, header, body = _page_at(file, meta)
    thrift.set_field(header, 2, claim)
    encoded = thrift.write_struct(header)
    shift = len(encoded) - (body - at)
    out = file[:at] + encoded + file[body:]
    for group in _groups(footer):
        for column in thrift.field(group, 1)[1]:
            chunk_meta = thrift.field(column, 3)
            for number in (9, 10, 11):
                _shift_past(chunk_meta, number, at, shift)
            for number in (2, 4, 6):
                _shift_past(column, number, at, shift)
        _shift_past(group, 5, at, shift)
    target = _chunk(_groups(footer)[0], leaf)
    thrift.set_field(target, 7, thrift.field(target, 7) + shift)
    return _with_footer(out, footer)


def _shift_past(fields: thrift.Struct, number: int, at: int, shift: int) -> None:
    try:
        offset = thrift.field(fields, number)
    except KeyError:
        return
    if offset > at:
        thrift.set_field(fields, number, offset + shift)


def with_footer_edit(file: bytes, edit: Callable[[thrift.Struct], None]) -> bytes:
    footer = _footer(file)
    edit(footer)
    return _with_footer(file, footer)


def _noise(length: int, seed: int = 0) -> bytes:
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, length, dtype=np.uint8).tobytes()


def _zstd_bomb(inflated: int) -> Callable[[int], bytes]:
    """``inflated`` zero bytes as zstd, padded to the page's length."""
    import pyarrow as pa

    # Zeros a calloc never touches: the attacker's RSS stays small.
    bomb = pa.compress(memoryview(bytes(inflated)), codec="zstd", asbytes=True)

    def body(length: int) -> bytes:
        assert len(bomb) <= length, (len(bomb), length)
        return bytes(bomb) + bytes(length - len(bomb))

    return body


# Rows of the small files: every reader of every way gets a batch.
ROWS = 8


def p1_zstd_pages_past_their_claims(scale: Scale = FULL) -> bytes:
    """P1: eight one-row groups, the first two's image page (64 KiB, claims
    honest) a zstd stream of 1.2 GB."""
    import pyarrow as pa

    images = [_noise(scale.page, i) for i in range(ROWS)]
    table = _hub_table(images, pa.array(range(ROWS), pa.int64()))
    honest = _write(
        table, row_group_size=1, compression="zstd", use_dictionary=False, write_statistics=False
    )
    return with_page_bodies(honest, "image.bytes", _zstd_bomb(scale.bomb))


def p2_footer_saying_64_bytes(scale: Scale = FULL) -> bytes:
    """P2: P1 with the footer saying each image chunk decompresses to 64 B."""

    def edit(footer: thrift.Struct) -> None:
        for group in _groups(footer)[:2]:
            thrift.set_field(_chunk(group, "image.bytes"), 6, 64)

    return with_footer_edit(p1_zstd_pages_past_their_claims(scale), edit)


def p3_page_claiming(codec: str) -> Callable[[Scale], bytes]:
    def make(scale: Scale = FULL) -> bytes:
        """P3: a small file whose label page claims 2·10^9 bytes."""
        import pyarrow as pa

        table = _hub_table([b"\xff\xd8tiny"] * ROWS, pa.array(range(ROWS), pa.int64()))
        honest = _write(table, compression=codec, use_dictionary=False)
        return with_page_claim(honest, "label", 2_000_000_000)

    return make


def p6_string_label_bombs(scale: Scale = FULL) -> bytes:
    """P6: string labels whose two zstd pages expand to 1.2 GB each:
    planning reads them before any stream's budget."""
    import pyarrow as pa

    labels = pa.array([_noise(scale.page, 9 + i).hex() for i in range(ROWS)], pa.string())
    table = _hub_table([b"\xff\xd8x"] * ROWS, labels)
    honest = _write(
        table, row_group_size=1, compression="zstd", use_dictionary=False, write_statistics=False
    )
    return with_page_bodies(honest, "label", _zstd_bomb(scale.bomb))


def p7_one_dictionary_value_for_every_row(scale: Scale = FULL) -> bytes:
    """P7: a valid file, one 512 KiB dictionary value named by 5,000 rows."""
    import pyarrow as pa

    rows = scale.dictionary_rows
    values = pa.DictionaryArray.from_arrays(
        pa.array([0] * rows, pa.int32()), pa.array([_noise(scale.dictionary_value, 7)], pa.binary())
    )
    image = pa.StructArray.from_arrays(
        [values, pa.nulls(rows, pa.string())], names=["bytes", "path"]
    )
    table = pa.table({"image": image, "label": pa.array([0] * rows, pa.int64())})
    return _write(table, compression="zstd")


def p8_millions_of_empty_images(scale: Scale = FULL) -> bytes:
    """P8: 2^22 empty images in one row group (tens of KB)."""
    import pyarrow as pa

    rows = scale.empty_rows
    empty = pa.array([b""], pa.binary())
    image = pa.StructArray.from_arrays(
        [pa.repeat(empty[0], rows), pa.nulls(rows, pa.string())], names=["bytes", "path"]
    )
    return _write(pa.table({"image": image}), row_group_size=rows, compression="zstd")


def p9_groups_claiming_rows(scale: Scale = FULL) -> bytes:
    """P9: 2,000 one-row groups whose footer says 2^22 rows each."""
    import pyarrow as pa

    groups = scale.claiming_groups
    table = _hub_table([b"\xff\xd8x"] * groups, pa.array([0] * groups, pa.int64()))
    honest = _write(table, row_group_size=1, compression="snappy")

    def edit(footer: thrift.Struct) -> None:
        for group in _groups(footer):
            thrift.set_field(group, 3, 1 << 22)
        thrift.set_field(footer, 3, groups << 22)

    return with_footer_edit(honest, edit)


def p10_long_footers(scale: Scale = FULL) -> bytes:
    """P10, one of 16 files: 65,000 one-row groups (130,000 column chunks,
    just under a footer's cap; a 12 MB footer)."""
    import pyarrow as pa

    groups = 65_000
    table = pa.table(
        {
            "image": pa.array([b"x"] * groups, pa.binary()),
            "label": pa.array(range(groups), pa.int64()),
        }
    )
    return _write(table, row_group_size=1)


def p13_a_million_string_labels(scale: Scale = FULL) -> bytes:
    """P13: 10^6 distinct string labels (the images tiny and broken)."""
    import pyarrow as pa

    rows = scale.labels
    image = pa.StructArray.from_arrays(
        [pa.repeat(pa.scalar(b"\xff\xd8", pa.binary()), rows), pa.nulls(rows, pa.string())],
        names=["bytes", "path"],
    )
    labels = pa.array([f"class-{i:07d}" for i in range(rows)], pa.string())
    return _write(pa.table({"image": image, "label": labels}), row_group_size=1 << 17)


def p15_list_labels(scale: Scale = FULL) -> bytes:
    """P15: a ``label`` column of ``list<int64>``."""
    import pyarrow as pa

    labels = pa.array([[1, 2], [3]] * (ROWS // 2), pa.list_(pa.int64()))
    return _write(_hub_table([b"\xff\xd8x"] * ROWS, labels))


@dataclass(frozen=True)
class Case:
    row: str
    make: Callable[[Scale], bytes]
    # What every reader must be answered: a gRPC code, or "served".
    expected: str
    copies: int = 1
    # Honest row groups lie beside the bad ones: a rank whose share holds
    # none of the bad ones is served, and at least one reader is refused.
    mixed: bool = False


CASES: dict[str, Case] = {
    "parquet-p1": Case(
        "P1 zstd pages of 1.2 GB past their claims",
        p1_zstd_pages_past_their_claims,
        "DATA_LOSS",
        mixed=True,
    ),
    "parquet-p2": Case(
        "P2 … and a footer saying 64 B", p2_footer_saying_64_bytes, "DATA_LOSS", mixed=True
    ),
    "parquet-p3-snappy": Case(
        "P3 Snappy page claiming 2·10⁹ B", p3_page_claiming("snappy"), "DATA_LOSS"
    ),
    "parquet-p3-lz4": Case("P3 LZ4 page claiming 2·10⁹ B", p3_page_claiming("lz4"), "DATA_LOSS"),
    "parquet-p6": Case("P6 string-label pages of 2 × 1.2 GB", p6_string_label_bombs, "DATA_LOSS"),
    "parquet-p7": Case(
        "P7 one 512 KiB dictionary value × 5,000 rows",
        p7_one_dictionary_value_for_every_row,
        "served",
    ),
    "parquet-p8": Case("P8 2²² empty images", p8_millions_of_empty_images, "FAILED_PRECONDITION"),
    "parquet-p9": Case(
        "P9 2,000 groups claiming 2²² rows", p9_groups_claiming_rows, "FAILED_PRECONDITION"
    ),
    "parquet-p10": Case(
        "P10 16 files × 65,000 row groups", p10_long_footers, "FAILED_PRECONDITION", copies=16
    ),
    "parquet-p13": Case("P13 10⁶ distinct string labels", p13_a_million_string_labels, "served"),
    "parquet-p15": Case("P15 a list<int64> label", p15_list_labels, "FAILED_PRECONDITION"),
}

# ---- reading them ------------------------------------------------------------


def _read(target: str, uri: str, rank: int, world: int, **options: Any) -> str:
    """What one reader was answered: "served" or the status code."""
    from shardfeed import Client, ShardfeedError

    try:
        with Client(target) as client:
            stream = client.batches(
                uri,
                batch_size=options.pop("batch_size", 2),
                image_size=32,
                rank=rank,
                world_size=world,
                **options,
            )
            for taken, _ in enumerate(stream, 1):
                if taken >= BATCHES:
                    break
        return "served"
    except ShardfeedError as error:
        return str(error.code)


def _readers(target: str, uri: str, world: int, **options: Any) -> list[str]:
    answers = [""] * world

    def read(rank: int) -> None:
        answers[rank] = _read(target, uri, rank, world, **dict(options))

    threads = [threading.Thread(target=read, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def _streamed(process: Any) -> bool:
    """The honest client: a batch of the demo dataset over a fresh channel."""
    target = "unix://" + process.target.removeprefix("unix:")
    return _read(target, DATASET, 0, 1, batch_size=8) == "served"


def run_case(name: str, setup: Setup) -> Outcome:
    case = CASES[name]
    folder = setup.work / name
    folder.mkdir(parents=True, exist_ok=True)
    data = case.make(FULL)
    for copy in range(case.copies):
        (folder / f"part-{copy:05d}.parquet").write_bytes(data)
    del data
    uri = f"file://{folder}/"
    flags = ("--allow", f"file://{setup.work}/", "--allow", DATASET)
    with sidecar(setup.binary, setup.endpoint, *flags, limit=LIMIT) as process:
        target = "unix://" + process.target.removeprefix("unix:")
        with Probes(lambda: _healthy(process)) as probes:
            started = time.monotonic()
            ways = {
                "1 rank": _readers(target, uri, 1),
                "4 ranks": _readers(target, uri, 4),
                "pad, 3 ranks × 4": _readers(target, uri, 3, batch_size=4, partition="pad"),
            }
        answers = {way: sorted(set(got)) for way, got in ways.items()}
        answer = "; ".join(f"{way}: {'/'.join(got)}" for way, got in answers.items())
        outcome = _outcome(
            case.row, "unix", process, answer, probes, started, lambda: _streamed(process)
        )
    allowed = {case.expected, "served"} if case.mixed else {case.expected}
    outcome.answer_as_expected = all(
        case.expected in got and set(got) <= allowed for got in answers.values()
    )
    for file in folder.iterdir():
        os.remove(file)
    return outcome


def attacks() -> dict[str, Callable[[Setup], Outcome]]:
    return {name: functools.partial(run_case, name) for name in CASES}


def write_seeds(folder: Path) -> None:
    """Each file at the seed scale, named ``redteam-<case>``, for the
    Parquet fuzz target's corpus (fuzz/seeds/parquet_file/). P10 is left
    out: at a seed's size it is an ordinary many-group file."""
    for name, case in CASES.items():
        if name != "parquet-p10":
            short = name.removeprefix("parquet-")
            (folder / f"redteam-{short}").write_bytes(case.make(SEED))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Writes the red team's files as fuzz seeds.")
    parser.add_argument("--write-seeds", type=Path, required=True)
    write_seeds(parser.parse_args().write_seeds)
