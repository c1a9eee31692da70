"""Control of a running engine: the typed operations, sleep and wake, and the sleep state."""
