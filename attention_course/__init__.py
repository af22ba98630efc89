"""Student helpers for Attention, step by step."""
