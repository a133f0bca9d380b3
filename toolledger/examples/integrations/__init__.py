"""Penny's refund with an agent framework: one example per framework, offline.

python -m toolledger.examples.integrations.langgraph_refund
python -m toolledger.examples.integrations.pydantic_ai_refund
python -m toolledger.examples.integrations.openai_agents_refund
"""
