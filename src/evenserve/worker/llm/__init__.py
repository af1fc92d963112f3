"""LLM models on the worker: their model.yaml (``kind: llm``), their step runners (emulated and
real), generation over the one device scheduler, and the OpenAI-compatible front."""
