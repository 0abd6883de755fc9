// Receipt verification in the browser: strict JSON, the canonical form of src/tombstone/receipt/canonical.py,
// SHA-256 and Ed25519 through WebCrypto. The reader need not trust the server's word for a signature.
//
// Canonical form (Python's json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
// allow_nan=False), UTF-8): keys sorted by code point; strings escaped as Python escapes them; integers
// as written (Python keeps them exact); numbers with a fraction or exponent are floats, written the way
// Python's repr writes a float (shortest round-trip digits, exponent form below 1e-4 and from 1e16 on,
// always a ".0" on an integral value). That is why numbers are kept as their source text when parsing.
"use strict";
(function (root) {
  class JNum {
    constructor(raw) { this.raw = raw; this.isFloat = /[.eE]/.test(raw); }
  }

  class ParseError extends Error {}

  // Strict JSON as receipts use it: no duplicate keys, no NaN/Infinity, bounded nesting.
  function parseStrict(text) {
    let i = 0;
    const MAX_DEPTH = 512;
    const fail = (msg) => { throw new ParseError(msg + " at character " + i); };
    const ws = () => { while (i < text.length && " \t\n\r".includes(text[i])) i++; };
    function value(depth) {
      if (depth > MAX_DEPTH) fail("nested too deeply");
      ws();
      const c = text[i];
      if (c === "{") return object(depth + 1);
      if (c === "[") return array(depth + 1);
      if (c === "\"") return string();
      if (c === "-" || (c >= "0" && c <= "9")) return number();
      if (text.startsWith("true", i)) { i += 4; return true; }
      if (text.startsWith("false", i)) { i += 5; return false; }
      if (text.startsWith("null", i)) { i += 4; return null; }
      fail("unexpected " + (c === undefined ? "end of text" : JSON.stringify(c)));
    }
    function object(depth) {
      i++;
      const out = new Map();
      ws();
      if (text[i] === "}") { i++; return out; }
      for (;;) {
        ws();
        if (text[i] !== "\"") fail("expected a key");
        const key = string();
        if (out.has(key)) fail("duplicate key " + JSON.stringify(key));
        ws();
        if (text[i] !== ":") fail("expected ':'");
        i++;
        out.set(key, value(depth));
        ws();
        if (text[i] === ",") { i++; continue; }
        if (text[i] === "}") { i++; return out; }
        fail("expected ',' or '}'");
      }
    }
    function array(depth) {
      i++;
      const out = [];
      ws();
      if (text[i] === "]") { i++; return out; }
      for (;;) {
        out.push(value(depth));
        ws();
        if (text[i] === ",") { i++; continue; }
        if (text[i] === "]") { i++; return out; }
        fail("expected ',' or ']'");
      }
    }
    function string() {
      i++;
      let out = "";
      for (;;) {
        if (i >= text.length) fail("unterminated string");
        const c = text[i];
        if (c === "\"") { i++; return out; }
        if (c < " ") fail("control character in string");
        if (c !== "\\") { out += c; i++; continue; }
        const e = text[i + 1];
        const simple = { "\"": "\"", "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };
        if (e in simple) { out += simple[e]; i += 2; continue; }
        if (e === "u" && /^[0-9a-fA-F]{4}$/.test(text.slice(i + 2, i + 6))) {
          out += String.fromCharCode(parseInt(text.slice(i + 2, i + 6), 16));
          i += 6;
          continue;
        }
        fail("bad escape");
      }
    }
    function number() {
      const m = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(text.slice(i, i + 1100));
      if (!m) fail("bad number");
      i += m[0].length;
      return new JNum(m[0]);
    }
    const result = value(0);
    ws();
    if (i !== text.length) fail("extra data after the JSON value");
    return result;
  }

  // A float written as Python's repr writes it.
  function pyFloat(x) {
    if (!Number.isFinite(x)) throw new ParseError("a number out of range has no canonical form");
    if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
    const sign = x < 0 ? "-" : "";
    const [mant, expText] = Math.abs(x).toExponential().split("e");
    const digits = mant.replace(".", "");
    const decpt = parseInt(expText, 10) + 1;  // value = 0.DIGITS x 10^decpt
    if (decpt <= -4 || decpt > 16) {
      const e = decpt - 1;
      const exp = (e < 0 ? "-" : "+") + String(Math.abs(e)).padStart(2, "0");
      return sign + digits[0] + (digits.length > 1 ? "." + digits.slice(1) : "") + "e" + exp;
    }
    if (decpt <= 0) return sign + "0." + "0".repeat(-decpt) + digits;
    if (decpt >= digits.length) return sign + digits + "0".repeat(decpt - digits.length) + ".0";
    return sign + digits.slice(0, decpt) + "." + digits.slice(decpt);
  }

  function pyInt(raw) {
    return /^-0+$/.test(raw) ? "0" : raw;
  }

  function pyString(s) {
    let out = "\"";
    for (let k = 0; k < s.length; k++) {
      const c = s.charCodeAt(k);
      if (c >= 0xd800 && c <= 0xdbff) {
        const d = s.charCodeAt(k + 1);
        if (!(d >= 0xdc00 && d <= 0xdfff)) throw new ParseError("a lone surrogate has no UTF-8 form");
        out += s[k] + s[k + 1];
        k++;
        continue;
      }
      if (c >= 0xdc00 && c <= 0xdfff) throw new ParseError("a lone surrogate has no UTF-8 form");
      if (c === 0x22) out += "\\\"";
      else if (c === 0x5c) out += "\\\\";
      else if (c === 0x0a) out += "\\n";
      else if (c === 0x0d) out += "\\r";
      else if (c === 0x09) out += "\\t";
      else if (c === 0x08) out += "\\b";
      else if (c === 0x0c) out += "\\f";
      else if (c < 0x20) out += "\\u" + c.toString(16).padStart(4, "0");
      else out += s[k];
    }
    return out + "\"";
  }

  // Python sorts str keys by code point; JavaScript's default sort compares UTF-16 code units.
  function byCodePoint(a, b) {
    const x = Array.from(a), y = Array.from(b);
    for (let k = 0; k < Math.min(x.length, y.length); k++) {
      const d = x[k].codePointAt(0) - y[k].codePointAt(0);
      if (d) return d;
    }
    return x.length - y.length;
  }

  function canonical(v) {
    if (v === null) return "null";
    if (v === true) return "true";
    if (v === false) return "false";
    if (v instanceof JNum) return v.isFloat ? pyFloat(Number(v.raw)) : pyInt(v.raw);
    if (typeof v === "string") return pyString(v);
    if (Array.isArray(v)) return "[" + v.map(canonical).join(",") + "]";
    if (v instanceof Map) {
      const keys = Array.from(v.keys()).sort(byCodePoint);
      return "{" + keys.map((k) => pyString(k) + ":" + canonical(v.get(k))).join(",") + "}";
    }
    throw new ParseError("not a JSON value");
  }

  const UNSIGNED_FIELDS = ["receipt_hash", "signature"];

  function signedBody(receipt) {
    const body = new Map();
    for (const [k, val] of receipt) if (!UNSIGNED_FIELDS.includes(k)) body.set(k, val);
    return new TextEncoder().encode(canonical(body));
  }

  const hex = (bytes) => Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, "0")).join("");

  function b64decode(text) {
    const bin = atob(text);
    return Uint8Array.from(bin, (ch) => ch.charCodeAt(0));
  }

  async function keyIdOf(raw) {
    return "ed25519:" + hex(await crypto.subtle.digest("SHA-256", raw)).slice(0, 16);
  }

  // The raw 32 bytes of an Ed25519 public key in PEM (SubjectPublicKeyInfo), or an error.
  function rawFromPem(pem) {
    const body = pem.replace(/-----(BEGIN|END) PUBLIC KEY-----/g, "").replace(/\s+/g, "");
    const der = b64decode(body);
    const prefix = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
    if (der.length !== 44 || prefix.some((b, k) => der[k] !== b)) throw new Error("not an Ed25519 public key (PEM)");
    return der.slice(12);
  }

  const field = (map, key) => (map instanceof Map ? map.get(key) : undefined);

  // Verify a receipt's text against a raw Ed25519 public key: hash, key id, signature.
  async function verifyReceipt(text, rawKey) {
    const result = { ok: false, stage: "format", message: "", subject: null, sequence: null, receipt_hash: null };
    if (!(root.crypto && crypto.subtle)) {
      result.stage = "unavailable";
      result.message = "this browser offers no WebCrypto here (the page must be served from localhost or over HTTPS)";
      return result;
    }
    let receipt;
    try {
      receipt = parseStrict(text);
    } catch (err) {
      result.message = "not strict JSON: " + err.message;
      return result;
    }
    const signature = field(receipt, "signature");
    const claimed = field(receipt, "receipt_hash");
    if (!(receipt instanceof Map) || typeof claimed !== "string" || !(signature instanceof Map)
        || typeof field(signature, "value") !== "string" || typeof field(signature, "key_id") !== "string") {
      result.message = "not a receipt: receipt_hash and signature are missing";
      return result;
    }
    const subject = field(receipt, "subject");
    result.subject = typeof subject === "string" ? subject : null;
    const seq = field(receipt, "sequence");
    result.sequence = seq instanceof JNum ? seq.raw : null;
    result.receipt_hash = claimed;
    let body;
    try {
      body = signedBody(receipt);
    } catch (err) {
      result.message = "no canonical form: " + err.message;
      return result;
    }
    const actual = "sha256:" + hex(await crypto.subtle.digest("SHA-256", body));
    if (actual !== claimed) {
      result.stage = "hash";
      result.message = "hash mismatch: content hashes to " + actual + ", receipt says " + claimed;
      return result;
    }
    const trusted = await keyIdOf(rawKey);
    if (field(signature, "key_id") !== trusted) {
      result.stage = "key";
      result.message = "signed by key " + field(signature, "key_id") + ", not by the trusted key " + trusted;
      return result;
    }
    let valid = false;
    try {
      const key = await crypto.subtle.importKey("raw", rawKey, { name: "Ed25519" }, false, ["verify"]);
      valid = await crypto.subtle.verify({ name: "Ed25519" }, key, b64decode(field(signature, "value")), body);
    } catch (err) {
      result.stage = "signature";
      result.message = "signature could not be checked: " + (err && err.message ? err.message : err);
      return result;
    }
    if (!valid) {
      result.stage = "signature";
      result.message = "signature does not verify";
      return result;
    }
    result.ok = true;
    result.stage = "ok";
    result.message = "signature verified against " + trusted;
    return result;
  }

  root.TombstoneVerify = {
    parseStrict, canonical, signedBody, verifyReceipt, keyIdOf, rawFromPem, b64decode, hex, pyFloat, JNum,
    canonicalBytes: (text) => new TextEncoder().encode(canonical(parseStrict(text))),
    signedBodyOf: (text) => signedBody(parseStrict(text)),
  };
})(typeof window !== "undefined" ? window : globalThis);
