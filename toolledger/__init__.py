"""toolledger: make an AI agent's tool calls take effect once, and say so when it cannot know."""
