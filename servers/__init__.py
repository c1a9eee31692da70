"""HTTP front ends for mm-infer."""
