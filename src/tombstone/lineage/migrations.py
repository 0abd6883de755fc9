"""Numbered migrations of the lineage db. Append only: never edit a migration that has shipped.

Each migration runs in one transaction together with the row that records it, so a crash leaves
the db either before or after a migration, never halfway.
"""

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "initial schema",
        """
        CREATE TABLE subjects (
            subject_key TEXT PRIMARY KEY,          -- HMAC of the subject reference, never the reference
            created_at  TEXT NOT NULL
        );
        CREATE TABLE artifacts (
            store        TEXT NOT NULL,
            artifact_id  TEXT NOT NULL,
            backend      TEXT NOT NULL,
            kind         TEXT NOT NULL,
            subject_key  TEXT NOT NULL REFERENCES subjects(subject_key),
            fingerprint  BLOB,                     -- first 32 dims, float32 little-endian; vectors only
            content_hash TEXT,                     -- sha256 of the content; the content is never stored
            created_at   TEXT NOT NULL,
            state        TEXT NOT NULL DEFAULT 'live'
                         CHECK (state IN ('live', 'suppressed', 'reclaimed', 'decided')),
            PRIMARY KEY (store, artifact_id)
        );
        CREATE INDEX artifacts_by_subject ON artifacts(subject_key);
        CREATE INDEX artifacts_by_content ON artifacts(content_hash);
        CREATE TABLE edges (                        -- dst was derived from src
            src_store TEXT NOT NULL,
            src_id    TEXT NOT NULL,
            dst_store TEXT NOT NULL,
            dst_id    TEXT NOT NULL,
            relation  TEXT NOT NULL,
            created_at TEXT NOT NULL,
            PRIMARY KEY (src_store, src_id, dst_store, dst_id)
        );
        CREATE INDEX edges_by_dst ON edges(dst_store, dst_id);
        CREATE TABLE probes (
            store        TEXT NOT NULL,
            artifact_id  TEXT NOT NULL,
            query_sha256 TEXT NOT NULL,
            vector       BLOB NOT NULL,                -- float32 little-endian
            PRIMARY KEY (store, artifact_id, query_sha256)
        );
        CREATE TABLE suppressions (
            store         TEXT NOT NULL,
            artifact_id   TEXT NOT NULL,
            saga_id       TEXT NOT NULL,
            suppressed_at TEXT NOT NULL,
            PRIMARY KEY (store, artifact_id)
        );
        CREATE TABLE sagas (
            saga_id      TEXT PRIMARY KEY,
            subject_key  TEXT NOT NULL,
            subject_sealed BLOB NOT NULL,              -- the operator's reference, sealed with the secret
            state        TEXT NOT NULL CHECK (state IN ('running', 'done')),
            started_at   TEXT NOT NULL,
            finished_at  TEXT,
            out_path     TEXT
        );
        CREATE UNIQUE INDEX one_running_saga_per_subject ON sagas(subject_key) WHERE state = 'running';
        CREATE TABLE journal (
            seq      INTEGER PRIMARY KEY AUTOINCREMENT,
            saga_id  TEXT NOT NULL REFERENCES sagas(saga_id),
            step     TEXT NOT NULL,
            target   TEXT NOT NULL DEFAULT '',
            phase    TEXT NOT NULL CHECK (phase IN ('begin', 'end')),
            at       TEXT NOT NULL,
            detail   TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX journal_by_saga ON journal(saga_id, step, target, phase);
        CREATE TABLE receipts (
            seq            INTEGER PRIMARY KEY,
            saga_id        TEXT NOT NULL UNIQUE REFERENCES sagas(saga_id),
            subject_key    TEXT NOT NULL,
            receipt_hash   TEXT NOT NULL UNIQUE,
            previous_hash  TEXT,
            created_at     TEXT NOT NULL,
            receipt_sealed BLOB NOT NULL               -- the signed receipt, sealed (it names the subject)
        );
        """,
    ),
    (
        2,
        "vector norm for the normalised fingerprint",
        """
        -- 1 / L2 norm of the full vector, as float32 (hnswlib's cosine space stores v * inv_norm).
        ALTER TABLE artifacts ADD COLUMN inv_norm REAL;
        """,
    ),
    (
        3,
        "third parties",
        """
        -- A copy that left for a third party (an external processor, an export, an email). Its artifact
        -- row lives in the pseudo-store 'third-party' with backend 'external'; this says who and when.
        CREATE TABLE third_parties (
            artifact_id TEXT PRIMARY KEY,
            recipient   TEXT NOT NULL,
            sent_at     TEXT NOT NULL,
            note        TEXT NOT NULL DEFAULT ''
        );
        """,
    ),
    (
        4,
        "dead letters",
        """
        CREATE TABLE dead_letters (
            seq        INTEGER PRIMARY KEY AUTOINCREMENT,
            saga_id    TEXT NOT NULL REFERENCES sagas(saga_id),
            store      TEXT NOT NULL,
            step       TEXT NOT NULL,
            artifacts  INTEGER NOT NULL,
            error      TEXT NOT NULL,
            attempts   INTEGER NOT NULL,
            at         TEXT NOT NULL,
            state      TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'retried'))
        );
        """,
    ),
    (
        5,
        "who ran each step",
        """
        -- The worker that journaled the entry ('' for a plain 'tombstone erase'): with several workers on
        -- one journal, this is how a step's begin and end are traced to the process that ran it.
        ALTER TABLE journal ADD COLUMN worker TEXT NOT NULL DEFAULT '';
        """,
    ),
    (
        6,
        "keyed content hashes",
        # Python, not SQL: each stored SHA-256 of content becomes HMAC(secret, digest), the only form the
        # lineage db keeps from now on (an unkeyed hash lets anyone holding the db confirm a guessed text).
        lambda db: db.rekey_content_hashes(),
    ),
    (
        7,
        "hidden ids for the read path",
        """
        -- A suppression is 'cleared' once the store's reclaim removed the record: from then on no read path
        -- can return it, so wrappers stop filtering it. Until then (and forever after a failed reclaim) the
        -- wrappers post-filter it. The generation changes whenever a store's set of uncleared suppressions
        -- does, so a wrapper re-reads the set only then.
        ALTER TABLE suppressions ADD COLUMN cleared_at TEXT;
        CREATE TABLE suppression_generations (
            store      TEXT PRIMARY KEY,
            generation INTEGER NOT NULL
        );
        """,
    ),
    (
        8,
        "index records",
        """
        -- A record manager's rows (LangChain's indexing API): which keys an index run wrote, when, and from
        -- which source (group). The group is kept as an HMAC for lookups and sealed for reading back: a
        -- source name can be personal data too.
        CREATE TABLE index_records (
            namespace    TEXT NOT NULL,
            record_key   TEXT NOT NULL,
            group_key    TEXT,
            group_sealed BLOB,
            updated_at   REAL NOT NULL,
            PRIMARY KEY (namespace, record_key)
        );
        CREATE INDEX index_records_by_time ON index_records(namespace, updated_at);
        CREATE INDEX index_records_by_group ON index_records(namespace, group_key, updated_at);
        """,
    ),
    (
        9,
        "semantic snapshots",
        """
        -- What the semantic level measured of an artifact's neighbourhood before suppression hid it: its
        -- probe queries' Top-5 (ids, distances, vectors, the artifact's own vector among them) and its
        -- same-cluster controls. Kept only until the receipt is sealed: the purge in the receipt's
        -- transaction deletes it with the probe vectors (secure_delete zeroes the freed pages).
        CREATE TABLE semantic_snapshots (
            store       TEXT NOT NULL,
            artifact_id TEXT NOT NULL,
            saga_id     TEXT NOT NULL,
            meta        TEXT NOT NULL,                -- JSON: ids, distances, ranks, drifts, array layout
            vectors     BLOB NOT NULL,                -- float32 little-endian arrays, as the layout says
            PRIMARY KEY (store, artifact_id)
        );
        """,
    ),
    (
        10,
        "model snapshots",
        """
        -- What the model level needs of a trained example to probe the weights after its erasure: which
        -- shard and weights it was trained into, where its canary lies, what the probes measured before
        -- suppression, and the example's text sealed with the lineage secret (the dataset's reclaim removes
        -- the text itself before the model is probed). Kept only until the receipt is sealed: the purge in
        -- the receipt's transaction deletes it (secure_delete zeroes the freed pages).
        CREATE TABLE model_snapshots (
            store       TEXT NOT NULL,
            artifact_id TEXT NOT NULL,
            saga_id     TEXT NOT NULL,
            meta        TEXT NOT NULL,                -- JSON: shard, weights, canary offsets, measurements
            text_sealed BLOB,                         -- the example's text, sealed; NULL when none was read
            PRIMARY KEY (store, artifact_id)
        );
        """,
    ),
    (
        11,
        "pending probe captures",
        """
        -- An artifact whose probe fragments a write queued for background capture and that are not recorded
        -- yet: written in the write's own transaction, deleted in the one that records the probe vectors.
        -- A row left behind by a process that died says the artifact's probes are incomplete. ``ticket``
        -- names the write (a later write of the same id replaces it), ``writer`` the process that queued it
        -- (host:pid:start), so another process can tell a live writer's queue from a dead one's.
        CREATE TABLE probe_captures (
            store       TEXT NOT NULL,
            artifact_id TEXT NOT NULL,
            ticket      TEXT NOT NULL,
            writer      TEXT NOT NULL DEFAULT '',
            queued_at   TEXT NOT NULL,
            PRIMARY KEY (store, artifact_id)
        );
        """,
    ),
    (
        12,
        "erasure requests",
        """
        -- An erasure request as a compliance team records it (``tombstone request``): when it was received, by
        -- when it must be answered (GDPR Art. 12(3): one month, extendable by two with a reason), the ground it
        -- invokes and the stores whose records are kept under an Art. 17(3) exception (JSON: store, reason,
        -- until). The subject is stored keyed, as in ``subjects``. ``answered_at`` and ``receipt_hash`` name the
        -- receipt that answered it, once one did.
        CREATE TABLE requests (
            request_id       TEXT PRIMARY KEY,
            subject_key      TEXT NOT NULL,
            reference        TEXT,
            received_on      TEXT NOT NULL,
            due_on           TEXT NOT NULL,
            extended_to      TEXT,
            extension_reason TEXT,
            basis            TEXT,
            retentions       TEXT NOT NULL DEFAULT '[]',
            created_at       TEXT NOT NULL,
            answered_at      TEXT,
            receipt_hash     TEXT
        );
        CREATE INDEX requests_subject ON requests (subject_key);
        """,
    ),
)
