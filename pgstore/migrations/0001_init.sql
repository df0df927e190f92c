-- Records of idempotency keys. Keys and fingerprints are bytea because
-- they are arbitrary bytes (NUL, invalid UTF-8), which text cannot hold.
-- Times are Unix nanoseconds (bigint) so that the caller's clock
-- round-trips exactly; timestamptz would keep only microseconds.
CREATE SEQUENCE {{seq}} AS bigint;

CREATE TABLE {{table}} (
    key         bytea   PRIMARY KEY,
    fingerprint bytea   NOT NULL,
    state       text    NOT NULL CHECK (state IN ('PROCESSING', 'DONE')),
    token       bigint  NOT NULL,
    lease_until bigint,
    expires_at  bigint  NOT NULL,
    status      bigint,
    headers     bytea,   -- internal/wire header encoding
    body        bytea
);

-- Sweep finds expired rows through this index.
CREATE INDEX {{expires_index}} ON {{table}} (expires_at);
