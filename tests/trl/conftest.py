"""TRL tests use the shared ``tiny_tokenizer`` fixture from ``tests/conftest.py``."""
