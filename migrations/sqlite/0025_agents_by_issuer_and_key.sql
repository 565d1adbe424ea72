-- A name's agents (its signature directory, whether it has agents here, a moved name's
-- revocations) by issuer domain, and a signed request's signer by its key's thumbprint: each
-- an index lookup, not a scan of every agent.
CREATE INDEX agents_by_issuer ON agents (issuer_domain, id);
CREATE INDEX agents_by_key ON agents (jkt) WHERE jkt IS NOT NULL;
