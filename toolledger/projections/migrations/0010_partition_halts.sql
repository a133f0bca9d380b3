-- Why a partition's owner stopped folding it (an unknown schema or key id: what to deploy),
-- recorded by the owner's health loop while it is halted and cleared once it folds again, so
-- `toolledger status` shows a halt from any process. Never read by the fold.
ALTER TABLE projection_offsets ADD COLUMN halted text;
