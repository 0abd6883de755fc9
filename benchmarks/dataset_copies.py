"""Dataset backend: copies of erased rows outside the shards the manifests list.

A dataset of ``ROWS`` training examples (two of them the subject's) in Parquet shards, and beside it one copy
of every row — a backup, an export, a dump — in each format and place the physical probe is meant to see
into, some named to mislead, some that cannot be decoded. The subject is erased through the API; the table
gives how many of the subject's ids a byte scan of the copy alone finds (all the probe did with such a file
before it decoded copies), the receipt's status for the subject's examples with each copy present, what the
probe said, and the time of one physical probe of the dataset with that copy (median of 5). The controls: the
same erasure with no copy, and the same probe once the copy is removed.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import statistics
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

HEADINGS = ("Dataset: copies of erased rows outside the shards",)
ROWS = 10_000
BOUND = 64 << 20
"""The store's max_decoded_bytes in this benchmark (64 MiB): the bomb decodes to 4 GiB."""
REPS = 5


def _rows(subject_rows: list[dict], filler: list[dict]) -> list[dict]:
    return filler[: len(filler) // 2] + subject_rows + filler[len(filler) // 2:]


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _table(rows: list[dict]):
    import pyarrow as pa

    return pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows],
                     "metadata": [json.dumps(r["metadata"]) for r in rows]})


def _parquet(rows: list[dict], compression: str) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(_table(rows), sink, compression=compression)
    return sink.getvalue().to_pybytes()


def _feather(rows: list[dict]) -> bytes:
    import pyarrow as pa
    from pyarrow import feather

    sink = pa.BufferOutputStream()
    feather.write_feather(_table(rows), sink)
    return sink.getvalue().to_pybytes()


