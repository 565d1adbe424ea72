// Signed requests (Web Bot Auth, RFC 9421) checked offline: the signature base is built and
// the parameters read by Cloudflare's `web-bot-auth` (with `http-message-sig`), the
// structured fields by `structured-headers`, the Ed25519 signature by `node:crypto` (WebCrypto
// elsewhere). The key comes from the directory `Signature-Agent` names: the agentid
// service's own (`<baseUrl>/v1/directories/<issuer>`) or one the receiver trusts, fetched as
// the verifier fetches its key set (cached as the directory says, revalidated by ETag, one
// fetch at a time, its keys read once when it is fetched) and used past its freshness for at
// most `listGrace` seconds when it cannot be had (a fetch that brings no key set fails, and is
// not held): then UNAVAILABLE (fail closed), and with none held not fetched again for 1 s,
// doubling per failure up to 30 s. A revoked agent's key leaves its directory at once,
// so the receiver sees it at its next fetch (a minute at most), or at once when it takes the
// revocation's pushed event (`handleSet` drops the issuer's directory).
import { verify as webBotAuthVerify } from "web-bot-auth";
import { parseDictionary, parseItem } from "structured-headers";
import { b64urlStrict, publicKey, sha256, verified } from "./jws.js";

/** The tag Web Bot Auth signatures carry. */
const TAG = "web-bot-auth";
/** The longest a signature may be valid (`expires - created`). */
const MAX_VALIDITY = 24 * 60 * 60;
/** An issuer domain as the service names it in a directory's URL: lower case, two labels or more. */
const ISSUER = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$/;
/** The most keys read from a directory: as many as the service lists in one. */
const MAX_DIRECTORY_KEYS = 1_000;
/** RFC 7638 thumbprints of RFC 9421's published test keys (B.1.4 Ed25519, B.1.2 RSA-PSS, B.1.1
 * RSA), which the Web Bot Auth drafts' examples sign with: anyone can sign with them. */
const PUBLISHED_TEST_KEYS = new Set([
  "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",
  "oD0HwocPBSfpNy5W3bpJeyFGY_IQ_YpqxSjQ3Yd-CLA",
  "BHj8s0GPnMEQtkaULIM-PLgEhLBbuGUQ1vMxmBWZzEo",
]);
/** The Ed25519 test key's point, its sign bit cleared: the key or its negation. */
const TEST_POINT = b64urlStrict("JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs");
const isTestPoint = (x) => {
  let raw;
  try {
    raw = b64urlStrict(x);
  } catch {
    return false;
  }
  return raw.length === 32 && raw.subarray(0, 31).every((b, i) => b === TEST_POINT[i]) && (raw[31] & 0x7f) === (TEST_POINT[31] & 0x7f);
};
const encoder = new TextEncoder();

/** The URL `Signature-Agent` names: a bare string, or the dictionary member of `label` (else
 * its only one). */
function signatureAgent(field, label, fail) {
  try {
    const [value] = parseItem(field);
    if (typeof value === "string") return value;
  } catch {
    // a dictionary, below
  }
  let dict;
  try {
    dict = parseDictionary(field);
  } catch {
    fail("TOKEN_INVALID", "Signature-Agent is neither a string nor a structured dictionary");
  }
  const member = dict.get(label) ?? (dict.size === 1 ? [...dict.values()][0] : undefined);
  if (typeof member?.[0] !== "string") fail("TOKEN_INVALID", "Signature-Agent has no string for this signature");
  return member[0];
}

/** The signature tagged web-bot-auth: its label and covered component names. */
function covered(input, fail) {
  let dict;
  try {
    dict = parseDictionary(input);
  } catch {
    fail("TOKEN_INVALID", "Signature-Input is not a structured dictionary");
  }
  const found = [...dict].find(([, [items, params]]) => Array.isArray(items) && params.get("tag") === TAG);
  if (!found) fail("TOKEN_INVALID", `no signature tagged ${TAG}`);
  if (dict.size !== 1) fail("TOKEN_INVALID", "more than one signature: one is checked");
  const [label, [items, params]] = found;
  if (PUBLISHED_TEST_KEYS.has(params.get("keyid"))) {
    fail("TOKEN_INVALID", "signed with one of RFC 9421's published test keys, whose private half everyone has");
  }
  return { label, names: items.map(([name]) => name) };
}

/** The Ed25519 keys of a directory's JSON, by RFC 7638 thumbprint: its first
 * MAX_DIRECTORY_KEYS, a key that does not import (an `x` that is not a point's 32 bytes) and
 * RFC 9421's test key (or its negation) passed over. An Error when it is not a key set. */
