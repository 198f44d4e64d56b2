"""Task generators and metrics. Synthetic generators are jittable `sample(key, ...)` functions."""
