"""What a model is given: its tokenizer (from the GGUF) and chat templates."""
