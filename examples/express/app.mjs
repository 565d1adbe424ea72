// An Express service whose /orders route only a verified agent with the read:orders scope may
// call. AGENTID_URL names the agentid service; AGENTID_ISSUERS the issuer domains whose agents
// may call (comma-separated: any organization can register agents, only the issuer says whose
// they are); PORT the port to listen on (3000); AGENTID_ALLOW_LOCAL=1, for development only,
// lets AGENTID_URL be plain http or a loopback/private address. Test-mode tokens are refused.
import express from "express";
import { Verifier } from "@agentid/verifier";
import { agentIdMiddleware } from "@agentid/verifier/express";

const verifier = new Verifier({
  baseUrl: process.env.AGENTID_URL,
  issuers: process.env.AGENTID_ISSUERS.split(","),
  allowLocal: process.env.AGENTID_ALLOW_LOCAL === "1",
});
const app = express();

app.get("/health", (req, res) => res.json({ ok: true })); // open: no middleware
app.get("/orders", agentIdMiddleware(verifier, { scopes: ["read:orders"] }), (req, res) => {
  res.json({ agent_id: req.agent.agentId, issuer: req.agent.issuer });
});

app.listen(Number(process.env.PORT ?? 3000), "127.0.0.1");
