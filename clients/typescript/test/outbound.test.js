// The outbound rule: without `allowLocal` a verifier takes only an https:// base URL, and
// connects only to globally reachable addresses, the name looked up once; the whole request
// (connect and TLS handshake included) is bounded by `timeout`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { Verifier, VerificationError } from "../index.js";
import { globallyReachable } from "../outbound.js";
import { startServer } from "./server.js";

let s;
before(async () => {
  s = await startServer();
});
after(() => s.stop());

/** The error `p` rejects with ("ok" when it resolves). */
const outcome = (p) => p.then(() => "ok", (e) => e);

/** A TCP port on 127.0.0.1 (and ::1 where it can) that counts the connections it accepts and
 * answers none of them: {port, accepted, stop}. */
async function listening() {
  const accepted = [];
  const sockets = [];
  const serve = (host, port) =>
    new Promise((resolve, reject) => {
      const server = createServer((socket) => {
        accepted.push(socket.remoteAddress);
        sockets.push(socket);
      });
      server.once("error", reject).listen(port, host, () => resolve(server));
    });
  const v4 = await serve("127.0.0.1", 0);
  const port = v4.address().port;
  const v6 = await serve("::1", port).catch(() => null);
  return {
    port,
    accepted,
    stop: () => {
      for (const socket of sockets) socket.destroy();
      v4.close();
      v6?.close();
    },
  };
}

test("a plain http base URL is refused when the verifier is made, unless allowLocal", async () => {
  const [id, token] = await s.register();
  assert.throws(() => new Verifier({ baseUrl: s.base, issuers: ["example.com"] }), (e) => e instanceof TypeError && /allowLocal/.test(e.message));
  assert.throws(() => new Verifier({ baseUrl: s.base, issuers: ["example.com"], allowLocal: false }), TypeError);
  const local = new Verifier({ baseUrl: s.base, issuers: ["example.com"], allowLocal: true });
  assert.equal((await local.verify(token)).agentId, id);
});

test("a base URL with credentials is refused; the scheme is read in any case", () => {
  for (const baseUrl of ["https://u:p@id.example.com", "https://id.example.com@evil.example/", "http://u@127.0.0.1:9"]) {
    assert.throws(() => new Verifier({ baseUrl, issuers: ["example.com"], allowLocal: true }), (e) => e instanceof TypeError && /credentials/.test(e.message), baseUrl);
  }
  assert.ok(new Verifier({ baseUrl: "HTTPS://id.example.com", issuers: ["example.com"] }));
  assert.throws(() => new Verifier({ baseUrl: "HTTP://id.example.com", issuers: ["example.com"] }), TypeError);
});

test("https to a loopback address fails closed, with no connection made", async () => {
  const [, token] = await s.register();
  const l = await listening();
  try {
    for (const host of ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"]) {
      const v = new Verifier({ baseUrl: `https://${host}:${l.port}`, issuers: ["example.com"], timeout: 2 });
      for (const method of ["verify", "verifyOnline"]) {
        const e = await outcome(v[method](token));
        assert.ok(e instanceof VerificationError, `${host} ${method}: ${e}`);
        assert.equal(e.code, "UNAVAILABLE", `${host} ${method}`);
        assert.match(e.message, /not globally reachable \(allowLocal/, `${host} ${method}`);
      }
    }
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(l.accepted, []);
  } finally {
    l.stop();
  }
});

test("a hung TLS handshake or a body that never ends is UNAVAILABLE within the timeout", async () => {
  // Accepted, and then nothing: no TLS handshake (https), or headers and a body that trickles
  // forever (http): the timeout bounds the whole request, not the wait for headers alone.
  const [, token] = await s.register();
  const l = await listening();
  const trickle = createServer((socket) => {
    socket.on("error", () => {});
    socket.write("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n");
    const timer = setInterval(() => socket.write("1\r\n \r\n"), 50);
    socket.on("close", () => clearInterval(timer));
  });
  await new Promise((r) => trickle.listen(0, "127.0.0.1", r));
  try {
    for (const baseUrl of [`https://127.0.0.1:${l.port}`, `http://127.0.0.1:${trickle.address().port}`]) {
      const v = new Verifier({ baseUrl, allowLocal: true, timeout: 0.5 });
      const started = Date.now();
      const e = await outcome(v.verifyOnline(token));
      assert.equal(e.code, "UNAVAILABLE", `${baseUrl}: ${e}`);
      assert.ok(Date.now() - started < 2000, `${baseUrl}: ${Date.now() - started} ms`);
    }
  } finally {
    l.stop();
    trickle.closeAllConnections?.();
    trickle.close();
  }
});

test("which addresses are globally reachable: the service's rule", () => {
  const table = {
    "10.1.2.3": false,
    "100.64.0.1": false,
    "127.0.0.1": false,
    "169.254.169.254": false,
    "192.0.0.1": false,
    "192.0.0.9": true,
    "198.18.0.1": false,
    "224.0.0.1": false,
    "255.255.255.255": false,
    "0.0.0.0": false,
    "8.8.8.8": true,
    "::": false,
    "::1": false,
    "fe80::1": false,
    "fe80::1%eth0": false,
    "fc00::1": false,
    "ff02::1": false,
    "2001:db8::1": false,
    "::ffff:10.0.0.1": false,
    "::ffff:8.8.8.8": true,
    "::ffff:7f00:1": false,
    "::127.0.0.1": false,
    "64:ff9b::7f00:1": false,
    "64:ff9b::808:808": true,
    "2002:7f00:1::": false,
    "2002:808:808::1": true,
    // Teredo: the client's address inverted in the last 32 bits (~127.0.0.1, ~8.8.8.8).
    "2001:0:4136:e378:8000:63bf:80ff:fffe": false,
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7": true,
    "2606:4700::1": true,
    "2001:4:112::1": true,
    "2001:2::1": false,
    "3fff::1": false,
    "not an address": false,
    "1.2.3": false,
  };
  for (const [ip, global] of Object.entries(table)) assert.equal(globallyReachable(ip), global, ip);
});
