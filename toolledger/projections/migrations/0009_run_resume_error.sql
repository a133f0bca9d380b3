-- A paused run whose resume hook kept failing (toolledger.processors.resumer) carries the error
-- here, from an accepted `run_resume_failed`, until its next accepted run event clears it: the
-- API, the console and `/metrics` show it. Part of the fold, like every other runs column.
ALTER TABLE runs ADD COLUMN resume_error text;
-- `/metrics` counts the marked runs every few seconds: a partial index keeps that off the table.
CREATE INDEX runs_resume_failed ON runs (run_id) WHERE resume_error IS NOT NULL;
