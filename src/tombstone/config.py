"""``tombstone.toml``: where the lineage db, the keys, the receipts and each store live.

The file is read only if it is a regular file of at most ``tombstone.inputs.CONFIG_LIMIT`` (1 MiB): a FIFO,
a device or a folder named as the config is refused at once.

Relative paths are resolved against the directory of the config file, so a deployment directory
can be moved or copied as a whole (the crash-resume tests rely on that).

::

    [tombstone]
    lineage_db = "lineage.db"
    keys_dir = "keys"
    receipts_dir = "receipts"
    # lineage_dsn = "postgresql://tombstone@db.internal/tombstone"   # several workers: see below
    # levels = ["logical", "physical", "semantic", "model"]           # enables the semantic level too
    # auditor_keys = ["keys/auditor-acme.pub"]                        # content patterns sealed to these

    [stores.docs]
    backend = "docstore"
    path = "stores/docs/docstore.db"

``lineage_dsn``, when set, puts the lineage db (and so the saga journal and the job queue of
``tombstone worker``) on PostgreSQL instead of the ``lineage_db`` file, so workers on several machines
share it. Leave the password out of it: libpq reads ``PGPASSWORD`` or ``~/.pgpass``.

``auditor_keys`` lists auditors' public keys (made by ``tombstone auditor-key``): each receipt seals the
erased artifacts' content patterns (fingerprints) to them, so those auditors can re-probe by content as
well as by id. Without any, receipts carry no content pattern at all and audits are by id.

``levels`` lists the verification levels the saga runs; a level left out shows on every receipt as not
run, with that reason. The logical level cannot be left out (nothing is VERIFIED without it). The default
is ``["logical", "physical", "model"]``: the semantic level (a measurement of the erased artifacts'
neighbourhoods, see verification-levels.md) is opt-in.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import tomli_w

from tombstone.errors import ConfigError
from tombstone.verify.levels import Level

DEFAULT_LEVELS = frozenset({Level.LOGICAL, Level.PHYSICAL, Level.MODEL})
"""The levels a deployment runs unless ``levels`` says otherwise: every level but the semantic one."""
CONFIG_NAME = "tombstone.toml"
ENV_VAR = "TOMBSTONE_CONFIG"
_STORE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class StoreConfig:
    """One configured store."""

    name: str
    """Name of the store, unique within the deployment; appears on receipts."""
    backend: str
    """Adapter name, as registered in the ``tombstone.adapters`` entry-point group."""
    options: dict[str, Any] = field(default_factory=dict)
    """Backend-specific options (paths already resolved against the config directory)."""

    def __post_init__(self) -> None:
        if not _STORE_NAME.match(self.name):
            raise ConfigError(f"invalid store name {self.name!r}: use letters, digits, '_', '.', '-'")
        if not self.backend:
            raise ConfigError(f"store {self.name!r} has no backend")


@dataclass(frozen=True)
class Config:
    """A loaded, validated deployment configuration."""

    path: Path
    """The config file itself."""
    lineage_db: Path
    """The lineage db file."""
    keys_dir: Path
    """Directory holding the signing key and the lineage secret."""
    receipts_dir: Path
    """Where receipts are written by default."""
    stores: dict[str, StoreConfig]
    """Configured stores by name."""
    lineage_dsn: str | None = None
    """A ``postgresql://`` DSN: the lineage db (journal, queue) lives there instead of ``lineage_db``."""
    levels: frozenset[Level] = DEFAULT_LEVELS
    """The verification levels the saga runs (``DEFAULT_LEVELS`` unless configured)."""
    auditor_keys: tuple[Path, ...] = ()
    """Auditors' public keys; receipts seal content patterns to each (``tombstone.receipt.sealing``)."""
    backups: tuple["BackupConfig", ...] = ()
    """Declared copies of stores (backups, replicas, snapshots) that an erasure cannot reach: each receipt says
    which of them still hold the subject, and until when (``[backups.NAME]``)."""

    @property
    def lineage_target(self) -> str | Path:
        """What :class:`~tombstone.lineage.db.LineageDB` opens: the DSN if one is set, else the file."""
        return self.lineage_dsn or self.lineage_db

    @property
    def root(self) -> Path:
        return self.path.parent


@dataclass(frozen=True)
class BackupConfig:
    """A declared copy of some stores: ``[backups.NAME]`` with ``stores``, ``retention_days`` and ``where``."""

    name: str
    stores: tuple[str, ...]
    retention_days: int
    where: str
    kind: str = "backup"


BACKUP_KINDS = ("backup", "snapshot", "replica", "archive")


