"""gdnbench: correctness-gated benchmarks of GDN / KDA linear-attention backends."""

__version__ = "0.1.0"
