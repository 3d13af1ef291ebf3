"""The reference speculative decoder (see reference/decoder.py)."""
