"""Pure domain: request models, the lifecycle decider, the Avro codec and the EventLog port."""
