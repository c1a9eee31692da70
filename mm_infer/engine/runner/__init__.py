"""The model step on its device: runner, flat batch plan, paged attention, persistent rows, graphs, memory, threads."""