async function directoryKeys(body) {
  const { keys } = JSON.parse(body) ?? {};
  if (!Array.isArray(keys)) throw new Error("not a key set");
  const found = new Map();
  for (const jwk of keys.slice(0, MAX_DIRECTORY_KEYS)) {
    if (jwk?.kty !== "OKP" || jwk.crv !== "Ed25519" || typeof jwk.x !== "string" || isTestPoint(jwk.x)) continue;
    let key;
    try {
      key = await publicKey({ kty: "OKP", crv: "Ed25519", x: jwk.x }, "EdDSA");
    } catch {
      continue; // a key that does not import: the others serve
    }
    found.set(await sha256(JSON.stringify({ crv: "Ed25519", kty: "OKP", x: jwk.x })), key);
  }
  return found;
}

/** `trusted` (the directories trusted beside the service's own) as an array of URLs; a
 * TypeError for a plain string, which would be searched as text (any directory whose URL is
 * part of it trusted), or for an entry that is not a string. */
export function trustedAgents(trusted) {
  if (!Array.isArray(trusted) || !trusted.every((u) => typeof u === "string")) {
    throw new TypeError(`trustedSignatureAgents must be an array of URLs, not ${JSON.stringify(trusted)}`);
  }
  return [...trusted];
}

/** `verifier`'s check of a signed request (see `Verifier.verifyRequest`). */
export async function verifyRequest(verifier, request, { trustedSignatureAgents = [] } = {}, fail) {
  trustedSignatureAgents = trustedAgents(trustedSignatureAgents);
  let message = request;
  if (!(request instanceof Request)) {
    try {
      message = new Request(request.url, { method: request.method ?? "GET", headers: request.headers ?? {} });
    } catch (e) {
      // A method fetch forbids (TRACE, TRACK, CONNECT), a URL or a header it cannot hold.
      fail("TOKEN_INVALID", `the request cannot be checked: ${e.message}`);
    }
  }
  const input = message.headers.get("signature-input");
  const agentField = message.headers.get("signature-agent");
  if (!input || !message.headers.get("signature")) fail("TOKEN_INVALID", "the request is not signed");
  const { label, names } = covered(input, fail);
  if (!names.includes("@authority") && !names.includes("@target-uri")) {
    fail("TOKEN_INVALID", "the signature covers neither @authority nor @target-uri");
  }
  if (!agentField) fail("TOKEN_INVALID", "no Signature-Agent: where the key is published is unknown");
  if (!names.includes("signature-agent")) fail("TOKEN_INVALID", "the signature does not cover Signature-Agent");
  const url = signatureAgent(agentField, label, fail);
  const ours = url.startsWith(`${verifier.baseUrl}/v1/directories/`);
  if (ours && !ISSUER.test(url.slice(`${verifier.baseUrl}/v1/directories/`.length))) {
    // Another spelling of a directory (upper case, a query, a fragment) would be held apart
    // from the one a pushed revocation drops.
    fail("TOKEN_INVALID", `the signature agent ${url} names no issuer domain as this service writes it`);
  }
  const issuer = ours ? url.slice(`${verifier.baseUrl}/v1/directories/`.length) : null;
  // Held to the issuers as a token is, before anything is fetched for it.
  if (ours && verifier.issuers && !verifier.issuers.has(issuer)) fail("TOKEN_INVALID", `issuer ${issuer} is not accepted`);
  if (!ours && !trustedSignatureAgents.includes(url)) {
    fail("TOKEN_INVALID", `the signature agent ${url} is neither the service's directory nor a trusted one`);
  }
  const keys = await verifier.directory(url);
  let checked;
  try {
    checked = await webBotAuthVerify(message, async (data, signature, params) => {
      const key = keys.get(params.keyid);
      if (!key) throw new Error(`the directory ${url} has no key ${params.keyid}`);
      const [created, expires] = [params.created, params.expires].map((d) => Math.floor(d.getTime() / 1000));
      if (!(expires > created) || expires - created > MAX_VALIDITY) throw new Error("valid more than 24 h");
      if (!(await verified(key, "EdDSA", encoder.encode(data), signature))) throw new Error("the signature does not verify");
      return { keyid: params.keyid, created, expires, nonce: params.nonce };
    });
  } catch (e) {
    fail("TOKEN_INVALID", `signed request: ${e.message}`);
  }
  // A nonce is kept until `expires`: one past it is not taken, whatever skew the check allowed.
  if (checked.expires <= Date.now() / 1000) fail("TOKEN_INVALID", "signed request: the signature has expired");
  // A token (`nonce=abc`) or a byte sequence is read as an object, a new one each time: never
  // remembered as the same nonce.
  if (checked.nonce !== undefined && typeof checked.nonce !== "string") {
    fail("PROOF_INVALID", "the signature's nonce is not a string");
  }
  // Remembered by its digest: a nonce is as long as the sender likes, for up to 24 h.
  if (checked.nonce !== undefined && !verifier.nonceOnce(checked.keyid, await sha256(checked.nonce), checked.expires)) {
    fail("PROOF_REPLAYED", "the signature's nonce was seen before");
  }
  return {
    signatureAgent: url,
    keyid: checked.keyid,
    tag: TAG,
    created: new Date(checked.created * 1000),
    expires: new Date(checked.expires * 1000),
    issuer,
  };
}

export { directoryKeys, PUBLISHED_TEST_KEYS };
