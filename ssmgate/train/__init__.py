"""Training: steps, loops and sweeps (the step is a pure function; the loop owns side effects)."""
