// Every connection the verifier opens goes through `get`: one GET, no redirect followed, the
// whole of it (name lookup, connect, TLS handshake, headers and body) under one deadline, the
// body read up to a bound. Unless `allowLocal` (development and tests), the URL must be
// https:// and its host is looked up once: every address it resolves to (or the IP literal
// itself) must be globally reachable, and the socket then goes to one of those addresses (no
// second lookup, which a rebinding DNS answer could swap), while TLS checks the certificate
// for the host name. "Globally reachable" is the agentid service's own rule (the IANA
// special-purpose address registries' column of that name): see `globallyReachable`.

/** `node:http`, `node:https`, `node:dns` and `node:net`, or null on a runtime without them. */
const node = await Promise.all(["node:http", "node:https", "node:dns", "node:net"].map((m) => import(m))).catch(() => null);

/** Special-purpose IPv4 blocks and whether each is globally reachable; the longest matching
 * prefix decides, and an address none matches is. */
const V4_SPECIAL = [
  ["0.0.0.0/8", false],
  ["10.0.0.0/8", false],
  ["100.64.0.0/10", false],
  ["127.0.0.0/8", false],
  ["169.254.0.0/16", false],
  ["172.16.0.0/12", false],
  ["192.0.0.0/24", false],
  ["192.0.0.9/32", true],
  ["192.0.0.10/32", true],
  ["192.0.2.0/24", false],
  ["192.31.196.0/24", true],
  ["192.52.193.0/24", true],
  ["192.88.99.0/24", false],
  ["192.168.0.0/16", false],
  ["192.175.48.0/24", true],
  ["198.18.0.0/15", false],
  ["198.51.100.0/24", false],
  ["203.0.113.0/24", false],
  ["224.0.0.0/4", false],
  ["240.0.0.0/4", false],
  ["255.255.255.255/32", false],
];

/** Special-purpose IPv6 blocks inside global unicast space (2000::/3); an address outside it
 * is not globally reachable, unless it carries an IPv4 address (then that one is judged). */
const V6_SPECIAL = [
  ["2001::/23", false],
  ["2001:1::1/128", true],
  ["2001:1::2/128", true],
  ["2001:1::3/128", true],
  ["2001:2::/48", false],
  ["2001:3::/32", true],
  ["2001:4:112::/48", true],
  ["2001:20::/28", true],
  ["2001:30::/28", true],
  ["2001:db8::/32", false],
  ["2620:4f:8000::/48", true],
  ["3fff::/20", false],
];

/** The four bytes of dotted-quad `text`, or null. */
function v4Bytes(text) {
  const parts = text.split(".");
  if (parts.length !== 4 || !parts.every((p) => /^(0|[1-9][0-9]{0,2})$/.test(p) && Number(p) < 256)) return null;
  return parts.map(Number);
}

/** The eight 16-bit groups of IPv6 `text` (a zone dropped, a trailing dotted quad taken), or
 * null. */
function v6Groups(text) {
  text = text.replace(/%.*$/s, "");
  const last = text.lastIndexOf(":");
  if (last < 0) return null;
  if (text.includes(".", last)) {
    const q = v4Bytes(text.slice(last + 1));
    if (!q) return null;
    text = `${text.slice(0, last + 1)}${((q[0] << 8) | q[1]).toString(16)}:${((q[2] << 8) | q[3]).toString(16)}`;
  }
  const halves = text.split("::");
  if (halves.length > 2) return null;
  const groups = (s) => (s === "" ? [] : s.split(":"));
  const head = groups(halves[0]);
  const tail = halves.length === 2 ? groups(halves[1]) : [];
  if (![...head, ...tail].every((g) => /^[0-9a-fA-F]{1,4}$/.test(g))) return null;
  const gap = 8 - head.length - tail.length;
  if (halves.length === 2 ? gap < 1 : gap !== 0) return null;
  return [...head, ...Array(halves.length === 2 ? gap : 0).fill("0"), ...tail].map((g) => parseInt(g, 16));
}

const v4Number = (b) => BigInt(((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]) >>> 0);
const v6Number = (g) => g.reduce((n, x) => (n << 16n) | BigInt(x), 0n);

/** `entries` (CIDR text, global) as {net, len, global}, `parseNet` reading the network. */
const prefixes = (entries, parseNet) =>
  entries.map(([cidr, global]) => {
    const [ip, len] = cidr.split("/");
    return { net: parseNet(ip), len: BigInt(len), global };
  });
const V4 = prefixes(V4_SPECIAL, (ip) => v4Number(v4Bytes(ip)));
const V6 = prefixes(V6_SPECIAL, (ip) => v6Number(v6Groups(ip)));

/** Whether the longest entry of `table` matching `n` (`width` bits) says global; undefined
 * when none matches. */
function longestMatch(n, width, table) {
  let best;
  for (const e of table) {
    const shift = BigInt(width) - e.len;
    if (n >> shift === e.net >> shift && (!best || e.len > best.len)) best = e;
  }
  return best?.global;
}

