"""RL control over HTTP: the pause gate, sleep and wake, refits from disk, weight-transfer rounds."""
