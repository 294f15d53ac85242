"""Placeholder: contract module under construction."""