/** The IPv4 address (four bytes) IPv6 groups `g` carry, in the forms that route to it:
 * IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d, not :: nor ::1), NAT64
 * (64:ff9b::/96), 6to4 (2002::/16, in the next 32 bits) and Teredo (2001:0::/32, the client's
 * address inverted in the last 32 bits); null for any other. */
function embeddedV4(g) {
  const bytes = (a, b) => [a >> 8, a & 0xff, b >> 8, b & 0xff];
  if (g.slice(0, 5).every((x) => x === 0) && (g[5] === 0xffff || g[5] === 0) && !(g[5] === 0 && g[6] === 0)) return bytes(g[6], g[7]);
  if (g[0] === 0x64 && g[1] === 0xff9b && g.slice(2, 6).every((x) => x === 0)) return bytes(g[6], g[7]);
  if (g[0] === 0x2002) return bytes(g[1], g[2]);
  if (g[0] === 0x2001 && g[1] === 0) return bytes(~g[6] & 0xffff, ~g[7] & 0xffff);
  return null;
}

/** Whether IP address `ip` (text, IPv6 without brackets) is globally reachable, as the agentid
 * service judges it; false for text that is no IP address. Exported for the tests; not part
 * of the declared API. */
export function globallyReachable(ip) {
  const v4 = v4Bytes(ip);
  if (v4) return longestMatch(v4Number(v4), 32, V4) ?? true;
  const g = v6Groups(ip);
  if (!g) return false;
  const inner = embeddedV4(g);
  if (inner) return longestMatch(v4Number(inner), 32, V4) ?? true;
  return (g[0] & 0xe000) === 0x2000 && (longestMatch(v6Number(g), 128, V6) ?? true);
}

/** The addresses to connect to for `host` (a name, or an IP literal without brackets): looked
 * up once, every address checked unless `allowLocal`. */
async function checkedAddresses(host, allowLocal) {
  const family = node[3].isIP(host);
  const addresses = family ? [{ address: host, family }] : await node[2].promises.lookup(host, { all: true });
  if (!addresses.length) throw new Error(`${host} resolves to no address`);
  if (!allowLocal && !addresses.every((a) => globallyReachable(a.address))) {
    throw new Error(`${host} ${family ? "is" : "resolves to an address that is"} not globally reachable (allowLocal for development)`);
  }
  return addresses;
}

/** GETs `url` with `headers`, no redirect followed: `{status, headers, body}`, `body` (text)
 * for a 200 only, `headers.get(name)` as fetch's. Rejects (an Error) past `timeoutMs` for the
 * whole request, past `limit` bytes of body, for a URL that is not https:// or a host not
 * globally reachable (unless `allowLocal`), and when the connection fails. */
export function get(url, headers, { timeoutMs, allowLocal, limit }) {
  return new Promise((resolve, reject) => {
    let req;
    let done = false;
    const finish = (error, value) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      req?.destroy();
      if (error) reject(error);
      else resolve(value);
    };
    const timer = setTimeout(() => finish(new Error(`no answer within ${timeoutMs / 1000} s`)), timeoutMs);
    (async () => {
      if (!node) throw new Error("this runtime has no node:http, node:https and node:dns to check the addresses it connects to");
      const target = new URL(url);
      if (target.username || target.password) throw new Error("a URL with credentials is refused");
      const https = target.protocol === "https:";
      if (!https && !(allowLocal && target.protocol === "http:")) {
        throw new Error(`${target.protocol === "http:" ? "plain http" : target.protocol} is refused: https only (allowLocal for development)`);
      }
      const addresses = await checkedAddresses(target.hostname.replace(/^\[(.*)\]$/, "$1"), allowLocal);
      if (done) return;
      // The checked addresses, never a second lookup: all of them when the socket tries each
      // in turn (Node's default), else the first.
      const lookup = (_name, options, callback) =>
        options?.all ? callback(null, addresses) : callback(null, addresses[0].address, addresses[0].family);
      req = node[https ? 1 : 0].request(target, { headers, agent: false, lookup }, (res) => {
        const answer = {
          status: res.statusCode,
          headers: { get: (name) => (res.headers[name.toLowerCase()] === undefined ? null : [res.headers[name.toLowerCase()]].flat().join(", ")) },
        };
        if (res.statusCode !== 200) return finish(null, answer);
        const chunks = [];
        let size = 0;
        res.on("data", (chunk) => {
          size += chunk.length;
          if (size > limit) finish(new Error(`over ${limit} bytes`));
          else chunks.push(chunk);
        });
        res.on("end", () => finish(null, { ...answer, body: new TextDecoder().decode(Buffer.concat(chunks)) }));
        res.on("error", finish);
        res.on("aborted", () => finish(new Error("the answer was cut short")));
      });
      req.on("error", finish);
      req.end();
    })().catch(finish);
  });
}
