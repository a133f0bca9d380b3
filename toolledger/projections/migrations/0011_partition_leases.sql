-- Each partition's owner and when it last renewed its lease (toolledger.projections.ownership):
-- the projector holding a partition's advisory lock writes a row here when it takes the
-- partition and on every renewal, from the session that holds the lock, so only a live owner can
-- write it. Operators read it (`/readyz`, the metrics, `toolledger status`) to see an owner that
-- stopped renewing and how long ago. A table of its own rather than columns on
-- projection_offsets: a renewal must never wait on the offset row a batch transaction holds
-- (a renewal stuck behind a frozen batch would keep the lock session busy, and so alive). Never
-- read by the fold.
CREATE TABLE projection_leases (
    partition integer PRIMARY KEY,
    -- "<host> pid <pid>" of the owner; null once it released the partition cleanly.
    owner text,
    -- The owner's TOOLLEDGER_OWNER_LEASE_S: PostgreSQL ends its lock session this long after
    -- its last renewal.
    lease_s double precision NOT NULL,
    renewed_at timestamptz NOT NULL
);
