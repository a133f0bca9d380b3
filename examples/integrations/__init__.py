"""Penny's refund with an agent framework: one example per framework, offline.

python -m examples.integrations.langgraph_refund
python -m examples.integrations.pydantic_ai_refund
python -m examples.integrations.openai_agents_refund
"""
