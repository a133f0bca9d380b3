-- The public keys projectors verify operator signatures with, as they registered them at start
-- (toolledger.projections.keyring). Never read by the fold: verdicts depend on the log and each
-- projector's configured keys alone. It lets a projector refuse to start with a key set that
-- lacks or contradicts one another projector used (old keys are kept forever), and lets the API
-- refuse to sign with a key no projector verifies (which would halt a partition).
CREATE TABLE verify_keys (
    key_id        text PRIMARY KEY,
    public_key    bytea NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now()
);
