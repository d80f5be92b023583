"""Training: target features (online or cached), objectives, the one trainer loop, checkpoints
and logging."""
