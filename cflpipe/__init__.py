"""cflpipe: reproducible benchmarks of clustered federated learning."""

__version__ = "0.3.1"