def _csv(rows: list[dict]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(("id", "text"))
    writer.writerows((r["id"], r["text"]) for r in rows)
    return out.getvalue().encode()


def _zstd(data: bytes) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


def _tar_gz(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _zip(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return out.getvalue()


def _bomb(_rows: list[dict]) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = bytes(1 << 24)
    return b"".join([*(comp.compress(chunk) for _ in range(256)), comp.flush()])


CASES: list[tuple[str, str, Callable[[list[dict]], bytes]]] = [
    ("gzip JSONL in a sub-folder of shards", "shards/archive/part-old.jsonl.gz", lambda r: gzip.compress(_jsonl(r))),
    ("zstd Parquet in backup/", "backup/train.parquet", lambda r: _parquet(r, "zstd")),
    ("gzip JSON list in shards, unlisted", "shards/extra.json.gz", lambda r: gzip.compress(json.dumps(r).encode())),
    ("gzip JSONL dump at the top", "dump.jsonl.gz", lambda r: gzip.compress(_jsonl(r))),
    ("gzip JSONL named as text", "notes.txt", lambda r: gzip.compress(_jsonl(r))),
    ("snappy Parquet named as binary", "data.bin", lambda r: _parquet(r, "snappy")),
    ("Feather v2 (LZ4)", "backup/rows.feather", _feather),
    ("gzip CSV", "exports/rows.csv.gz", lambda r: gzip.compress(_csv(r))),
    ("xz JSONL", "backup/rows.jsonl.xz", lambda r: lzma.compress(_jsonl(r))),
    ("bz2 JSON object holding the rows", "backup/rows.json.bz2", lambda r: bz2.compress(json.dumps({"rows": r}).encode())),
    ("zstd JSONL", "backup/rows.jsonl.zst", lambda r: _zstd(_jsonl(r))),
    ("CSV in a tar.gz", "backup/export.tar.gz", lambda r: _tar_gz("data/rows.csv", _csv(r))),
    ("JSONL in a zip", "backup/export.zip", lambda r: _zip("rows.jsonl", _jsonl(r))),
    ("truncated gzip JSONL", "backup/broken.jsonl.gz", lambda r: gzip.compress(_jsonl(r))[:-9]),
    ("gzip bomb (4 GiB of zeros)", "dump.jsonl.gz", _bomb),
]


def _status(entries: list[dict]) -> str:
    shown = sorted({f"{e['status']}({e['level']})" if e.get("level") else e["status"] for e in entries})
    return ", ".join(shown)


def _said(entries: list[dict], rel: str | None) -> str:
    """What the receipt says of the copy: the finding naming it, or the reason naming it."""
    entry = entries[0]
    text = entry.get("measurement") or entry.get("reason") or ""
    at = text.find(f"{rel} (listed by no manifest") if rel else -1
    if at >= 0:
        return text[text.rfind("; ", 0, at) + 2 if "; " in text[:at] else 0:text.find(")", at) + 1]
    if rel and rel in text:
        return text[text.find(rel):].split(" (")[0]
    return text[:140] or "—"


def _one(tmp: Path, name: str, rel: str | None, make: Callable[[list[dict]], bytes] | None) -> dict:
    from tombstone_adapters.dataset import DatasetStore

    from tombstone import Tombstone, init_deployment

    config = init_deployment(tmp / "deploy", {"train": {"backend": "dataset", "path": "stores/train",
                                                         "max_decoded_bytes": BOUND}})
    root = Path(config.stores["train"].options["path"])
    with Tombstone(config) as tomb:
        store = DatasetStore(root, lineage=tomb.lineage, store="train", format="parquet", shard_rows=ROWS // 4)
        filler = [{"id": f"ex-bob-{i:06d}", "text": f"bob's example {i}: the parcel and the refund", "metadata": {"n": i}}
                  for i in range(ROWS - 2)]
        mine = [{"id": f"ex-alice-{i:03d}-c9", "text": f"alice wrote note {i} about invoice {4000 + i}",
                 "metadata": {"n": i}} for i in range(2)]
        store.add([r["id"] for r in filler], [r["text"] for r in filler], subject="bob")
        store.add([r["id"] for r in mine], [r["text"] for r in mine], subject="alice")
        size, scanned = 0, None
        if rel is not None and make is not None:
            copy = root / rel
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(make(_rows(mine, filler)))
            size = copy.stat().st_size
            data = copy.read_bytes()
            scanned = sum(1 for r in mine if r["id"].encode() in data)  # what a byte scan alone sees of the copy
        receipt, _ = tomb.erase("alice")
        entries = [a for a in receipt["artifacts"] if a["store"] == "train"]
        arts = [tomb.lineage.artifact("train", r["id"]) for r in mine]
        adapter = tomb.adapter("train")
        times = []
        for _ in range(REPS):
            start = time.perf_counter()
            adapter.probe_physical(arts)
            times.append(time.perf_counter() - start)
        gone = None
        if rel is not None:
            (root / rel).unlink()
            gone = all(r.ran and r.passed for r in adapter.probe_physical(arts).values())
    return {"case": name, "file": rel or "(no copy)", "bytes": size, "status": _status(entries), "said": _said(entries, rel),
            "probe": statistics.median(times), "without": gone, "scanned": scanned, "ids": len(mine)}


def run(tmp: Path) -> dict:
    rows = [_one(tmp / "control", "control: no copy", None, None)]
    for n, (name, rel, make) in enumerate(CASES):
        rows.append(_one(tmp / f"case-{n}", name, rel, make))
    return {"rows": rows, "dataset_rows": ROWS, "bound": BOUND}


def section(result: dict) -> str:
    lines = [
        f"## {HEADINGS[0]}",
        "",
        (f"A dataset of {result['dataset_rows']:,} training examples in Parquet shards (two of them the subject's),"
        " and one copy of every row beside it that no manifest lists: in each case the subject is erased through"
        " the API (the reclaim rewrites the listed shards and leaves the copy) and the receipt gives the status of"
        " the subject's examples. The probe decodes every file under the dataset directory whose *content* is a"
        " format it reads — never by name, suffix or folder — within the store's bounds (here max_decoded_bytes"
        f" {result['bound'] >> 20} MiB). *Probe*: one physical probe of the dataset with the copy in place"
        " (median of 5: the byte scan of every file, the decode of the listed shards and of every copy, the keyed"
        " content hash of every decoded value). *Without the copy*: the same probe once the copy is removed passes"
        " (the control that the probe can pass)."),
        "",
        "| copy | file | size | byte scan alone | status after the erasure | the probe says | probe | without the copy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        size = f"{row['bytes'] / 1024:,.0f} KiB" if row["bytes"] else "—"
        without = "—" if row["without"] is None else ("passes" if row["without"] else "still found")
        said = row["said"].replace("|", "\\|")
        scan = "—" if row["scanned"] is None else f"{row['scanned']} of {row['ids']} ids"
        lines.append(f"| {row['case']} | `{row['file']}` | {size} | {scan} | {row['status']} | {said} |"
                     f" {row['probe'] * 1000:,.0f} ms | {without} |")
    lines += [
        "",
        ("Before the probe decoded copies, it decoded the shards the manifests list and byte-scanned every other file"
        " (refusing only an unlisted compressed file directly in `shards/` named like a shard). *Byte scan alone* is what such a scan finds of the subject's ids in the"
        " copy's bytes: nothing in a compressed copy (the erasure ended VERIFIED(physical)), and in a Parquet copy"
        " only an id a row group's column statistics keep as its minimum or maximum. A copy"
        " that cannot be decoded (truncated, corrupt, encrypted, past a bound) leaves the artifacts found nowhere"
        " UNVERIFIED with the file named, never VERIFIED; a bomb stops at the bound. A copy holding the text without"
        " the id is found by its keyed content hash where the lineage key is available (not by an independent"
        " auditor, who searches by id)."),
    ]
    return "\n".join(lines)
