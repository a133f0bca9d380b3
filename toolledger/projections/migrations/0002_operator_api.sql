-- The operator API: its bearer tokens, and the indexes its queries and metrics read.

-- Bearer tokens, stored hashed: only the SHA-256 of a token is kept, so a leaked table cannot be
-- replayed as credentials. token_id (a prefix of the hash) names a token for `tokens revoke`.
-- Each token is scoped to one tenant, one operator id and one role, and expires.
CREATE TABLE api_tokens (
    token_id    text PRIMARY KEY,
    token_hash  text NOT NULL UNIQUE,
    tenant_id   text NOT NULL,
    operator    text NOT NULL,
    role        text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    revoked_at  timestamptz
);
CREATE INDEX api_tokens_tenant ON api_tokens (tenant_id, created_at);

-- The operator queue without a status filter, in its keyset order: (updated_at, key) per tenant.
CREATE INDEX tool_executions_listing ON tool_executions (tenant_id, updated_at, key);
-- /metrics counts calls per status and the unsettled ones by age, across tenants.
CREATE INDEX tool_executions_status_age ON tool_executions (status, updated_at);
