"""Tombstone's built-in backend adapters, one package per backend.

They use only the public adapter API (``tombstone.contract``) and register through the
``tombstone.adapters`` entry-point group, as a third-party adapter would.
"""
