"""An example cflpipe plugin: FedAvgM (`fedavgm`), a small CNN (`tiny_cnn`) and a Gaussian-blobs
dataset (`blobs`). Nothing is registered on import of this package: cflpipe imports each module
through its entry point when a spec names it."""

__version__ = "0.1.0"
