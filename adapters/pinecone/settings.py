"""Where a Pinecone store's API key comes from and where it may be sent.

The key is a secret of whoever runs Tombstone, and a configuration file is something they may have been
handed. So a configuration cannot make the key go anywhere it likes: the key is read only from an
environment variable named ``PINECONE_*`` (``api_key_env``; default ``PINECONE_API_KEY``), never from
one holding another secret, and it is sent only to an ``https://`` host, unless the store says
``allow_insecure_host = true`` (a local emulator on plain HTTP, as the demo and ``tombstone check`` use).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from tombstone.errors import ConfigError, StoreUnavailableError

DEFAULT_KEY_ENV = "PINECONE_API_KEY"
KEY_ENV = re.compile(r"PINECONE_[A-Z0-9_]+")
"""The only environment variables a Pinecone key is read from."""
INSECURE_OPTION = "allow_insecure_host"
STOPPED_NOTE = "the demo's local Pinecone emulator has stopped; its host was removed from this store"
"""The ``note`` the demo leaves on its Pinecone store when its emulator stops (``hooks.forget_host``)."""


def key_env(store: str, options: Mapping[str, Any]) -> str:
    """The environment variable holding the store's key; ConfigError unless it is a ``PINECONE_*`` one."""
    env = str(options.get("api_key_env", DEFAULT_KEY_ENV))
    if not KEY_ENV.fullmatch(env):
        raise ConfigError(f"store {store!r}: api_key_env = {env!r}: a Pinecone key is read only from a PINECONE_*"
                          " variable, so a configuration cannot send another of your secrets to its host",
                          store=store)
    return env


def host(store: str, options: Mapping[str, Any]) -> str:
    """The store's data-plane host; ConfigError unless it is ``https://`` (or plain ``http://`` with
    ``allow_insecure_host = true``)."""
    value = str(options.get("host") or "")
    if not value and options.get("note") == STOPPED_NOTE:
        raise ConfigError(f"store {store!r} was served by the demo's local Pinecone emulator, which stopped when the"
                          f" demo ended (its host was removed from the config): to erase without it, pass"
                          f" --allow-missing-store {store} (its artifacts end UNVERIFIED(no adapter)); or rebuild"
                          f" the demo with 'tombstone demo --force'", store=store)
    if not value:
        raise ConfigError(f"store {store!r}: the pinecone backend needs host = \"https://...\"", store=store)
    parts = urlsplit(value)
    if parts.scheme == "https" and parts.hostname:
        return value
    if parts.scheme == "http" and parts.hostname and options.get(INSECURE_OPTION) is True:
        return value
    raise ConfigError(f"store {store!r}: host {value!r} must be an https:// URL (the API key is sent to it);"
                      f" only a local emulator on plain HTTP may be named, with {INSECURE_OPTION} = true",
                      store=store)


def api_key(store: str, options: Mapping[str, Any]) -> str:
    """The key, from the ``PINECONE_*`` variable the store names (checked first)."""
    env = key_env(store, options)
    key = os.environ.get(env)
    if not key:
        raise StoreUnavailableError(f"store {store!r}: no Pinecone API key: set {env}", store=store, retryable=False)
    return key


def connection(store: str, options: Mapping[str, Any]) -> tuple[str, str]:
    """(host, key) for a store, every rule above checked before the key is read."""
    where = host(store, options)
    return where, api_key(store, options)


def destination(store: str, options: Mapping[str, Any]) -> str:
    """What opening the store sends where, in words (for the auditor's refusal)."""
    env = str(options.get("api_key_env", DEFAULT_KEY_ENV))
    return f"your Pinecone API key (${env}) to {options.get('host') or 'its host'}"


__all__ = ["DEFAULT_KEY_ENV", "INSECURE_OPTION", "KEY_ENV", "api_key", "connection", "destination", "host", "key_env"]
