"""GGUF files as llama.cpp writes them: headers and tensor byte ranges, split sets read as one,
embedding rows read without loading the matrix."""
