"""Pretrained models written with atensor ops (see bert.py)."""