def _backups(path: Path, data: Any, stores: Mapping[str, Any]) -> tuple[BackupConfig, ...]:
    if data is None:
        return ()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: [backups] must be a table of [backups.NAME] tables")
    out = []
    for name, body in data.items():
        where = f"{path}: [backups.{name}]"
        if not isinstance(body, dict):
            raise ConfigError(f"{where} must be a table")
        unknown = sorted(set(body) - {"stores", "retention_days", "where", "kind"})
        if unknown:
            raise ConfigError(f"{where} has unknown key(s) {', '.join(unknown)} (stores, retention_days, where, kind)")
        named = body.get("stores")
        if not (isinstance(named, list) and named and all(isinstance(s, str) for s in named)):
            raise ConfigError(f"{where} needs stores = [...], the configured stores it copies")
        missing = [s for s in named if s not in stores]
        if missing:
            raise ConfigError(f"{where} copies store(s) {', '.join(missing)}, which are not configured")
        days = body.get("retention_days")
        if isinstance(days, bool) or not isinstance(days, int) or days < 1:
            raise ConfigError(f"{where} needs retention_days = N (whole days each copy is kept, at least 1)")
        place = body.get("where")
        if not isinstance(place, str) or not place.strip():
            raise ConfigError(f'{where} needs where = "..." (where the copies are kept, as an operator finds them)')
        kind = body.get("kind", "backup")
        if kind not in BACKUP_KINDS:
            raise ConfigError(f"{where}: kind must be one of {', '.join(BACKUP_KINDS)}")
        out.append(BackupConfig(name=str(name), stores=tuple(dict.fromkeys(named)), retention_days=days,
                                where=place.strip(), kind=kind))
    return tuple(out)


def positive_int(options: Any, key: str, default: int, store: str) -> int:
    """A store option that bounds work (``max_rows``, ``max_carve_steps``): a whole number of at least 1, or
    ``default`` when absent; anything else is one ConfigError line."""
    raw = options.get(key, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if isinstance(raw, bool) or value < 1:
        raise ConfigError(f"store {store!r}: {key} must be a whole number of at least 1, not {raw!r}", store=store)
    return value


def _resolve(root: Path, value: Any, what: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a non-empty path string")
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The config path from ``--config``, else ``$TOMBSTONE_CONFIG``, else ``./tombstone.toml``."""
    if explicit:
        return Path(explicit)
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return Path.cwd() / CONFIG_NAME


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read and validate a config file; every problem is one ConfigError line."""
    from tombstone.inputs import CONFIG_LIMIT, read_user_file

    path = find_config(path).absolute()
    try:
        data = tomllib.loads(read_user_file(path, CONFIG_LIMIT, "config file").decode("utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path} (run 'tombstone init' or pass --config)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    root = path.parent
    section = data.get("tombstone", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: [tombstone] must be a table")
    stores_data = data.get("stores", {})
    if not isinstance(stores_data, dict):
        raise ConfigError(f"{path}: [stores] must be a table")
    stores: dict[str, StoreConfig] = {}
    for name, body in stores_data.items():
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: [stores.{name}] must be a table")
        options = dict(body)
        backend = options.pop("backend", None)
        if not isinstance(backend, str):
            raise ConfigError(f"{path}: store {name!r} needs a backend = \"...\" entry")
        for key, value in list(options.items()):
            if key == "path" or key.endswith("_path") or key.endswith("_dir"):
                options[key] = str(_resolve(root, value, f"stores.{name}.{key}"))
        stores[name] = StoreConfig(name=name, backend=backend, options=options)
    dsn = section.get("lineage_dsn")
    if dsn is not None and not (isinstance(dsn, str) and dsn.startswith(("postgresql://", "postgres://"))):
        raise ConfigError(f"{path}: tombstone.lineage_dsn must be a postgresql:// DSN")
    levels = section.get("levels", [lv.value for lv in Level if lv in DEFAULT_LEVELS])
    known = [lv.value for lv in Level]
    if not (isinstance(levels, list) and all(isinstance(lv, str) for lv in levels)):
        raise ConfigError(f"{path}: tombstone.levels must be a list of level names ({', '.join(known)})")
    unknown = [lv for lv in levels if lv not in known]
    if unknown:
        raise ConfigError(f"{path}: tombstone.levels names unknown level(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if Level.LOGICAL.value not in levels:
        raise ConfigError(f"{path}: tombstone.levels must include \"logical\": nothing is verified without it")
    auditor_keys = section.get("auditor_keys", [])
    if not (isinstance(auditor_keys, list) and all(isinstance(k, str) and k for k in auditor_keys)):
        raise ConfigError(f"{path}: tombstone.auditor_keys must be a list of public key file paths")
    return Config(
        path=path,
        lineage_dsn=dsn,
        auditor_keys=tuple(_resolve(root, k, "tombstone.auditor_keys") for k in auditor_keys),
        levels=frozenset(Level(lv) for lv in levels),
        lineage_db=_resolve(root, section.get("lineage_db", "lineage.db"), "tombstone.lineage_db"),
        keys_dir=_resolve(root, section.get("keys_dir", "keys"), "tombstone.keys_dir"),
        receipts_dir=_resolve(root, section.get("receipts_dir", "receipts"), "tombstone.receipts_dir"),
        stores=stores,
        backups=_backups(path, data.get("backups"), stores),
    )


def write_config(path: Path, stores: dict[str, dict[str, Any]] | None = None, *,
                 lineage_dsn: str | None = None, levels: Any = None) -> None:
    """Write a config file with default locations and the given stores (paths kept relative); ``levels``
    (level names or ``Level``s) is written only when given."""
    section: dict[str, Any] = {"lineage_db": "lineage.db", "keys_dir": "keys", "receipts_dir": "receipts"}
    if lineage_dsn:
        section["lineage_dsn"] = lineage_dsn
    if levels is not None:
        names = {Level(lv).value for lv in levels}
        section["levels"] = [lv.value for lv in Level if lv.value in names]
    data: dict[str, Any] = {"tombstone": section, "stores": stores or {}}
    from tombstone.fsutil import write_atomic

    write_atomic(path, tomli_w.dumps(data).encode("utf-8"))  # mode 0600: it may hold DSNs and hosts
