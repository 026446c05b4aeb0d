"""Retrieval methods. Each maps a queries table to a ranked run table (RUN contract)."""
