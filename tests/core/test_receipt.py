"""Receipts: schema, canonical hashing, Ed25519 signature, chain, and tamper detection."""

from __future__ import annotations

import base64
import copy
import json

import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tombstone.errors import ReceiptError
from tombstone.keys import load_private_key
from tombstone.receipt import body_hash, canonical_bytes, receipt_schema, sign, verify
from tombstone.receipt.canonical import UNSIGNED_FIELDS

from support import write_docs


@pytest.fixture
def signed(tomb):
    """A real receipt from an erasure, plus a vector artifact with a fingerprint, re-signed."""
    write_docs(tomb, "alice", 2)
    write_docs(tomb, "bob", 1)
    receipt, _ = tomb.erase("alice")
    body = {k: v for k, v in receipt.items() if k not in UNSIGNED_FIELDS}
    vector = copy.deepcopy(body["artifacts"][0])
    vector.update(artifact_id="vec-1", backend="chroma", kind="vector",
                  fingerprint=[0.125, -0.5, 0.03125, 1e-7] + [0.0] * 28)
    body["artifacts"].append(vector)
    body["summary"]["VERIFIED"] += 1
    key = load_private_key(tomb.config.keys_dir)
    return sign(body, key), key.public_key()


def test_real_receipt_is_valid_and_matches_schema(signed):
    receipt, public = signed
    jsonschema.validate(receipt, receipt_schema())
    assert verify(receipt, public).receipt_hash == receipt["receipt_hash"]
    for field in ("schema_version", "subject", "saga_id", "started_at", "finished_at", "tool",
                  "previous_receipt_hash", "receipt_hash", "signature"):
        assert field in receipt
    art = receipt["artifacts"][0]
    for field in ("artifact_id", "store", "backend", "status", "level", "reason", "measurement",
                  "evidence", "fingerprint"):
        assert field in art
    assert receipt["signature"]["algorithm"] == "ed25519"


def test_wrong_key_fails(signed):
    receipt, _ = signed
    with pytest.raises(ReceiptError, match="not by the trusted key"):
        verify(receipt, Ed25519PrivateKey.generate().public_key())


def test_forged_key_id_fails(signed):
    """Re-labelling the key id to an attacker's key and re-hashing does not help: the signature fails."""
    receipt, _ = signed
    attacker = Ed25519PrivateKey.generate()
    forged = sign({k: v for k, v in receipt.items() if k not in UNSIGNED_FIELDS}, attacker)
    with pytest.raises(ReceiptError):
        verify(forged, signed[1])


def test_canonical_form_is_order_independent():
    a = {"b": 1, "a": [1.5, {"y": None, "x": "é"}]}
    b = json.loads(json.dumps(a, indent=4, sort_keys=False))
    assert canonical_bytes(a) == canonical_bytes(b) == '{"a":[1.5,{"x":"é","y":null}],"b":1}'.encode()


def test_pretty_printed_file_still_verifies(signed):
    receipt, public = signed
    reread = json.loads(json.dumps(receipt, indent=2))
    verify(reread, public)


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    else:
        yield path


def _mutate(value, seed: int):
    if isinstance(value, bool):
        return not value
    if value is None:
        return "x" if seed % 2 else 0
    if isinstance(value, int):
        return value + 1 + seed % 5
    if isinstance(value, float):
        return value + 1.0 + seed % 3 if seed % 2 else -value - 0.5
    if isinstance(value, str):
        if not value:
            return "x"
        i = seed % len(value)
        replacement = "A" if value[i] != "A" else "B"
        return value[:i] + replacement + value[i + 1 :]
    raise AssertionError(type(value))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_any_single_value_change_is_detected(signed, data):
    receipt, public = signed
    paths = list(_leaves(receipt))
    path = data.draw(st.sampled_from(paths), label="path")
    seed = data.draw(st.integers(min_value=0, max_value=10_000), label="seed")
    tampered = copy.deepcopy(receipt)
    node = tampered
    for key in path[:-1]:
        node = node[key]
    original = node[path[-1]]
    node[path[-1]] = _mutate(original, seed)
    assert node[path[-1]] != original or type(node[path[-1]]) is not type(original)
    with pytest.raises(ReceiptError):
        verify(tampered, public)


@pytest.mark.parametrize("path", [("artifacts", 0, "status"), ("artifacts", 0, "level"),
                                  ("artifacts", 0, "artifact_id"), ("artifacts", -1, "fingerprint", 1),
                                  ("finished_at",), ("receipt_hash",), ("signature", "value")])
def test_named_fields_are_protected(signed, path):
    receipt, public = signed
    tampered = copy.deepcopy(receipt)
    node = tampered
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = {"status": "RESIDUAL", "level": "logical"}.get(path[-1], _mutate(node[path[-1]], 7))
    with pytest.raises(ReceiptError):
        verify(tampered, public)


def test_removing_or_adding_a_field_is_detected(signed):
    receipt, public = signed
    extra = copy.deepcopy(receipt)
    extra["artifacts"][0]["note"] = "added"
    with pytest.raises(ReceiptError):
        verify(extra, public)
    dropped = copy.deepcopy(receipt)
    dropped["artifacts"].pop()
    with pytest.raises(ReceiptError):
        verify(dropped, public)


