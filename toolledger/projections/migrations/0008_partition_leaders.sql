-- Where each partition's leader answers runtimes (toolledger.leader): the projector process that
-- holds the partition's advisory lock registers its host:port here when it takes the partition,
-- only while the row's next offset is the one it read (so a superseded owner cannot overwrite
-- its successor). Runtimes read it to find their run's leader; null means "no leader, append
-- directly". Never read by the fold.
ALTER TABLE projection_offsets ADD COLUMN leader_address text;
