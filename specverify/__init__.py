"""specverify: prove speculative decoding lossless, or catch it when it is not."""

__version__ = "0.1.0"