def test_receipts_chain(tomb):
    write_docs(tomb, "alice", 1)
    write_docs(tomb, "bob", 1)
    first, _ = tomb.erase("alice")
    second, _ = tomb.erase("bob")
    assert first["previous_receipt_hash"] is None and first["sequence"] == 1
    assert second["previous_receipt_hash"] == first["receipt_hash"] and second["sequence"] == 2
    assert tomb.lineage.chain_head() == (2, second["receipt_hash"])
    assert body_hash(second) == second["receipt_hash"]


def test_the_chain_keeps_each_receipt_deflated_and_gives_back_its_canonical_bytes(tomb):
    """A chain row holds the signed receipt sealed and deflated: it reads back as the receipt's exact canonical
    bytes, takes a fraction of their size in the lineage db, and a row sealed before rows were deflated (the
    JSON itself) still reads back."""
    from tombstone.lineage.sagas import packed

    write_docs(tomb, "alice", 6)
    receipt, _ = tomb.erase("alice")
    row = tomb.lineage.receipts()[-1]
    assert row["body"] == canonical_bytes(receipt) == tomb.lineage.receipt_for_saga(receipt["saga_id"])
    stored = tomb.lineage._conn.execute("SELECT receipt_sealed FROM receipts WHERE saga_id = ?",
                                        (receipt["saga_id"],)).fetchone()[0]
    assert len(stored) < len(row["body"]) / 3
    assert tomb.lineage.secret.unseal(bytes(stored)) == packed(row["body"]) != row["body"]
    # a row from before: the canonical bytes sealed as they are
    with tomb.lineage.atomic() as conn:
        conn.execute("UPDATE receipts SET receipt_sealed = ? WHERE saga_id = ?",
                     (tomb.lineage.secret.seal(row["body"]), receipt["saga_id"]))
    assert tomb.lineage.receipt_for_saga(receipt["saga_id"]) == canonical_bytes(receipt)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(data=st.data())
def test_the_fast_schema_check_never_accepts_what_jsonschema_rejects(signed, data):
    """validate_schema takes jsonschema-rs's "valid" without asking jsonschema again: on receipts changed in
    one place (a value, its type, a field removed or added) the two must agree, or at least the fast one
    must reject whatever jsonschema rejects."""
    from tombstone.receipt.signing import _fast_validator, _validator

    receipt, _ = signed
    assert _fast_validator().is_valid(receipt)
    assert not _fast_validator().is_valid({**receipt, "artifacts": "none"})  # control: it can reject
    paths = list(_leaves(receipt))
    path = data.draw(st.sampled_from(paths), label="path")
    how = data.draw(st.sampled_from(["value", "type", "drop", "add"]), label="how")
    seed = data.draw(st.integers(min_value=0, max_value=10_000), label="seed")
    changed = copy.deepcopy(receipt)
    node = changed
    for key in path[:-1]:
        node = node[key]
    if how == "value":
        node[path[-1]] = _mutate(node[path[-1]], seed)
    elif how == "type":
        node[path[-1]] = [None, 1, 1.5, "s", True, [], {}][seed % 7]
    elif how == "drop" and isinstance(node, dict):
        del node[path[-1]]
    elif isinstance(node, dict):
        node[f"extra_{seed}"] = seed
    rejected = next(iter(_validator().iter_errors(changed)), None) is not None
    assert _fast_validator().is_valid(changed) == (not rejected)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@given(value=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_the_receipt_file_reads_back_as_the_receipt(value):
    """What ``pretty`` writes (orjson, or the standard library for what orjson cannot write exactly) parses back
    to the same value, indented and with sorted keys, as the standard library's own indented output does."""
    from tombstone.receipt import pretty

    text = pretty(value)
    assert json.loads(text) == value == json.loads(json.dumps(value))
    assert text.endswith(b"\n") and list(json.loads(text)) == sorted(value) or not value


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_receipt_file_refuses_what_json_cannot_hold(bad):
    from tombstone.receipt import pretty

    with pytest.raises(ValueError):
        pretty({"summary": {"x": [1, bad]}})


def test_the_bytes_the_chain_stores_are_the_whole_receipts_canonical_form(signed):
    """``signed`` encodes each member once and joins them: the result equals ``canonical_bytes`` of the whole
    receipt, and the hash covers the body's own canonical bytes."""
    from tombstone.receipt.canonical import hash_of, signed_body
    from tombstone.receipt.signing import signed as sign_with_bytes

    receipt, public = signed
    body = {k: v for k, v in receipt.items() if k not in UNSIGNED_FIELDS}
    body["artifacts"][0]["evidence"]["note"] = {"b": [1e-7, 2.5, None, True, "ünïcode \u2028 \"quoted\" \\ \x01"],
                                                "a": {"é": 1}}
    again, data = sign_with_bytes(body, Ed25519PrivateKey.generate())
    assert data == canonical_bytes(again)
    assert again["receipt_hash"] == hash_of(signed_body(again)) and again["receipt_hash"] != receipt["receipt_hash"]


def test_a_signature_changed_only_in_its_unused_base64_bits_is_refused(signed):
    """The last character before the padding carries bits no byte uses: changing them decodes to the same
    signature, but it is still a change to the receipt, and it is refused."""
    receipt, public = signed
    value = receipt["signature"]["value"]
    assert value.endswith("==")
    verify(receipt, public)  # the control: as signed, it verifies
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(value[-3])
    tampered = copy.deepcopy(receipt)
    tampered["signature"]["value"] = value[:-3] + alphabet[last ^ 1] + "=="
    assert base64.b64decode(tampered["signature"]["value"]) == base64.b64decode(value)
    with pytest.raises(ReceiptError):
        verify(tampered, public)
