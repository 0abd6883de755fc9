"""``tombstone scan`` for a pgvector table, through the adapter opened read-only (a read-only session; no
CHECKPOINT, no VACUUM, no ANALYZE; an embedded data directory is read through a server on a private copy
of it, ``embedded.PrivateCopy``, unless Tombstone's own server on it runs):

- dead tuples: ``pgstattuple`` when the extension is installed (count and bytes), else the statistics
  collector's ``n_dead_tup`` (a count that may lag by a moment);
- the planner statistics (``pg_stats``): values of the id column its samples keep that no live row has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from tombstone.scanreport import ScanPlace, ScanReport


def scan_pgvector(cls: Any, store: str, options: Mapping[str, Any]) -> ScanReport:
    adapter = cls.open_read_only(store, options)
    try:
        conn, pg = adapter.conn, adapter.pg
        regclass = adapter.table.as_string(conn)
        report = ScanReport(store=store, backend=cls.backend)
        installed = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pgstattuple'").fetchone()
        dead = None
        if installed:
            try:
                count, size = conn.execute("SELECT dead_tuple_count, dead_tuple_len FROM pgstattuple(%s::regclass)",
                                           (regclass,)).fetchone()
                dead = ScanPlace(place=pg.qualified, kind="dead tuples (pgstattuple)", count=int(count),
                                 bytes=int(size), note="rows deleted or updated, kept in the pages until a VACUUM")
            except psycopg.Error as exc:
                conn.rollback()
                report.notes.append(f"pgstattuple failed ({exc.sqlstate}); n_dead_tup used instead")
        if dead is None:
            row = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %s::regclass",
                               (regclass,)).fetchone()
            dead = ScanPlace(place=pg.qualified, kind="dead tuples (n_dead_tup)", count=int(row[0]) if row else 0,
                             note="the statistics collector's count (no bytes; may lag a moment); install"
                                  " pgstattuple for bytes")
        report.places.append(dead)
        id_column = pg.cols["id"]
        sampled = set(adapter._stats_values().get(id_column, []))
        live: set[str] = set()
        if sampled:
            rows = conn.execute(
                f"SELECT {psycopg.sql.Identifier(id_column).as_string(conn)}::text FROM {regclass}"
                f" WHERE {psycopg.sql.Identifier(id_column).as_string(conn)}::text = ANY(%s)",
                (sorted(sampled),)).fetchall()
            live = {r[0] for r in rows}
        gone = sorted(sampled - live)
        report.places.append(ScanPlace(
            place=f"pg_stats {pg.qualified}.{id_column}", kind="planner statistics of ids no live row has",
            count=len(gone), bytes=sum(len(v.encode()) for v in gone), ids=gone,
            note="most common values and histogram bounds keep samples until the next ANALYZE"))
        report.notes.append("WAL, base backups and replicas are not read")
        return report
    finally:
        adapter.close()
