"""A Flask service whose /orders route only a verified agent with the read:orders scope may
call. AGENTID_URL names the agentid service; AGENTID_ISSUERS the issuer domains whose agents
may call (comma-separated: any organization can register agents, only the issuer says whose
they are); PORT the port to listen on (8000); AGENTID_ALLOW_LOCAL=1 lets AGENTID_URL be plain
http or a local address (development). Test-mode tokens are refused."""

import os

from flask import Flask, g

from agentid_verifier import Verifier
from agentid_verifier.flask import require_agent

# AGENTID_ALLOW_LOCAL=1, for development only: an agentid service over plain http or on a
# local address (the verifier refuses both otherwise).
verifier = Verifier(os.environ["AGENTID_URL"], issuers=os.environ["AGENTID_ISSUERS"].split(","),
                    allow_local=os.environ.get("AGENTID_ALLOW_LOCAL") == "1")
app = Flask(__name__)


@app.get("/orders")
@require_agent(verifier, scopes=["read:orders"])
def orders():
    return {"agent_id": g.agent.agent_id, "issuer": g.agent.issuer}


@app.get("/health")  # open: no decorator
def health():
    return {"ok": True}


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
