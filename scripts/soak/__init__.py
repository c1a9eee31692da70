"""Bounded loopback soak (run.py) with its traffic, client, server child and report; stress_tests.sh for races."""
