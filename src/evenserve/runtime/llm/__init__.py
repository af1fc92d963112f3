"""Real LLM runtimes: tokenizers (built-in byte-level, a local tokenizer.json, incremental
detokenizing for streaming) and a transformers causal LM run one engine step at a time.
torch, transformers and tokenizers are imported only inside functions."""
