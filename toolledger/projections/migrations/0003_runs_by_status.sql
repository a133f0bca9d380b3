-- Paused runs are looked up by status (`resumable_runs()`, the resumer): index them.
CREATE INDEX runs_by_status ON runs (status, updated_at);
