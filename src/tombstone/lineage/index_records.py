"""Index records: the keys an index run wrote, when, and from which source (a LangChain record manager's rows)."""

from __future__ import annotations

from collections.abc import Sequence

from tombstone.lineage.sql import parts


class IndexRecords:
    """A record manager's rows (mixed into :class:`tombstone.lineage.db.LineageDB`)."""

    # -- index records (a record manager's rows: keys an index run wrote, when, from which source) --

    def _group_key(self, group: str) -> str:
        return self.secret.subject_key("index-group\x00" + group)

    def index_update(self, namespace: str, keys: Sequence[str], groups: Sequence[str | None], at: float) -> None:
        """Upsert index records: each key with its group (source; None for none), updated at ``at``."""
        rows = [(namespace, key, None if group is None else self._group_key(group),
                 None if group is None else self.secret.seal(group.encode("utf-8")), at)
                for key, group in zip(keys, groups)]
        with self.atomic() as conn:
            conn.executemany(
                "INSERT INTO index_records VALUES (?, ?, ?, ?, ?) ON CONFLICT (namespace, record_key) DO UPDATE"
                " SET group_key = excluded.group_key, group_sealed = excluded.group_sealed,"
                " updated_at = excluded.updated_at", rows)

    def index_exists(self, namespace: str, keys: Sequence[str]) -> list[bool]:
        found: set[str] = set()
        keys = list(keys)
        for part in parts(keys):
            rows = self._conn.execute(
                f"SELECT record_key FROM index_records WHERE namespace = ?"
                f" AND record_key IN ({','.join('?' * len(part))})", (namespace, *part)).fetchall()
            found.update(row[0] for row in rows)
        return [key in found for key in keys]

    def index_keys(self, namespace: str, *, before: float | None = None, after: float | None = None,
                   groups: Sequence[str] | None = None, limit: int | None = None) -> list[str]:
        """Keys updated before/after a time, of some groups, oldest first."""
        where, params = ["namespace = ?"], [namespace]
        if before is not None:
            where.append("updated_at < ?")
            params.append(before)
        if after is not None:
            where.append("updated_at > ?")
            params.append(after)
        if groups is not None:
            if not groups:
                return []
            where.append(f"group_key IN ({','.join('?' * len(groups))})")
            params += [self._group_key(g) for g in groups]
        query = f"SELECT record_key FROM index_records WHERE {' AND '.join(where)} ORDER BY updated_at, record_key"
        if limit:
            query += f" LIMIT {int(limit)}"
        return [row[0] for row in self._conn.execute(query, params).fetchall()]

    def index_groups(self, namespace: str, keys: Sequence[str]) -> dict[str, str | None]:
        """The group (source) of each key that has a record (None: recorded without one)."""
        out: dict[str, str | None] = {}
        keys = list(keys)
        for part in parts(keys):
            rows = self._conn.execute(
                f"SELECT record_key, group_sealed FROM index_records WHERE namespace = ?"
                f" AND record_key IN ({','.join('?' * len(part))})", (namespace, *part)).fetchall()
            for key, sealed in rows:
                out[key] = None if sealed is None else self.secret.unseal(bytes(sealed)).decode("utf-8")
        return out

    def index_delete(self, namespace: str, keys: Sequence[str]) -> None:
        with self.atomic() as conn:
            conn.executemany("DELETE FROM index_records WHERE namespace = ? AND record_key = ?",
                             [(namespace, key) for key in keys])
