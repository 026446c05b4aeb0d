"""Measures, significance tests and reports."""
